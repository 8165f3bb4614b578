# What the FnCall benchmarks (fncall.sh, fncall_langs.sh) share, sourced
# after lib.sh and bench_start_dsec:
#   fncall_start_baseline [ARGS]  starts `dsec-bench fncall-baseline ARGS`
#                                 on a free loopback port: sets BASELINE (its
#                                 URL) and BASELINE_PID (the caller's trap
#                                 stops it)
#   fncall_check URL BODY         one call; exits unless its status is ok
#   wrk_run NAME TARGET URL BODY CONNS [nonce [SECONDS]]
#                                 one wrk run of fncall.lua; prints a JSON
#                                 object. Calls `fncall_before_run TARGET`
#                                 first if the script defines it.

fncall_start_baseline() {
    "$BENCH" fncall-baseline --listen 127.0.0.1:0 "$@" >"$WORK/baseline.log" 2>&1 &
    BASELINE_PID=$!
    BASELINE=""
    for _ in $(seq 1 100); do
        BASELINE=$(sed -n 's/^baseline is up at \(http:[^ ]*\).*/\1/p' "$WORK/baseline.log" | head -1)
        [ -n "$BASELINE" ] && break
        sleep 0.1
    done
    [ -n "$BASELINE" ] || { cat "$WORK/baseline.log" >&2; exit 1; }
}

fncall_check() { # URL BODY
    local out
    out=$(curl -sS -H "Authorization: Bearer $DSEC_TOKEN" -H 'Content-Type: application/json' \
        --data-binary @"$2" "$1/v1/fncall")
    printf '%s' "$out" | "$PY" -c 'import json,sys; d=json.load(sys.stdin); assert d["status"] == "ok", d' \
        || { echo "bad answer from $1: $out" >&2; exit 1; }
}

wrk_run() { # NAME TARGET URL BODY CONNS [nonce [SECONDS]]
    local name=$1 target=$2 url=$3 body=$4 conns=$5 nonce=${6:-} secs=${7:-$SECS}
    local threads=2 out j
    if declare -F fncall_before_run >/dev/null; then fncall_before_run "$target"; fi
    [ "$conns" -lt 2 ] && threads=1
    out=$(DSEC_BENCH_BODY=$body DSEC_BENCH_NONCE=$nonce wrk -t"$threads" -c"$conns" -d"${secs}s" --timeout 60s \
        -s "$BENCH_DIR/fncall.lua" "$url" 2>&1)
    j=$(printf '%s\n' "$out" | sed -n 's/^WRKJSON //p')
    [ -n "$j" ] || { printf '%s\n' "$out" >&2; return 1; }
    printf '{"name": "%s", "target": "%s", "connections": %s, "wrk": %s}' "$name" "$target" "$conns" "$j"
}
