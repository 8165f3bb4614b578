#!/usr/bin/env bash
# Issue 3, benchmark 3: upgrading a toolkit shared by N images. dsec keeps
# the toolkit a layer of its own that sandboxes name at creation
# (`toolkits=["tk:v2"]`), so the upgrade is one layer built and pushed to
# the shared store, whatever N is. The alternative is images that bake the
# toolkit in: every one is rebuilt (its workspace + the new toolkit as one
# layer) and pushed again. That side is measured on a sample of S images
# and scaled to N (each rebuild is the same work), and says so.
# Measured: wall time and bytes the shared store grew by.
# Usage: bench/toolkit_upgrade.sh [N] [S]   (defaults 1000 8; ~2 min)
source "$(dirname "$0")/lib.sh"
N=${1:-1000}
S=${2:-8}
bench_init tkupgrade
bench_build
SRC=$WORK/src
SHARED=$WORK/shared

# The toolkit: C headers (a real toolchain part, ~130 MB); v2 changes one file.
mkdir -p "$WORK/tk1/opt/toolkit"
cp -a /usr/include/. "$WORK/tk1/opt/toolkit/"
cp -a "$WORK/tk1" "$WORK/tk2"
echo "/* toolkit v2 */" >>"$WORK/tk2/opt/toolkit/stdio.h"
# Workspaces: a small repository each (here: a copy of a Python package).
ws_tree() { mkdir -p "$1/workspace"; cp -a /usr/lib/python3.11/json "$1/workspace/"; echo "$2" >"$1/workspace/id"; }

"$DSEC" image build tk:v1 --from-dir "$WORK/tk1" --kind toolkit --images-dir "$SRC" >/dev/null 2>&1
"$DSEC" image push tk:v1 --to "$SHARED" --images-dir "$SRC" >/dev/null 2>&1

stored() { du -sB1 "$SHARED" | cut -f1; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", b-a}'; }

# dsec: build the new toolkit layer once, push it.
sync
before=$(stored); t0=$(date +%s.%N)
"$DSEC" image build tk:v2 --from-dir "$WORK/tk2" --kind toolkit --images-dir "$SRC" >/dev/null 2>&1
"$DSEC" image push tk:v2 --to "$SHARED" --images-dir "$SRC" >/dev/null 2>&1
sync
t1=$(date +%s.%N); after=$(stored)
layer_s=$(secs "$t0" "$t1"); layer_b=$((after - before))

# Baked-in toolkits: rebuild and push S images (workspace + toolkit v2).
# Their trees are prepared first, untimed, as the toolkit's tree was.
for i in $(seq 1 "$S"); do
    ws_tree "$WORK/baked$i" "$i"
    cp -a "$WORK/tk2/opt" "$WORK/baked$i/"
done
sync
before=$(stored); t0=$(date +%s.%N)
for i in $(seq 1 "$S"); do
    "$DSEC" image build "baked$i:v2" --from-dir "$WORK/baked$i" --kind base --images-dir "$SRC" >/dev/null 2>&1
    "$DSEC" image push "baked$i:v2" --to "$SHARED" --images-dir "$SRC" >/dev/null 2>&1
done
sync
t1=$(date +%s.%N); after=$(stored)
rebuild_s=$(secs "$t0" "$t1"); rebuild_b=$((after - before))

awk -v n="$N" -v s="$S" -v ls="$layer_s" -v lb="$layer_b" -v rs="$rebuild_s" -v rb="$rebuild_b" 'BEGIN {
    ns = rs / s * n; nb = rb / s * n
    printf "toolkit upgrade for %d images (rebuild measured on %d, scaled to %d)\n", n, s, n
    printf "%-28s %12s %14s\n", "", "time s", "bytes moved MB"
    printf "%-28s %12.1f %14.0f\n", "dsec: one toolkit layer", ls, lb / 1e6
    printf "%-28s %12.1f %14.0f\n", "rebuild every image", ns, nb / 1e6
    printf "ratio: %.0fx less time, %.0fx fewer bytes\n", ns / ls, nb / lb
}'
