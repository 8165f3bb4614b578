-- wrk script: POST /v1/fncall with the JSON body in $DSEC_BENCH_BODY (a
-- file). With $DSEC_BENCH_NONCE set, every "@NONCE@" in the body becomes a
-- number unique to the request (defeats the compile cache). The token in
-- $DSEC_TOKEN, if any, is sent (the baseline ignores it). Prints one
-- WRKJSON line of results; a body without "status":"ok" is not checked
-- here (the script checks a sample call first).
local f = assert(io.open(os.getenv("DSEC_BENCH_BODY"), "r"))
local body = f:read("*a")
f:close()
local nonce = os.getenv("DSEC_BENCH_NONCE")
local token = os.getenv("DSEC_TOKEN")
local n = 0
local thread_id = 0
local counter = 0

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
if token and token ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. token
end
wrk.body = body

setup = function(thread)
  counter = counter + 1
  thread:set("thread_id", counter)
end

request = function()
  if nonce then
    n = n + 1
    local b = string.gsub(body, "@NONCE@", tostring(thread_id) .. "_" .. tostring(n))
    return wrk.format(nil, "/v1/fncall", nil, b)
  end
  return wrk.format(nil, "/v1/fncall")
end

dofile((os.getenv("DSEC_BENCH_LUA_DIR") or "bench") .. "/wrkjson.lua")
