#!/usr/bin/env bash
# The 32,000-sandbox job through the apiserver's creation path against 160
# simulated edges (admission answered at once over loopback HTTP), with one
# replica and with two placing at once without coordination: time until
# every creation is acknowledged, creation p50/p99, spread (most loaded
# node over the mean).
# Usage: bench/cluster_job.sh [SANDBOXES] [NODES]   (default 32000 160)
source "$(dirname "$0")/lib.sh"
SANDBOXES=${1:-32000}
NODES=${2:-160}
bench_init cluster_job
bench_build
"$BENCH" cluster-job --sandboxes "$SANDBOXES" --nodes "$NODES" --replicas 1,2 --out "$RESULTS/cluster_job.json"
