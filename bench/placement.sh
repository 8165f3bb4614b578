#!/usr/bin/env bash
# Placement decisions per second and their latency over 40, 160 and 640
# simulated nodes, for k = 1, 2, 4, 8: `Placement::choose` alone, the
# apiserver's path (`Nodes::decide`: the shared view snapshot with this
# replica's in-flight placements overlaid), and as the peer that path with
# the view rebuilt per creation (as before the snapshot). The node's own
# answer is not included.
# Usage: bench/placement.sh [DECISIONS] [NODES] [K]
#        (default 100000 per row, 40,160,640 nodes, k 1,2,4,8)
source "$(dirname "$0")/lib.sh"
DECISIONS=${1:-100000}
NODES=${2:-40,160,640}
K=${3:-1,2,4,8}
bench_init placement
bench_build
"$BENCH" placement --decisions "$DECISIONS" --nodes "$NODES" --k "$K" --out "$RESULTS/placement.json"
