#!/usr/bin/env bash
# The authorization and quota check of a creation at project tree depth 8
# (the token's grant on SQLite, then a reserve and release in the project
# and its seven ancestors, each with a quota), beside the grant alone,
# alternating in one run. Target: p99 at most 50 us.
# Usage: bench/quota_check.sh [ITERATIONS]   (default 200000, ~10 s)
source "$(dirname "$0")/lib.sh"
ITER=${1:-200000}
bench_init quota_check
bench_build
"$BENCH" quota-check --depth 8 --iterations "$ITER" --out "$RESULTS/quota_check.json"
