#!/usr/bin/env bash
# Failure detection: from a simulated edge's death (a crash: connections
# refused; a partition: nothing answered) to its sandboxes showing
# `unknown` in a list and to placement avoiding it, one apiserver replica
# probing 160 simulated edges itself.
# Usage: bench/cluster_failure.sh [ROUNDS]   (default 5 of each)
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-5}
bench_init cluster_failure
bench_build
"$BENCH" cluster-failure --rounds "$ROUNDS" --out "$RESULTS/cluster_failure.json"
