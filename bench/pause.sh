#!/usr/bin/env bash
# Benchmarks of issue 6 (pause/resume and creation backpressure), dsec with a
# node swap file side by side with dsec pausing by freezing only (no swap:
# what `crun pause`, which only freezes, gives), and the creation queue on
# vs off, each pair in one run:
#   1. a sandbox holding 256 MiB: RAM freed while paused, pause and resume
#      latency, and the cost of touching the 256 MiB again after resume
#   3. pause and resume of a job of N sandboxes (default 1000)
#   4. a burst of M creations from one client (default 2000), with the
#      queue (--max-creating 64) vs without it (--max-creating 0)
# Usage: bench/pause.sh [REPS] [JOB_N] [BURST]   (~5 min)
source "$(dirname "$0")/lib.sh"
REPS=${1:-5}
JOB_N=${2:-1000}
BURST=${3:-2000}
bench_init pause
bench_build
export PYTHONPATH=$REPO/sdk/python${PYTHONPATH:+:$PYTHONPATH}
GEN="$PY $BENCH_DIR/pause_bench.py"

bench_log "1. 256 MiB sandbox, swap file on"
bench_start_dsec --swap-file-mb 2048 --cpu-overcommit 64 --max-sandboxes 4096
$GEN memory --reps "$REPS" --label swap --out "$RESULTS/pause_memory_swap.json"
bench_log "3. job of $JOB_N sandboxes"
$GEN job --n "$JOB_N" --reps 3 --out "$RESULTS/pause_job.json"
bench_stop_dsec >/dev/null

bench_log "1'. 256 MiB sandbox, freeze only (no swap file)"
bench_start_dsec --cpu-overcommit 64
$GEN memory --reps "$REPS" --label freeze-only --out "$RESULTS/pause_memory_freeze_only.json"
bench_stop_dsec >/dev/null

bench_log "4. burst of $BURST creations with the queue"
bench_start_dsec --cpu-overcommit 64 --max-sandboxes 4096
$GEN burst --n "$BURST" --label queue --out "$RESULTS/burst_queue.json"
bench_stop_dsec >/dev/null
bench_log "4'. the same burst without the queue"
bench_start_dsec --cpu-overcommit 64 --max-sandboxes 4096 --max-creating 0
$GEN burst --n "$BURST" --label no-queue --out "$RESULTS/burst_no_queue.json"
bench_stop_dsec >/dev/null

$GEN report "$RESULTS"/pause_memory_swap.json "$RESULTS"/pause_memory_freeze_only.json \
    "$RESULTS"/pause_job.json "$RESULTS"/burst_queue.json "$RESULTS"/burst_no_queue.json
