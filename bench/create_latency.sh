#!/usr/bin/env bash
# Benchmark 1: create -> first exec answered, dsec (HTTP API, compiled
# client) vs crun run -d + crun exec on the same EROFS layer, interleaved.
# Usage: bench/create_latency.sh [ITERATIONS]   (default 300, ~1 min)
source "$(dirname "$0")/lib.sh"
ITER=${1:-300}
bench_init create_latency
bench_build
bench_need_hugetlb
bench_start_dsec
"$BENCH" latency --dsec-pid "$DSEC_PID" --iterations "$ITER" --warmup 20 \
    --crun-work "$WORK/crun" --images-dir "$IMAGES_DIR" \
    --out "$RESULTS/create_latency.json"
