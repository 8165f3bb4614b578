#!/usr/bin/env bash
# Benchmark 2: sustained creation rate at 8, 16 and 32 concurrent creators:
# a burst of N creations (create-only), their deletion, and M create+delete
# cycles; dsec and crun run -d/delete -f side by side.
# Usage: bench/throughput.sh [BURST] [CYCLES]   (default 1000 1000, ~3 min)
source "$(dirname "$0")/lib.sh"
BURST=${1:-1000}
CYCLES=${2:-1000}
bench_init throughput
bench_build
bench_wait_kernel_settled
bench_need_hugetlb
# A burst of 1000 sandboxes at 64 MiB / 0.5 CPU each is more than the
# default admission (2x RAM, 16x cores) allows: overcommit for the test.
bench_start_dsec --memory-overcommit 8 --cpu-overcommit 512
"$BENCH" throughput --dsec-pid "$DSEC_PID" --concurrency 8,16,32 --burst "$BURST" --cycles "$CYCLES" \
    --crun-work "$WORK/crun" --images-dir "$IMAGES_DIR" \
    --out "$RESULTS/throughput.json"
