#!/usr/bin/env bash
# CPU QoS classes (issue 30): a latency-sensitive agent-like loop (short
# commands through the SDK, each step timed) beside best-effort CPU
# burners in other sandboxes filling 10% to 50% of the node; step latency
# inflation against a baseline without burners, with QoS (burners
# best_effort) and without (every sandbox latency_sensitive), in the same
# run (bench/qos_bench.py alternates the phases). Target at 50% load: at
# most +15% with QoS.
# Usage: bench/qos.sh [STEPS_PER_PHASE] [ROUNDS] [LOADS]   (default 30 2 0.1,0.2,0.3,0.4,0.5; ~5 min)
source "$(dirname "$0")/lib.sh"
STEPS=${1:-30}
ROUNDS=${2:-2}
LOADS=${3:-0.1,0.2,0.3,0.4,0.5}
bench_init qos
bench_build
bench_start_dsec --cpu-overcommit 16
bench_log "cgroup filesystem: $(stat -fc %T /sys/fs/cgroup) (tmpfs: v1), load before: $(cut -d" " -f1-3 /proc/loadavg)"
"$PY" "$BENCH_DIR/qos_bench.py" --steps "$STEPS" --rounds "$ROUNDS" --loads "$LOADS" --out "$RESULTS/qos.json"
bench_log "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
bench_stop_dsec >/dev/null
