#!/usr/bin/env bash
# FnCall (issue 5): where a Python call's CPU goes, by the kernel's and the
# processes' own code paths, and how many page faults a worker takes. One
# `dsec up` with 2 Python runners per core, wrk at CLIENTS clients; during
# it, `perf record -a` twice:
#   1. cpu-clock samples with call graphs for 8 s: the share of every
#      command name, and of the kernel paths that dominate a fork per call
#      (page faults, exit, fork's copy of the page tables)
#   2. the exceptions:page_fault_user tracepoint for 2 s: page faults per
#      worker process by kind (0x7 a write to a present page, i.e. a copied
#      or reused page; 0x14 an instruction fetch of a page not mapped;
#      0x4 a read of one; 0x6 a write of one), medians over the workers
# Needs perf. DSEC_BENCH_DSEC picks the build.
# Usage: bench/probes/fncall_perf.sh [CLIENTS]   (default 64)
source "$(dirname "$0")/../lib.sh"
CONNS=${1:-64}
# wrk needs at least as many connections as threads.
THREADS=$(( CONNS < 2 ? 1 : 2 ))
command -v perf >/dev/null || { echo "needs perf (Debian: linux-perf)" >&2; exit 1; }
bench_init fncall_perf
bench_build
bench_start_python_pool
load() {
    DSEC_BENCH_BODY=$WORK/py.json wrk -t"$THREADS" -c"$CONNS" -d"$1" --timeout 30s -s "$BENCH_DIR/fncall.lua" "$DSEC_ENDPOINT"
}
load 1s >/dev/null 2>&1

load 12s >"$WORK/wrk1.txt" 2>&1 &
WRK=$!
sleep 2
perf record -q -e cpu-clock -F 997 -a -g -o "$WORK/cpu.data" -- sleep 8 >/dev/null 2>&1
wait "$WRK"
sed -n 's/^WRKJSON //p' "$WORK/wrk1.txt" | "$PY" -c 'import json, sys; j = json.load(sys.stdin); print("during the profile: %.0f calls/s at '"$CONNS"' clients (perf itself costs some)" % (j["requests"] / j["duration_us"] * 1e6))'
echo "share of all CPU samples, by command:"
perf report -i "$WORK/cpu.data" --no-children --sort comm --stdio -g none 2>/dev/null | grep '%' | head -6
echo "share of all CPU samples, kernel paths of python3 (inclusive):"
perf report -i "$WORK/cpu.data" --children --comm python3 --sort sym --stdio -g none 2>/dev/null \
    | grep -E '\] (asm_exc_page_fault|do_wp_page|do_fault|do_exit|dup_mmap|copy_page_range|unmap_page_range|_PyEval_EvalFrameDefault)$'

load 5s >/dev/null 2>&1 &
WRK=$!
sleep 1
perf record -q -e exceptions:page_fault_user -a -o "$WORK/pf.data" -- sleep 2 >/dev/null 2>&1
wait "$WRK"
perf script -i "$WORK/pf.data" -F comm,pid,trace 2>/dev/null | awk '$1 == "python3"' | "$PY" -c '
import collections, re, sys
per = collections.defaultdict(collections.Counter)
for line in sys.stdin:
    per[line.split()[1]][re.search(r"error_code=(0x[0-9a-f]+)", line)[1]] += 1
# Workers live for one call; the zygotes and compilers for the whole run.
workers = [c for c in per.values() if sum(c.values()) < 2000]
def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0
print("page faults per worker (median of %d): all %d; by kind %s" % (
    len(workers), median([sum(c.values()) for c in workers]),
    ", ".join("%s %d" % (k, median([c[k] for c in workers])) for k in ("0x7", "0x14", "0x4", "0x6"))))
'
