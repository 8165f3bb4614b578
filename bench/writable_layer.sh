#!/usr/bin/env bash
# Issue 27: a container's writable layer on the node's disk (a btrfs
# subvolume bounded by its quota group, `--writable-layer disk`, the
# default) side by side with the tmpfs layer (`--writable-layer tmpfs`), in
# one run, alternating the two platforms:
#   1. creation: sequential create -> first exec -> delete, p50/p90 (two
#      rounds of each mode, interleaved tmpfs, disk, tmpfs, disk)
#   2. file-heavy work in one sandbox: unpacking a source tree (the
#      image's Python standard library as a tar, ~5k files) and `pip
#      install` of a local wheel of 2,000 modules, medians of REPS
#   3. density: N idle busybox sandboxes, host memory per sandbox and the
#      server-side creation time (dsec-bench density)
# Usage: bench/writable_layer.sh [CREATIONS] [REPS] [DENSITY_N]   (default 200 5 500, ~6 min)
source "$(dirname "$0")/lib.sh"
N=${1:-200}
REPS=${2:-5}
DN=${3:-500}
bench_init writable_layer
bench_build
bench_raise_pid_max 131072
GEN="$PY $BENCH_DIR/writable_layer_bench.py"
for round in 1 2; do
    for mode in tmpfs disk; do
        bench_wait_kernel_settled
        bench_log "round $round, --writable-layer $mode"
        bench_start_dsec --writable-layer "$mode" --memory-overcommit 16 --cpu-overcommit 256 \
            --max-sandboxes $((DN + 100))
        $GEN create --n $((N / 2)) --label "$mode" --out "$WORK/create-$mode-$round.json"
        if [ "$round" = 1 ]; then
            $GEN files --reps "$REPS" --label "$mode" --out "$WORK/files-$mode.json"
            "$BENCH" density --dsec-pid "$DSEC_PID" --node "$NODE" --count "$DN" --concurrency 8 \
                --memory-mb 16 --cpu 0.05 --disk-mb 16 --pids 32 --out "$WORK/density-$mode.json" >/dev/null
        fi
        bench_stop_dsec >/dev/null
    done
done
$GEN report --work "$WORK" --out "$RESULTS/writable_layer.json"
