#!/usr/bin/env bash
# Benchmark 2 of issue 6: a trajectory of N steps (default 200), each a
# non-idempotent shell command with a step id. A reconnecting client
# fast-forwards through the log (recorded results, nothing runs) vs running
# the N steps again in a fresh sandbox (what recovery costs without a log);
# the ratio. Also the exec round trip of `true` with and without a step id
# (the log's cost on the exec path); set DSEC_BENCH_DSEC to another build's
# `dsec` (its dsec-agent next to it) to measure that build the same way.
# Usage: bench/trajectory.sh [N] [REPS] [RTT_N]   (~1 min)
source "$(dirname "$0")/lib.sh"
N=${1:-200}
REPS=${2:-3}
RTT_N=${3:-2000}
bench_init trajectory
bench_build
GEN="$PY $BENCH_DIR/trajectory_bench.py"
LABEL=${DSEC_BENCH_LABEL:-this}

bench_start_dsec --cpu-overcommit 64
FILES=()
if [ "$N" -gt 0 ]; then  # N=0: only the round trip (e.g. of a build without the log)
    bench_log "2. trajectory of $N steps: fast-forward vs re-execution ($REPS reps)"
    $GEN steps --n "$N" --reps "$REPS" --out "$RESULTS/trajectory_steps.json"
    FILES+=("$RESULTS/trajectory_steps.json")
fi
bench_log "exec round trip of true, $RTT_N each, with and without a step id"
$GEN rtt --n "$RTT_N" --label "$LABEL" --out "$RESULTS/trajectory_rtt_$LABEL.json"
bench_stop_dsec >/dev/null
$GEN report "${FILES[@]}" "$RESULTS/trajectory_rtt_$LABEL.json"
