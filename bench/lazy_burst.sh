#!/usr/bin/env bash
# Issue 3, benchmark 1: a burst over many distinct images from a shared
# store, on-demand vs eager vs fully local. K images share the `python`
# base (295 MB); each adds a workspace of SIZE_MB of data its tasks mostly
# never read (a real toolchain plus large unused data); PER sandboxes per
# image start at once on a node whose own store is empty (lazy, eager) or
# already holds every image (local), and each reads ~6% of its workspace
# and starts Python. Reported: time until all are running and done, bytes
# the edge wrote and bytes the node's store grew by.
# The shared store (POSIX flavour) sits behind a network link shaped to
# LINK_RATE (default 1gbit): a directory served from a network namespace
# of its own over a tc-shaped veth, mounted on the node (bench/store_link.sh).
# LINK_RATE=none reads it from a directory on the same disk instead.
# Usage: [LINK_RATE=1gbit|none] bench/lazy_burst.sh [K] [PER] [SIZE_MB] [REPS]
#        (defaults 16 4 224 1; ~8 min)
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/store_link.sh"
K=${1:-16}
PER=${2:-4}
SIZE_MB=${3:-224}
REPS=${4:-1}
LINK_RATE=${LINK_RATE:-1gbit}
bench_init lazyburst
bench_build
GEN="$PY $BENCH_DIR/lazy_burst_bench.py"
BASE_IMAGES=$IMAGES_DIR
SRC=$WORK/src
# SERVED is the store's own directory (on the server's side of the link);
# SHARED is where the node reaches it.
SERVED=$WORK/served/shared
SHARED=$SERVED
if [ "$LINK_RATE" != none ]; then
    BENCH_CLEANUP_HOOK=store_link_down
    mkdir -p "$SERVED"
    store_link_up "$WORK/served" "$WORK/link" "$LINK_RATE"
    SHARED=$WORK/link/shared
fi

# The images: one workspace layer each, pushed with the base to the shared store.
t0=$(date +%s.%N)
for i in $(seq 0 $((K - 1))); do
    tree=$WORK/tree
    mkdir -p "$tree/task"
    echo "task $i" >"$tree/task/hello.txt"
    head -c $((SIZE_MB << 20)) /dev/urandom >"$tree/task/data.bin"
    "$DSEC" image build "burst$i:v1" --from-dir "$tree" --kind workspace --images-dir "$SRC" >/dev/null 2>&1
    rm -rf "$tree"
done
# Pushed on the server's side: the push is not what is measured.
"$DSEC" image push python --to "$SERVED" --images-dir "$BASE_IMAGES" >/dev/null 2>&1
for i in $(seq 0 $((K - 1))); do
    "$DSEC" image push "burst$i:v1" --to "$SERVED" --images-dir "$SRC" >/dev/null 2>&1
done
rm -rf "$SRC"
t1=$(date +%s.%N)
bench_log "$K images of $((295 + SIZE_MB)) MB built and pushed in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.0f", b-a}') s"
if [ "$LINK_RATE" != none ]; then
    # What the link carries: one sequential read of a layer no run uses.
    head -c $((256 << 20)) /dev/urandom >"$WORK/served/probe.bin"
    bench_log "store link: a sequential read of 256 MiB ran at $(store_link_probe "$WORK/link/probe.bin") MB/s"
    rm -f "$WORK/served/probe.bin"
fi

files=()
for r in $(seq 1 "$REPS"); do
    for mode in lazy eager local; do
        node_store=$WORK/node-$mode
        rm -rf "$node_store"
        fetch=$mode
        if [ "$mode" = local ]; then
            fetch=eager
            # Filled from the server's side, outside the timed part.
            for img in python $(seq -f 'burst%g:v1' 0 $((K - 1))); do
                "$DSEC" image fetch "$img" --from "$SERVED" --images-dir "$node_store" >/dev/null 2>&1
            done
        fi
        mkdir -p "$node_store"
        sync
        IMAGES_DIR=$node_store
        bench_start_dsec --cpu-overcommit 64 --shared-store "$SHARED" --layer-fetch "$fetch"
        out=$RESULTS/lazy_burst_${mode}_$r.json
        bench_log "rep $r: $mode"
        $GEN run --mode "$mode" --images "$K" --per "$PER" --pid "$DSEC_PID" \
            --store "$node_store" --out "$out"
        files+=("$out")
        bench_stop_dsec >/dev/null
        rm -rf "$node_store"
    done
done
$GEN report --link "$LINK_RATE" "${files[@]}"
