#!/usr/bin/env bash
# Placement decisions per second and their latency (`Placement::choose` plus
# the per-creation copy of the node view) over 40, 160 and 640 simulated
# nodes, for k = 1, 2, 4, 8. The node's own answer is not included.
# Usage: bench/placement.sh [DECISIONS]   (default 100000 per pair, ~1 min)
source "$(dirname "$0")/lib.sh"
DECISIONS=${1:-100000}
bench_init placement
bench_build
"$BENCH" placement --decisions "$DECISIONS" --out "$RESULTS/placement.json"
