#!/usr/bin/env bash
# Issue 3, benchmark 2: the same workspace (a Python library tree, 54 MB)
# and toolkit (C headers, 129 MB) given to N sandboxes as EROFS layers
# (mounted once per node, shared) vs as one tar.gz uploaded into each
# sandbox and extracted there, then the same recorded command sequence;
# burst completion time and bytes written to the sandboxes' writable
# layers, alternating modes REPS times, in one run.
# Usage: bench/layers.sh [N] [REPS]   (defaults 16 3; ~3 min)
source "$(dirname "$0")/lib.sh"
N=${1:-16}
REPS=${2:-3}
bench_init layers
bench_build
GEN="$PY $BENCH_DIR/layers_bench.py"

# The content: the same trees for both modes.
mkdir -p "$WORK/ws/workspace" "$WORK/tk/opt/toolkit"
cp -a /usr/lib/python3.11/. "$WORK/ws/workspace/"
cp -a /usr/include/. "$WORK/tk/opt/toolkit/"
tar czf "$WORK/bundle.tar.gz" -C "$WORK/ws" workspace -C "$WORK/tk" opt
bench_log "bundle $(du -h "$WORK/bundle.tar.gz" | cut -f1) compressed, $(du -sh "$WORK/ws" "$WORK/tk" | cut -f1 | paste -sd+) unpacked"

# The layers (timed: the one-off cost the layer mode pays per node).
t0=$(date +%s.%N)
"$DSEC" image build bench-ws --from-dir "$WORK/ws" --kind workspace --images-dir "$IMAGES_DIR" 2>/dev/null
"$DSEC" image build bench-tk --from-dir "$WORK/tk" --kind toolkit --images-dir "$IMAGES_DIR" 2>/dev/null
t1=$(date +%s.%N)
bench_log "layers built in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s"
cleanup_layers() {
    "$DSEC" image rm bench-ws bench-tk --images-dir "$IMAGES_DIR" >/dev/null 2>&1
    "$DSEC" image gc --images-dir "$IMAGES_DIR" >/dev/null 2>&1 || true
}
trap 'rc=$?; cleanup_layers; bench_cleanup $rc' EXIT

bench_start_dsec --cpu-overcommit 64
files=()
for r in $(seq 1 "$REPS"); do
    for mode in layers tar; do
        out=$RESULTS/layers_${mode}_$r.json
        bench_log "rep $r: $mode"
        $GEN run --mode "$mode" --n "$N" --bundle "$WORK/bundle.tar.gz" --out "$out"
        files+=("$out")
    done
done
bench_stop_dsec >/dev/null
$GEN report "${files[@]}"
