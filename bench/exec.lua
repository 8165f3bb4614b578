-- wrk script: POST /v1/sandboxes/{id}/exec {"argv": ["true"]}, round-robin
-- over the sandbox ids in $DSEC_BENCH_IDS (space-separated), with the token
-- in $DSEC_TOKEN (wrk counts answers >= 400 as errors).
local ids = {}
for id in string.gmatch(os.getenv("DSEC_BENCH_IDS") or "", "%S+") do
  ids[#ids + 1] = id
end
local token = os.getenv("DSEC_TOKEN")
local path_kind = os.getenv("DSEC_BENCH_PATH") or "exec"
local n = 0

wrk.method = path_kind == "exec" and "POST" or "GET"
wrk.headers["Authorization"] = "Bearer " .. token
if path_kind == "exec" then
  wrk.headers["Content-Type"] = "application/json"
  wrk.body = '{"argv":["true"]}'
end

request = function()
  n = n + 1
  local id = ids[(n % #ids) + 1]
  if path_kind == "exec" then
    return wrk.format(nil, "/v1/sandboxes/" .. id .. "/exec")
  end
  return wrk.format(nil, "/v1/sandboxes/" .. id)
end

dofile((os.getenv("DSEC_BENCH_LUA_DIR") or "bench") .. "/wrkjson.lua")
