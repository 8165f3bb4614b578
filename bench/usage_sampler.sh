#!/usr/bin/env bash
# The usage sampler's cost: N idle busybox sandboxes on one `dsec up`, the
# dsec process's own CPU over a quiet window, with the per-second sampler
# on (--metrics-window-s 300, the default) and off (0), alternated ROUNDS
# times. Reports CPU cores used by dsec while idle, per mode (median).
# Usage: bench/usage_sampler.sh [N] [WINDOW_S] [ROUNDS]   (default 1000 20 2)
source "$(dirname "$0")/lib.sh"
N=${1:-1000}
WINDOW=${2:-20}
ROUNDS=${3:-2}
bench_init usage_sampler
bench_build
bench_raise_pid_max 131072
OUT=$RESULTS/usage_sampler.txt
: >"$OUT"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
for round in $(seq 1 "$ROUNDS"); do
    for window in 300 0; do
        bench_start_dsec --memory-overcommit 16 --cpu-overcommit 256 --max-sandboxes $((N + 100)) --metrics-window-s "$window"
        "$BENCH" density --dsec-pid "$DSEC_PID" --node "$NODE" --count "$N" --concurrency 8 \
            --memory-mb 16 --cpu 0.05 --disk-mb 16 --pids 32 --out "$WORK/density-$round-$window.json" >/dev/null
        sleep 3 # let creation's tail settle
        t0=$(ticks "$DSEC_PID")
        sleep "$WINDOW"
        t1=$(ticks "$DSEC_PID")
        cores=$(awk -v a="$t0" -v b="$t1" -v hz="$HZ" -v w="$WINDOW" 'BEGIN { printf "%.4f", (b - a) / hz / w }')
        echo "window=$window round=$round cores=$cores" | tee -a "$OUT" >&2
        bench_stop_dsec >/dev/null
        bench_reap_node
    done
done
"$PY" - "$OUT" "$N" <<'PYEOF'
import statistics, sys
rows = [dict(kv.split("=") for kv in l.split()) for l in open(sys.argv[1]) if l.strip()]
med = {w: statistics.median(float(r["cores"]) for r in rows if r["window"] == w) for w in ("300", "0")}
n = int(sys.argv[2])
extra = med["300"] - med["0"]
print(f"{n} idle sandboxes: dsec uses {med['300']:.4f} cores sampling, {med['0']:.4f} without; "
      f"the sampler {extra:.4f} cores, {extra / n * 1e6:.1f} us of CPU per sandbox-second")
PYEOF
