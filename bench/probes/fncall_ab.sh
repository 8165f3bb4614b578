#!/usr/bin/env bash
# FnCall A/B (issue 5): two builds of dsec, the same request at the same
# concurrency, alternated round by round in one run so both see the same
# machine load. Per run: calls/s, p50/p99 (wrk) and the CPU each call cost,
# counted from the runners' cgroups (cpuacct) plus the dsec process itself,
# which other load on a shared host disturbs far less than calls/s (it still
# inflates it somewhat: caches and hyperthreads are shared).
# Usage: DSEC_BENCH_A=PATH/TO/OLD/dsec bench/probes/fncall_ab.sh [SECONDS] [ROUNDS] [CLIENTS]
#   (defaults 8 s, 3 rounds, 16 clients; B is this checkout's dsec, or
#   DSEC_BENCH_B). Each dsec finds its dsec-agent next to it. FLAGS_A and
#   FLAGS_B add `dsec up` flags to one side (e.g. FLAGS_B="--fncall-preload
#   math" against the same build). ~30 s per round.
# The request is DSEC_BENCH_AB_WORKLOAD: `python` (default; a short snippet,
# 2 runners per core), `python-new` (the same snippet, every request's
# source new: a comment differs) or `cpp-judge` (bench/fncall.sh's C++ submission of 10
# test cases with the compile cache warm, 1 runner per core; per run, the
# figure is submissions/s).
source "$(dirname "$0")/../lib.sh"
SECS=${1:-8}
ROUNDS=${2:-3}
WORKLOAD=${DSEC_BENCH_AB_WORKLOAD:-python}
CONNS=${3:-16}
# wrk needs at least as many connections as threads.
THREADS=$(( CONNS < 2 ? 1 : 2 ))
A=${DSEC_BENCH_A:?set DSEC_BENCH_A to the dsec binary to compare against}
B=${DSEC_BENCH_B:-$REPO/target/release/dsec}
bench_init fncall_ab
bench_build
case "$WORKLOAD" in
python)
    LANG_=python RUNNERS=$((2 * $(nproc)))
    printf '%s' '{"language":"python","code":"print(sum(i * i for i in range(100)))"}' >"$WORK/body.json"
    ;;
python-new)
    LANG_=python RUNNERS=$((2 * $(nproc))) NONCE=1
    printf '%s' '{"language":"python","code":"# @NONCE@\nprint(sum(i * i for i in range(100)))"}' >"$WORK/body.json"
    ;;
cpp-judge)
    LANG_=cpp RUNNERS=$(nproc)
    "$PY" - "$WORK/body.json" <<'PYEOF'
import json, sys
src = "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }\n"
cases = [{"stdin": f"{i} {i * 7}\n", "expected_output": f"{i * 8}\n"} for i in range(10)]
json.dump({"language": "cpp", "code": src, "test_cases": cases}, open(sys.argv[1], "w"))
PYEOF
    ;;
*) echo "unknown DSEC_BENCH_AB_WORKLOAD '$WORKLOAD' (python, python-new or cpp-judge)" >&2; exit 2 ;;
esac

# Nanoseconds of CPU used so far by this node's sandboxes (the node's
# cgroup: cgroup v1 cpuacct, or v2 cpu.stat) and dsec itself. (%.0f, not %d:
# mawk's %d stops at 2^31.)
cpu_ns() {
    local v1=/sys/fs/cgroup/cpuacct/dsec/$NODE/cpuacct.usage v2=/sys/fs/cgroup/dsec/$NODE/cpu.stat cg tck
    [ -r "$v2" ] || v2=/sys/fs/cgroup/unified/dsec/$NODE/cpu.stat
    if [ -r "$v1" ]; then
        cg=$(cat "$v1")
    elif [ -r "$v2" ]; then
        cg=$(awk '$1 == "usage_usec" { printf "%.0f", $2 * 1000 }' "$v2")
    else
        echo "no CPU accounting found for node $NODE" >&2
        exit 1
    fi
    tck=$(getconf CLK_TCK)
    awk -v tck="$tck" -v cg="$cg" '{ printf "%.0f\n", cg + ($14 + $15) * 1e9 / tck }' "/proc/$DSEC_PID/stat"
}

one_run() { # LABEL DSEC [extra `dsec up` flags]
    local label=$1
    DSEC=$2
    shift 2
    # A fresh log: bench_start_dsec reads the address from it, and the
    # previous run's line must not be found first.
    : >"$WORK/dsec.log"
    bench_start_dsec --fncall-pools "$LANG_=$RUNNERS:$RUNNERS" --cpu-overcommit 64 "$@"
    bench_wait_python_pool "$RUNNERS" "$LANG_" || { echo "$label: the $LANG_ pool did not warm up" >&2; exit 1; }
    # Warm-up: a second of load, not counted (it also fills the compile cache).
    DSEC_BENCH_BODY=$WORK/body.json DSEC_BENCH_NONCE=${NONCE:-} wrk -t"$THREADS" -c"$CONNS" -d1s -s "$BENCH_DIR/fncall.lua" "$DSEC_ENDPOINT" >/dev/null 2>&1
    local c0 c1 out j
    c0=$(cpu_ns)
    out=$(DSEC_BENCH_BODY=$WORK/body.json DSEC_BENCH_NONCE=${NONCE:-} wrk -t"$THREADS" -c"$CONNS" -d"${SECS}s" --timeout 30s \
        -s "$BENCH_DIR/fncall.lua" "$DSEC_ENDPOINT" 2>&1)
    c1=$(cpu_ns)
    j=$(printf '%s\n' "$out" | sed -n 's/^WRKJSON //p')
    [ -n "$j" ] || { printf '%s\n' "$out" >&2; exit 1; }
    bench_stop_dsec >/dev/null
    bench_reap_node
    printf '{"build": "%s", "cpu_ns": %s, "wrk": %s}' "$label" "$((c1 - c0))" "$j"
}

{
    echo '{"benchmark": "fncall_ab", "workload": "'"$WORKLOAD"'", "seconds": '"$SECS"', "clients": '"$CONNS"', "a": "'"$A"'", "b": "'"$B"'", "runs": ['
    for r in $(seq 1 "$ROUNDS"); do
        for side in A B; do
            bin=$A; f=${FLAGS_A:-}; [ "$side" = B ] && { bin=$B; f=${FLAGS_B:-}; }
            bench_log "round $r, $side ($bin $f)"
            [ "$r$side" = 1A ] || echo ","
            # shellcheck disable=SC2086 # the flags are words
            one_run "$side" "$bin" $f
        done
    done
    echo ']}'
} >"$RESULTS/fncall_ab.json"

"$PY" - "$RESULTS/fncall_ab.json" <<'PYEOF'
import json, statistics, sys
d = json.load(open(sys.argv[1]))
rows = {}
for r in d["runs"]:
    w = r["wrk"]
    calls = w["requests"] / (w["duration_us"] / 1e6)
    rows.setdefault(r["build"], []).append((calls, w["p50_ms"], w["p99_ms"], r["cpu_ns"] / 1e6 / max(1, w["requests"]), w["errors_status"] + w["errors_socket"]))
med = {}
print("%s, %d clients, %d s per run; per run: requests/s, p50/p99 ms, CPU ms per request" % (d.get("workload", "python"), d["clients"], d["seconds"]))
for b in ("A", "B"):
    runs = rows.get(b, [])
    print(b, "  ".join("%.1f/s %.1f/%.1f ms %.2f ms cpu%s" % (c, p5, p9, cpu, " ERR %d" % e if e else "") for c, p5, p9, cpu, e in runs))
    med[b] = [statistics.median(x[i] for x in runs) for i in range(4)]
    print("  median: %.1f requests/s, p50 %.1f ms, p99 %.1f ms, %.2f ms CPU per request" % tuple(med[b]))
print("B / A: requests/s %.2fx, CPU per request %.2fx" % (med["B"][0] / med["A"][0], med["B"][3] / med["A"][3]))
PYEOF
