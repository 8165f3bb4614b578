#!/usr/bin/env bash
# FnCall's languages beyond Python and C++, dsec side by side with the
# subprocess-per-call baseline (`dsec-bench fncall-baseline`) in the same
# run, where this host has the toolchain: the baseline runs the host's
# `javac`/`java`, `node`, `rustc` and `perl` (a fresh process per call in a
# temporary directory, no isolation); this host has no Go, PHP, Ruby or
# Lua, so their rows are dsec's alone. dsec runs the judge image's OpenJDK
# 17, Node.js 18, Go 1.19, rustc 1.63, Perl 5.36, PHP 8.2, Ruby 3.1, Lua 5.4.
#   1. a JavaScript snippet at 8 clients: calls/s, p50, p99
#   2. a Java judge submission of 10 test cases: submissions/s with the
#      compile cache warm (the same source) at 8 clients, and cold (every
#      source new) at 2 clients
#   3. the same in Rust
#   4. a Perl snippet at 8 clients
#   5. Go as in 2, and PHP, Ruby and Lua snippets (dsec only)
# Usage: bench/fncall_langs.sh [SECONDS per wrk run] (default 10; ~4 min).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/fncall_lib.sh"
SECS=${1:-10}
bench_init fncall_langs
bench_build
BASELINE_PID=""
trap 'rc=$?; if [ -n "$BASELINE_PID" ]; then kill "$BASELINE_PID" 2>/dev/null || true; fi; bench_cleanup "$rc"' EXIT

# One runner per core for each language, fixed, so nothing grows mid-run.
N=$(nproc)
LANGS="java javascript go rust perl php ruby lua"
bench_start_dsec --fncall-pools "$(for l in $LANGS; do printf '%s=%s:%s,' "$l" "$N" "$N"; done | sed 's/,$//')" --cpu-overcommit 64
fncall_start_baseline
bench_log "baseline at $BASELINE (pid $BASELINE_PID): $(java -version 2>&1 | head -1), node $(node --version), $(rustc --version), perl $(perl -e 'print $^V')"

"$PY" - "$WORK" <<'PYEOF'
import json, sys
w = sys.argv[1]
cases = [{"stdin": f"{i} {i * 7}\n", "expected_output": f"{i * 8}\n"} for i in range(10)]
js = "let s = 0; for (let i = 0; i < 100; i++) s += i * i; console.log(s);\n"
json.dump({"language": "javascript", "code": js}, open(f"{w}/js.json", "w"))
java = ("import java.util.*;\npublic class Main { public static void main(String[] x) {\n"
        "  Scanner in = new Scanner(System.in); long a = in.nextLong(), b = in.nextLong();\n"
        "  System.out.println(a + b); } }\n")
json.dump({"language": "java", "code": java, "test_cases": cases}, open(f"{w}/java.json", "w"))
json.dump({"language": "java", "code": java + "// @NONCE@\n", "test_cases": cases}, open(f"{w}/java_nonce.json", "w"))
go = ('package main\nimport "fmt"\nfunc main() { var a, b int64; fmt.Scan(&a, &b); fmt.Println(a + b) }\n')
json.dump({"language": "go", "code": go, "test_cases": cases}, open(f"{w}/go.json", "w"))
json.dump({"language": "go", "code": go + "// @NONCE@\n", "test_cases": cases}, open(f"{w}/go_nonce.json", "w"))
rust = ("use std::io::Read;\nfn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap();\n"
        "  let v: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect(); println!(\"{}\", v[0] + v[1]); }\n")
json.dump({"language": "rust", "code": rust, "test_cases": cases}, open(f"{w}/rust.json", "w"))
json.dump({"language": "rust", "code": rust + "// @NONCE@\n", "test_cases": cases}, open(f"{w}/rust_nonce.json", "w"))
# The same loop as the JavaScript snippet, in each interpreter.
snippets = {
    "perl": "my $s = 0; $s += $_ * $_ for 0 .. 99; print \"$s\\n\";\n",
    "php": "<?php $s = 0; for ($i = 0; $i < 100; $i++) $s += $i * $i; echo $s, \"\\n\";\n",
    "ruby": "puts((0...100).sum { |i| i * i })\n",
    "lua": "local s = 0 for i = 0, 99 do s = s + i * i end print(s)\n",
}
for lang, code in snippets.items():
    json.dump({"language": lang, "code": code}, open(f"{w}/{lang}.json", "w"))
PYEOF

for body in js java go rust perl php ruby lua; do fncall_check "$DSEC_ENDPOINT" "$WORK/$body.json"; done
for body in js java rust perl; do fncall_check "$BASELINE" "$WORK/$body.json"; done
# Every runner idle. Before each of dsec's rows too: when wrk stops, the
# calls it leaves in flight (a Java submission of 10 cases takes seconds)
# go on, or retire their runner, and would hold up the next row's first.
wait_idle() {
    local ready
    for _ in $(seq 1 300); do
        ready=$(curl -sS -H "Authorization: Bearer $DSEC_TOKEN" "$DSEC_ENDPOINT/v1/fncall/pools" |
            "$PY" -c 'import json,sys; n=int(sys.argv[1]); print(all(p["idle"] == n for p in json.load(sys.stdin)["pools"]))' "$N")
        [ "$ready" = True ] && return
        sleep 0.2
    done
    echo "the pools did not settle" >&2
    return 1
}
wait_idle

# Before each of dsec's rows, every runner idle (see wait_idle).
fncall_before_run() {
    if [ "$1" = dsec ]; then wait_idle; fi
}

{
    echo '{"benchmark": "fncall_langs", "seconds": '"$SECS"', "nproc": '"$N"', "runs": ['
    first=1
    for t in dsec baseline; do
        url=$DSEC_ENDPOINT; [ "$t" = baseline ] && url=$BASELINE
        bench_log "JavaScript snippet, $t, 8 clients"
        [ $first = 1 ] || echo ","; first=0
        wrk_run "javascript snippet" "$t" "$url" "$WORK/js.json" 8
        bench_log "Java judge, 10 cases, $t, warm compile cache"
        echo ","; wrk_run "java judge 10 cases, cache warm" "$t" "$url" "$WORK/java.json" 8
        bench_log "Java judge, 10 cases, $t, every source new"
        echo ","; wrk_run "java judge 10 cases, cache cold" "$t" "$url" "$WORK/java_nonce.json" 2 1 $((2 * SECS))
        bench_log "Rust judge, 10 cases, $t, warm compile cache"
        echo ","; wrk_run "rust judge 10 cases, cache warm" "$t" "$url" "$WORK/rust.json" 8
        bench_log "Rust judge, 10 cases, $t, every source new"
        echo ","; wrk_run "rust judge 10 cases, cache cold" "$t" "$url" "$WORK/rust_nonce.json" 2 1 $((2 * SECS))
        bench_log "Perl snippet, $t, 8 clients"
        echo ","; wrk_run "perl snippet" "$t" "$url" "$WORK/perl.json" 8
    done
    bench_log "Go judge, 10 cases, dsec, warm compile cache"
    echo ","; wrk_run "go judge 10 cases, cache warm" dsec "$DSEC_ENDPOINT" "$WORK/go.json" 8
    bench_log "Go judge, 10 cases, dsec, every source new"
    echo ","; wrk_run "go judge 10 cases, cache cold" dsec "$DSEC_ENDPOINT" "$WORK/go_nonce.json" 2 1 $((2 * SECS))
    for lang in php ruby lua; do
        bench_log "$lang snippet, dsec, 8 clients"
        echo ","; wrk_run "$lang snippet" dsec "$DSEC_ENDPOINT" "$WORK/$lang.json" 8
    done
    echo ']}'
} >"$RESULTS/fncall_langs.json"

"$PY" "$BENCH_DIR/fncall_summary.py" "$RESULTS" fncall_langs
