#!/usr/bin/env bash
# Benchmark 4: density. N idle busybox sandboxes (each with its guest agent)
# at once; memory per sandbox and creation time of the last 100 vs the
# first 100; then the platform is stopped with --stop-sandboxes-on-exit and
# the node is checked to be empty again.
# Usage: bench/density.sh [N] [CONCURRENCY]   (default 5000 8, ~2 min)
source "$(dirname "$0")/lib.sh"
N=${1:-5000}
CONC=${2:-8}
bench_init density
bench_build
# One agent process per sandbox (+ short-lived ones): keep pid headroom.
bench_raise_pid_max 131072
bench_wait_kernel_settled
# Small sandboxes: 16 MiB, 0.05 CPU, 16 MiB disk, 32 pids. Admission is
# sized for big ones by default; overcommit and raise the count limit.
"$BENCH" counts --data-dir "$WORK/data" --node "$NODE" >"$WORK/counts-before.json"
bench_start_dsec --memory-overcommit 16 --cpu-overcommit 256 --max-sandboxes $((N + 100))
"$BENCH" density --dsec-pid "$DSEC_PID" --node "$NODE" --count "$N" --concurrency "$CONC" \
    --memory-mb 16 --cpu 0.05 --disk-mb 16 --pids 32 --out "$RESULTS/density.json"
bench_log "stopping the platform with $N sandboxes running (--stop-sandboxes-on-exit)"
STOP_S=$(bench_stop_dsec)
"$BENCH" counts --data-dir "$DATA_DIR" --node "$NODE" >"$WORK/counts-after.json"
"$PY" - "$RESULTS/density.json" "$WORK/counts-before.json" "$WORK/counts-after.json" "$STOP_S" <<'PYEOF'
import json, sys
path, before, after, stop_s = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), float(sys.argv[4])
d = json.load(open(path))
keys = ["agent_processes", "cgroups_node", "net_namespaces", "mnt_namespaces", "mounts_host"]
d["shutdown"] = {"seconds": stop_s, "before_dsec_up": {k: before[k] for k in keys}, "after_shutdown": {k: after[k] for k in keys}}
json.dump(d, open(path, "w"), indent=1)
print(f"\nplatform stopped with {d['created']} sandboxes in {stop_s:.1f} s; before `dsec up` -> after it exited:")
for k in keys:
    print(f"  {k:<16} before {before[k]:>6}  after {after[k]:>6}")
PYEOF
