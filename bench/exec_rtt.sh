#!/usr/bin/env bash
# Benchmark 3: exec round trip of `true`.
#   - compiled Rust client (dsec-client), sequential, vs `crun exec` (same run)
#   - compiled client, closed loop at 1/8/32 workers (one sandbox each)
#   - Python SDK (asyncio DSecClient), sequential and closed loop
#   - server capacity with wrk: POST /v1/sandboxes/{id}/exec {"argv":["true"]}
#     on 1 sandbox and round-robin over 32, plus GET /v1/sandboxes/{id} (the
#     API alone, no agent) as a reference
# Usage: bench/exec_rtt.sh [N]   (default 2000 sequential execs, ~2 min)
source "$(dirname "$0")/lib.sh"
N=${1:-2000}
WRK_SECONDS=${WRK_SECONDS:-10}
bench_init exec_rtt
bench_build
bench_need_hugetlb
# Exec sandboxes get 2 cores (the whole node): a 0.5-core quota is used up
# by ~700 execs/s of `true` and the round trip then measures CFS
# throttling, not the platform. 32 of them need cpu overcommit 32+.
CPU=${DSEC_BENCH_CPU:-2}
bench_start_dsec --cpu-overcommit 64

bench_log "compiled client + crun exec"
"$BENCH" exec --dsec-pid "$DSEC_PID" --cpu "$CPU" --iterations "$N" --crun-iterations 500 --concurrency 1,8,32 \
    --crun-work "$WORK/crun" --images-dir "$IMAGES_DIR" --out "$RESULTS/exec_rtt.json"

bench_log "Python SDK"
DSEC_BENCH_CPU=$CPU "$PY" "$BENCH_DIR/sdk_exec.py" "$RESULTS/exec_rtt_sdk.json" "$N"

bench_log "wrk (server capacity)"
IDS=()
for _ in $(seq 1 32); do
    IDS+=("$("$DSEC" run busybox --memory-mb 64 --cpus "$CPU" --disk-mb 64 --ttl 900)")
done
wrk_run() { # NAME PATHKIND CONNS IDS...
    local name=$1 kind=$2 conns=$3; shift 3
    local out
    out=$(DSEC_BENCH_IDS="$*" DSEC_BENCH_PATH=$kind wrk -t1 -c"$conns" -d"${WRK_SECONDS}s" \
        -s "$BENCH_DIR/exec.lua" "$DSEC_ENDPOINT" 2>&1)
    local j
    j=$(printf '%s\n' "$out" | sed -n 's/^WRKJSON //p')
    [ -n "$j" ] || { printf '%s\n' "$out" >&2; return 1; }
    printf '{"name": "%s", "path": "%s", "connections": %s, "sandboxes": %s, "wrk": %s}' \
        "$name" "$kind" "$conns" "$#" "$j"
}
{
    echo '{"benchmark": "exec_capacity_wrk", "wrk_threads": 1, "seconds": '"$WRK_SECONDS"', "runs": ['
    wrk_run "exec, 1 sandbox" exec 1 "${IDS[0]}"; echo ","
    wrk_run "exec, 1 sandbox" exec 8 "${IDS[0]}"; echo ","
    wrk_run "exec, 1 sandbox" exec 32 "${IDS[0]}"; echo ","
    wrk_run "exec, 32 sandboxes" exec 32 "${IDS[@]}"; echo ","
    wrk_run "GET sandbox (API only)" get 32 "${IDS[@]}"
    echo ']}'
} >"$RESULTS/exec_wrk.json"
for id in "${IDS[@]}"; do "$DSEC" rm "$id" >/dev/null; done

"$PY" - "$RESULTS" <<'PYEOF'
import json, sys
r = sys.argv[1]
c = json.load(open(f"{r}/exec_rtt.json"))
p = json.load(open(f"{r}/exec_rtt_sdk.json"))
w = json.load(open(f"{r}/exec_wrk.json"))
print("\nexec round trip of `true` (ms)        p50      p99")
print(f"  Python SDK exec(['true'])       {p['sequential_exec_ms']['p50_ms']:7.3f}  {p['sequential_exec_ms']['p99_ms']:7.3f}")
print(f"  compiled client                 {c['compiled_client']['sequential_ms']['p50_ms']:7.3f}  {c['compiled_client']['sequential_ms']['p99_ms']:7.3f}")
if "crun_exec" in c:
    print(f"  crun exec                       {c['crun_exec']['sequential_ms']['p50_ms']:7.3f}  {c['crun_exec']['sequential_ms']['p99_ms']:7.3f}")
    print(f"  ratio crun / Python SDK (p50)   {c['crun_exec']['sequential_ms']['p50_ms'] / p['sequential_exec_ms']['p50_ms']:.2f}x")
print("\nserver capacity with wrk (1 thread)")
for run in w["runs"]:
    x = run["wrk"]
    rps = x["requests"] / (x["duration_us"] / 1e6)
    print(f"  {run['name']:<24} c={run['connections']:<3} {rps:8.0f} req/s  p50 {x['p50_ms']:6.2f} ms  p99 {x['p99_ms']:6.2f} ms  errors {x['errors_status'] + x['errors_socket']}")
PYEOF
