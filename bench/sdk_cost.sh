#!/usr/bin/env bash
# The Python SDK's own cost: this checkout's SDK against the previous one
# (DSEC_BENCH_OLD_REF, default main, or a checkout's sdk/python given as
# DSEC_BENCH_OLD_SDK), in one run on one `dsec up`, the two alternating in
# DSEC_BENCH_ROUNDS rounds (default 2), with crun and the compiled client:
#   - create -> first run_shell("true") answered (the new SDK also with the
#     command carried in the creation request), vs `crun run -d` + `exec`
#   - exec round trip of `true` and the client's CPU per exec, async and
#     through the blocking wrapper (dsec.sync)
#   - one process driving C workers (DSEC_BENCH_FANOUT_C, default 256) over
#     FANOUT live sandboxes for DSEC_BENCH_FANOUT_S seconds (default 10); wrk
#     on the same sandboxes gives the server's capacity apart
#   - a cProfile of the exec path, by layer
# Usage: bench/sdk_cost.sh [CREATE_N] [EXEC_N] [FANOUT]   (default 200 4000 1000)
source "$(dirname "$0")/lib.sh"
CREATE_N=${1:-200}
EXEC_N=${2:-4000}
FANOUT=${3:-1000}
ROUNDS=${DSEC_BENCH_ROUNDS:-4}
FANOUT_C=${DSEC_BENCH_FANOUT_C:-256}
FANOUT_S=${DSEC_BENCH_FANOUT_S:-10}
bench_init sdk_cost
bench_build
bench_need_hugetlb

NEW=$REPO/sdk/python
OLD=${DSEC_BENCH_OLD_SDK:-}
if [ -z "$OLD" ]; then
    git -C "$REPO" archive "${DSEC_BENCH_OLD_REF:-main}" sdk/python | tar -x -C "$WORK"
    OLD=$WORK/sdk/python
fi
bench_log "previous SDK: $OLD; this SDK: $NEW"

# 1,000 small sandboxes at once: room for their CPU shares and memory.
bench_start_dsec --cpu-overcommit 128 --memory-overcommit 8
OUT=$WORK/phases.jsonl
: >"$OUT"
phase() { # SIDE PHASE ARGS...: one driver run, its JSON tagged with the side
    local side=$1 sdk
    shift
    sdk=$([ "$side" = old ] && echo "$OLD" || echo "$NEW")
    PYTHONPATH=$sdk "$PY" "$BENCH_DIR/sdk_cost_bench.py" "$@" |
        "$PY" -c 'import json,sys; d=json.load(sys.stdin); d["side"]=sys.argv[1]; print(json.dumps(d))' "$side" >>"$OUT"
}

per_round=$(( CREATE_N / ROUNDS ))
exec_round=$(( EXEC_N / ROUNDS ))
for round in $(seq 1 "$ROUNDS"); do
    bench_log "round $round: crun run -d + exec, compiled client ($per_round)"
    "$BENCH" latency --dsec-pid "$DSEC_PID" --iterations "$per_round" --warmup 5 \
        --crun-work "$WORK/crun" --images-dir "$IMAGES_DIR" --out "$WORK/latency.$round.json" >/dev/null
    for side in old new; do
        bench_log "round $round, $side SDK: create ($per_round), exec ($exec_round)"
        phase "$side" create "$per_round"
        phase "$side" exec "$exec_round"
    done
done

bench_log "$FANOUT live sandboxes"
PYTHONPATH=$NEW "$PY" "$BENCH_DIR/sdk_cost_bench.py" make "$FANOUT" "$WORK/ids" >/dev/null
for round in $(seq 1 "$ROUNDS"); do
    for side in old new; do
        bench_log "round $round, $side SDK: $FANOUT_C workers over $FANOUT sandboxes, ${FANOUT_S} s"
        phase "$side" fanout "$WORK/ids" "$FANOUT_S" "$FANOUT_C"
    done
done
bench_log "wrk over the same sandboxes (server capacity)"
wrk_out=$(DSEC_BENCH_IDS="$(tr '\n' ' ' <"$WORK/ids")" DSEC_BENCH_PATH=exec \
    wrk -t1 -c"$FANOUT_C" -d"${FANOUT_S}s" -s "$BENCH_DIR/exec.lua" "$DSEC_ENDPOINT" 2>&1)
printf '%s\n' "$wrk_out" | sed -n 's/^WRKJSON //p' >"$WORK/wrk.json"
[ -s "$WORK/wrk.json" ] || { printf '%s\n' "$wrk_out" >&2; exit 1; }
PYTHONPATH=$NEW "$PY" "$BENCH_DIR/sdk_cost_bench.py" remove "$WORK/ids" >/dev/null

for side in old new; do
    bench_log "$side SDK: profile"
    phase "$side" profile 2000
done

"$PY" "$BENCH_DIR/sdk_cost_report.py" "$OUT" "$WORK/wrk.json" "$FANOUT_C" \
    "$WORK"/latency.*.json >"$RESULTS/sdk_cost.json"
