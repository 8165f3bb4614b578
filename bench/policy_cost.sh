#!/usr/bin/env bash
# Issue 7: what the system-call filter (seccomp with audited refusals +
# no_new_privs) costs. Two `dsec up` at once on this machine, one started
# with --no-syscall-filter; the generator alternates between them: create,
# `true` x5, a 200,000-syscall `dd`, delete. Every other layer is on in both.
# Usage: bench/policy_cost.sh [ITERATIONS]   (default 200, ~1 min)
source "$(dirname "$0")/lib.sh"
ITER=${1:-200}
bench_init policy
bench_build
OFF_PID=""
OFF_DIR=""
stop_off() {
    if [ -n "$OFF_PID" ]; then
        kill -TERM "$OFF_PID" 2>/dev/null || true
        for _ in $(seq 1 600); do kill -0 "$OFF_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$OFF_PID" 2>/dev/null || true
        wait "$OFF_PID" 2>/dev/null || true
        OFF_PID=""
    fi
}
trap 'stop_off; bench_cleanup' EXIT

# The platform without the filter: a node and data dir of its own.
OFF_DIR=$WORK/data-off
mkdir -p "$OFF_DIR"
"$DSEC" up --data-dir "$OFF_DIR" --images-dir "$IMAGES_DIR" --listen 127.0.0.1:0 \
    --node "${NODE}off" --stop-sandboxes-on-exit --no-fncall --no-syscall-filter >"$WORK/dsec-off.log" 2>&1 &
OFF_PID=$!
OFF_ADDR=""
for _ in $(seq 1 300); do
    OFF_ADDR=$(sed -n 's/^dsec is up at \(http:[^ ]*\).*/\1/p' "$WORK/dsec-off.log" | head -1)
    [ -n "$OFF_ADDR" ] && break
    kill -0 "$OFF_PID" 2>/dev/null || { cat "$WORK/dsec-off.log" >&2; exit 1; }
    sleep 0.1
done
[ -n "$OFF_ADDR" ] || { cat "$WORK/dsec-off.log" >&2; echo "dsec up (no filter) did not come up" >&2; exit 1; }
bench_log "dsec up --no-syscall-filter: pid $OFF_PID at $OFF_ADDR"

bench_start_dsec
"$BENCH" policy --dsec-pid "$DSEC_PID" --iterations "$ITER" --warmup 20 \
    --off-endpoint "$OFF_ADDR" --off-token "$(cat "$OFF_DIR/admin-token")" \
    --out "$RESULTS/policy_cost.json"
