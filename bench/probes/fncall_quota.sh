#!/usr/bin/env bash
# FnCall (issue 5): what a runner's CPU quota does to calls. One `dsec up`
# with 4 Python runners; the runners' cgroups get a one-core quota, then
# one of every core of the node (what dsec sets: dsec-fncall config.rs
# runner_cpu_quota_cores), alternated, with wrk at 1, 8 and 64 clients for
# SECONDS each: calls/s, p50 and p99.
# Usage: bench/probes/fncall_quota.sh [SECONDS] [ROUNDS]   (defaults 6 s, 2)
source "$(dirname "$0")/../lib.sh"
SECS=${1:-6}
ROUNDS=${2:-2}
bench_init fncall_quota
bench_build
bench_start_python_pool 4

# Sets every runner's quota to $1 cores (cgroup v1 cpu.cfs_quota_us or v2
# cpu.max, period 100 ms).
set_quota() {
    local us d
    us=$(awk -v c="$1" 'BEGIN { printf "%d", c * 100000 }')
    for d in /sys/fs/cgroup/cpu/dsec/"$NODE"/*/ /sys/fs/cgroup/dsec/"$NODE"/*/ /sys/fs/cgroup/unified/dsec/"$NODE"/*/; do
        case "$d" in *"/pool-"*) continue ;; esac
        if [ -f "$d/cpu.cfs_quota_us" ]; then echo "$us" >"$d/cpu.cfs_quota_us"; fi
        if [ -f "$d/cpu.max" ]; then echo "$us 100000" >"$d/cpu.max"; fi
    done
}
run() {
    DSEC_BENCH_BODY=$WORK/py.json wrk -t1 -c"$1" -d"${SECS}s" -s "$BENCH_DIR/fncall.lua" "$DSEC_ENDPOINT" 2>&1 \
        | sed -n 's/^WRKJSON //p' | "$PY" -c 'import json, sys
j = json.load(sys.stdin)
print("%3d clients, quota %-9s %5.0f calls/s  p50 %5.1f ms  p99 %5.1f ms" % ('"$1"', "'"$2"'", j["requests"] / j["duration_us"] * 1e6, j["p50_ms"], j["p99_ms"]))'
}
CORES=$(nproc)
for _ in $(seq 1 "$ROUNDS"); do
    for clients in 1 8 64; do
        set_quota 1
        run "$clients" "1 core"
        set_quota "$CORES"
        run "$clients" "$CORES cores"
    done
done
