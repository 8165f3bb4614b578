#!/usr/bin/env bash
# The E2B compatibility layer's cost: the unmodified e2b SDK (the version
# the SDK's test extra pins) against dsec's E2B routes, side by side with
# dsec's own SDK on the same `dsec up`, alternating in rounds:
#   - create -> first command (`true`) answered -> kill, whole and by part
#   - the commands.run("true") round trip vs exec of the argv it sends
#     (`bash -l -c true`: the same work on both sides)
#   - a burst of BURST creations from one asyncio process, through each
# The layer's target: at most 1.3x the native SDK per lifecycle. E2B's own
# cloud shows about 440 ms from request to first command at p50 in
# published third-party measurements; ours is recorded beside it.
# Usage: bench/e2b.sh [LIFECYCLE_N] [EXEC_N] [BURST]   (default 200 2000 1000)
source "$(dirname "$0")/lib.sh"
LIFECYCLE_N=${1:-200}
EXEC_N=${2:-2000}
BURST=${3:-1000}
ROUNDS=${DSEC_BENCH_ROUNDS:-4}
bench_init e2b
bench_build
"$PY" -c 'import e2b' 2>/dev/null || {
    echo "the e2b SDK is missing: pip install -e 'sdk/python[test]'" >&2
    exit 1
}

# A burst of BURST sandboxes at once at the server's default limits (an E2B
# creation names none: 1 core, 512 MiB each): room for all of them.
bench_start_dsec --cpu-overcommit 512 --memory-overcommit 32 --max-sandboxes 4096
OUT=$WORK/phases.jsonl
: >"$OUT"
bench_log "lifecycle: $LIFECYCLE_N per SDK in $ROUNDS rounds"
"$PY" "$BENCH_DIR/e2b_bench.py" lifecycle "$LIFECYCLE_N" "$ROUNDS" >>"$OUT"
bench_log "exec round trip: $EXEC_N per SDK"
"$PY" "$BENCH_DIR/e2b_bench.py" exec "$EXEC_N" "$ROUNDS" >>"$OUT"
bench_log "burst of $BURST per SDK"
"$PY" "$BENCH_DIR/e2b_bench.py" burst "$BURST" >>"$OUT"

"$PY" - "$OUT" <<'PY' | tee "$RESULTS/e2b.md"
import json, sys
ph = {d["phase"]: d for d in map(json.loads, open(sys.argv[1]))}
lc, ex, bu = ph["lifecycle"], ph["exec"], ph["burst"]
def row(name, e, n, unit="ms"):
    print(f"| {name} | {e:.2f} {unit} | {n:.2f} {unit} | {e / n:.2f}x |")
print("| figure | e2b SDK on dsec | dsec SDK | ratio |")
print("|---|---|---|---|")
row("create -> first command -> kill, p50", lc["e2b"]["whole"]["p50_ms"], lc["native"]["whole"]["p50_ms"])
row("create -> first command -> kill, p99", lc["e2b"]["whole"]["p99_ms"], lc["native"]["whole"]["p99_ms"])
row("create, p50", lc["e2b"]["create"]["p50_ms"], lc["native"]["create"]["p50_ms"])
row("request to first command answered, p50", lc["e2b"]["create"]["p50_ms"] + lc["e2b"]["first"]["p50_ms"],
    lc["native"]["create"]["p50_ms"] + lc["native"]["first"]["p50_ms"])
row("command round trip (`true`), p50", ex["e2b"]["p50_ms"], ex["native"]["p50_ms"])
row("command round trip (`true`), p99", ex["e2b"]["p99_ms"], ex["native"]["p99_ms"])
n = bu["e2b"]["n"]
print(f"| burst of {n}: wall time | {bu['e2b']['wall_s']:.2f} s | {bu['native']['wall_s']:.2f} s | "
      f"{bu['e2b']['wall_s'] / bu['native']['wall_s']:.2f}x |")
row(f"burst of {n}: creation p50", bu["e2b"]["p50_ms"], bu["native"]["p50_ms"])
print(f"| burst: failed creations | {bu['e2b']['failed']} | {bu['native']['failed']} | |")
print()
print(f"E2B's cloud, request to first command p50 (published): ~440 ms; on dsec: "
      f"{lc['e2b']['create']['p50_ms'] + lc['e2b']['first']['p50_ms']:.1f} ms")
PY
cp "$OUT" "$RESULTS/e2b.jsonl"
