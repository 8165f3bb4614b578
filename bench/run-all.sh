#!/usr/bin/env bash
# Runs every benchmark of docs/benchmarks.md in turn (each starts and stops
# its own `dsec up`), then the plots and the summary table.
#   bench/run-all.sh                 all five, default sizes (~15 min)
#   DSEC_BENCH_QUIET=1 bench/run-all.sh   before each benchmark, wait (up to
#                                    10 min) for the 1-minute load average to
#                                    drop below 0.5 (or DSEC_BENCH_QUIET=X: below X)
# Results: bench/results/*.json (+ the dsec logs); plots: docs/img/*.png.
set -euo pipefail
cd "$(dirname "$0")"
wait_quiet() {
    [ -n "${DSEC_BENCH_QUIET:-}" ] || return 0
    local max=0.5
    [ "$DSEC_BENCH_QUIET" = 1 ] || max=$DSEC_BENCH_QUIET
    for _ in $(seq 1 120); do
        awk -v m="$max" '{exit !($1 < m)}' /proc/loadavg && return 0
        sleep 5
    done
    echo "warning: the machine is still busy ($(cat /proc/loadavg)); measuring anyway" >&2
}
(cd .. && scripts/build.sh >/dev/null && cargo build --release -p dsec-bench --quiet)
export DSEC_BENCH_NO_BUILD=1   # built once, above
wait_quiet; ./create_latency.sh
wait_quiet; ./throughput.sh
wait_quiet; ./exec_rtt.sh
wait_quiet; ./density.sh
wait_quiet; ./leaks.sh
python3 plot.py || echo "plots skipped (pip install matplotlib)" >&2
echo
python3 summary.py
