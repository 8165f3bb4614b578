#!/usr/bin/env bash
# FnCall benchmarks (issue 5), dsec side by side with a subprocess-per-call
# baseline (`dsec-bench fncall-baseline`: a fresh interpreter, or compiler
# and binary, per call in a temporary directory, the way SandboxFusion runs
# code; Debian's /usr/bin/python3, the judge image's interpreter; no isolation
# at all, which only flatters it), in the same run:
#   1. a short Python snippet at 1, 8, 64 and 256 concurrent clients (wrk):
#      calls/s, p50, p99; and at 64 clients with every request's source
#      new (a comment differs), which no runner has compiled before
#   2. a C++ online-judge submission with 10 test cases: submissions/s with
#      the compile cache warm (the same source every time) and cold (every
#      request's source differs by a comment), for a source that includes
#      <iostream> and for one that includes <bits/stdc++.h> (what most
#      competitive-programming C++ does; the judge image carries it
#      precompiled); the same judge in Python
#   3. the Python SDK: DSecClient.fncall from one asyncio process
# Usage: bench/fncall.sh [SECONDS per wrk run] [all | snippet | judge]
# (default 10 and all; ~7 min; `judge` runs part 2 only). The runners'
# image is DSEC_BENCH_FNCALL_IMAGE (default `judge`), to compare images.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/fncall_lib.sh"
SECS=${1:-10}
PART=${2:-all}
case "$PART" in all | snippet | judge) ;; *) echo "unknown part '$PART' (all, snippet or judge)" >&2; exit 2 ;; esac
bench_init fncall
bench_build
BASELINE_PID=""
# Stop the baseline too. (No `(exit $rc)` here: under set -e a failing
# command inside the trap would end it before the cleanup.)
trap 'rc=$?; if [ -n "$BASELINE_PID" ]; then kill "$BASELINE_PID" 2>/dev/null || true; fi; bench_cleanup "$rc"' EXIT

# Pools fixed at the default maximum for this node (2 runners per core for
# Python, 1 for C++), so nothing grows in the middle of a measurement.
PY_RUNNERS=$((2 * $(nproc)))
CPP_RUNNERS=$(nproc)
bench_start_dsec --fncall-pools "python=$PY_RUNNERS:$PY_RUNNERS,cpp=$CPP_RUNNERS:$CPP_RUNNERS" --cpu-overcommit 64 \
    --fncall-image "${DSEC_BENCH_FNCALL_IMAGE:-judge}"
fncall_start_baseline --python /usr/bin/python3
bench_log "baseline at $BASELINE (pid $BASELINE_PID)"

printf '%s' '{"language":"python","code":"print(sum(i * i for i in range(100)))"}' >"$WORK/py.json"
printf '%s' '{"language":"python","code":"# @NONCE@\nprint(sum(i * i for i in range(100)))"}' >"$WORK/py_nonce.json"
"$PY" - "$WORK/cpp.json" "$WORK/cpp_nonce.json" "$WORK/py_judge.json" "$WORK/cpp_stdcpp_nonce.json" <<'PYEOF'
import json, sys
src = "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }\n"
cases = [{"stdin": f"{i} {i * 7}\n", "expected_output": f"{i * 8}\n"} for i in range(10)]
json.dump({"language": "cpp", "code": src, "test_cases": cases}, open(sys.argv[1], "w"))
json.dump({"language": "cpp", "code": src + "// @NONCE@\n", "test_cases": cases}, open(sys.argv[2], "w"))
py = "a, b = map(int, input().split())\nprint(a + b)\n"
json.dump({"language": "python", "code": py, "test_cases": cases}, open(sys.argv[3], "w"))
stdcpp = ("#include <bits/stdc++.h>\nusing namespace std;\n"
          "int main() { long a, b; cin >> a >> b; cout << a + b << endl; }\n// @NONCE@\n")
json.dump({"language": "cpp", "code": stdcpp, "test_cases": cases}, open(sys.argv[4], "w"))
PYEOF

# Sanity: both answer correctly before anything is timed.
for target in "$DSEC_ENDPOINT" "$BASELINE"; do
    fncall_check "$target" "$WORK/py.json"; fncall_check "$target" "$WORK/cpp.json"
    fncall_check "$target" "$WORK/py_judge.json"; fncall_check "$target" "$WORK/cpp_stdcpp_nonce.json"
done
# Pools are warm once their runners have started.
for _ in $(seq 1 100); do
    ready=$(curl -sS -H "Authorization: Bearer $DSEC_TOKEN" "$DSEC_ENDPOINT/v1/fncall/pools" |
        "$PY" -c 'import json,sys; p={x["language"]: x for x in json.load(sys.stdin)["pools"]}; print(p["python"]["idle"] == int(sys.argv[1]) and p["cpp"]["idle"] == int(sys.argv[2]))' "$PY_RUNNERS" "$CPP_RUNNERS")
    [ "$ready" = True ] && break
    sleep 0.2
done

{
    echo '{"benchmark": "fncall", "seconds": '"$SECS"', "nproc": '"$(nproc)"', "runs": ['
    first=1
    for conns in 1 8 64 256; do
        [ "$PART" = judge ] && break
        for t in dsec baseline; do
            url=$DSEC_ENDPOINT; [ "$t" = baseline ] && url=$BASELINE
            bench_log "python snippet, $t, $conns clients"
            [ $first = 1 ] || echo ","; first=0
            wrk_run "python snippet" "$t" "$url" "$WORK/py.json" "$conns"
        done
    done
    for t in dsec baseline; do
        [ "$PART" = judge ] && break
        url=$DSEC_ENDPOINT; [ "$t" = baseline ] && url=$BASELINE
        bench_log "python snippet, every source new, $t, 64 clients"
        echo ","; wrk_run "python snippet, every source new" "$t" "$url" "$WORK/py_nonce.json" 64 1
    done
    for t in dsec baseline; do
        [ "$PART" = snippet ] && break
        url=$DSEC_ENDPOINT; [ "$t" = baseline ] && url=$BASELINE
        bench_log "C++ judge, 10 cases, $t, warm compile cache"
        [ $first = 1 ] || echo ","; first=0
        wrk_run "cpp judge 10 cases, cache warm" "$t" "$url" "$WORK/cpp.json" 8
        bench_log "C++ judge, 10 cases, $t, every source new"
        echo ","; wrk_run "cpp judge 10 cases, cache cold" "$t" "$url" "$WORK/cpp_nonce.json" 8 1
        bench_log "C++ judge (bits/stdc++.h), 10 cases, $t, every source new"
        # Two clients (one compile per core) for three times as long: a
        # fresh compile of <bits/stdc++.h> takes seconds, and eight at once
        # would leave a short run with nothing finished to count.
        echo ","; wrk_run "cpp judge 10 cases, bits/stdc++.h, cache cold" "$t" "$url" "$WORK/cpp_stdcpp_nonce.json" 2 1 $((3 * SECS))
    done
    for t in dsec baseline; do
        [ "$PART" = snippet ] && break
        url=$DSEC_ENDPOINT; [ "$t" = baseline ] && url=$BASELINE
        bench_log "Python judge, 10 cases, $t"
        echo ","; wrk_run "python judge 10 cases" "$t" "$url" "$WORK/py_judge.json" 8
    done
    echo ']}'
} >"$RESULTS/fncall.json"

if [ "$PART" = all ]; then
    bench_log "Python SDK"
    "$PY" "$BENCH_DIR/sdk_fncall.py" "$RESULTS/fncall_sdk.json" 3000 64
else
    rm -f "$RESULTS/fncall_sdk.json"
fi

"$PY" "$BENCH_DIR/fncall_summary.py" "$RESULTS"
