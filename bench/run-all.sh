#!/usr/bin/env bash
# Runs the benchmark suite, the benchmarks whose figures docs/benchmarks.md
# tables, in turn (each script starts and stops its own `dsec up`, at its
# default sizes), then the plots and the summary table.
#   bench/run-all.sh                 the whole suite
#   bench/run-all.sh containers      the five container benchmarks (~15 min)
#   bench/run-all.sh NAME...         only those, e.g. `fncall pause vm`
#   DSEC_BENCH_QUIET=1 bench/run-all.sh   before each benchmark, wait (up to
#                                    10 min) for the 1-minute load average to
#                                    drop below 0.5 (or DSEC_BENCH_QUIET=X: below X)
# Each script states what it needs beyond the default images (a network
# configuration, sshfs, the `debian-vm` image, ...). The one-off
# investigations in bench/probes/ are not part of the suite.
# Results: bench/results/*.json (+ the dsec logs); plots: docs/img/*.png.
set -euo pipefail
cd "$(dirname "$0")"
CONTAINERS="create_latency throughput exec_rtt density leaks"
SUITE="$CONTAINERS sdk_cost e2b build transfer pause trajectory fncall fncall_langs policy_cost egress_cost usage_sampler qos
       layers lazy_burst toolkit_upgrade microvm microvm_snap vm cluster_job cluster_failure cluster_real"
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
case "${1:-}" in
    "") selected=$SUITE ;;
    containers) selected=$CONTAINERS ;;
    *) selected="$*" ;;
esac
for name in $selected; do
    [ -x "./$name.sh" ] || { echo "no benchmark $name in the suite (bench/README.md lists it)" >&2; exit 2; }
done
(cd .. && scripts/build.sh >/dev/null && cargo build --release -p dsec-bench --quiet)
export DSEC_BENCH_NO_BUILD=1   # built once, above
for name in $selected; do
    wait_quiet; "./$name.sh"
done
python3 plot.py || echo "plots skipped (pip install matplotlib)" >&2
echo
python3 summary.py
