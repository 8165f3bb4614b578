#!/usr/bin/env bash
# FnCall (issue 5): where a Python worker's page faults land. One `dsec up`
# with a single Python runner (so every worker is forked from one zygote,
# whose address-space layout they all share), wrk at 4 clients running the
# snippet; meanwhile the exceptions:page_fault_user tracepoint for 2 s. Each
# worker's faults are mapped onto the zygote's /proc/PID/maps (which
# mapping: heap, the interpreter's data, its code, libc...) and the faulting
# instruction onto the interpreter's exported symbols (the nearest one below
# it: a static function shows as the exported one before it). Printed:
# faults per worker by kind and mapping, then by faulting function; kinds as
# in fncall_perf.sh (0x7 a write to a present page, i.e. a copied page;
# 0x14 an instruction fetch; 0x4 a read; 0x6 a write to an absent page).
# Needs perf and nm (binutils). DSEC_BENCH_DSEC picks the build.
# Usage: bench/probes/fncall_fault_map.sh [TOP]   (default 30 functions)
source "$(dirname "$0")/../lib.sh"
TOP=${1:-30}
command -v perf >/dev/null || { echo "needs perf (Debian: linux-perf)" >&2; exit 1; }
command -v nm >/dev/null || { echo "needs nm (Debian: binutils)" >&2; exit 1; }
bench_init fncall_fault_map
bench_build
bench_start_python_pool 1
load() {
    DSEC_BENCH_BODY=$WORK/py.json wrk -t1 -c4 -d"$1" --timeout 30s -s "$BENCH_DIR/fncall.lua" "$DSEC_ENDPOINT"
}
load 2s >/dev/null 2>&1
# This node's one zygote: a python3 of this node's cgroup started --zygote.
ZYGOTE=""
for pid in $(pgrep -x python3); do
    grep -q "/$NODE/" "/proc/$pid/cgroup" 2>/dev/null || continue
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- '--zygote' && ZYGOTE=$pid && break
done
[ -n "$ZYGOTE" ] || { echo "no zygote found in node $NODE" >&2; exit 1; }
cp "/proc/$ZYGOTE/maps" "$WORK/maps.txt"
cp "/proc/$ZYGOTE/exe" "$WORK/python"
load 4s >/dev/null 2>&1 &
WRK=$!
sleep 1
perf record -q -e exceptions:page_fault_user -a -o "$WORK/pf.data" -- sleep 2 >/dev/null 2>&1
wait "$WRK"
perf script -i "$WORK/pf.data" -F comm,pid,trace 2>/dev/null | awk '$1 == "python3"' >"$WORK/pf.txt"
{ nm -D --defined-only "$WORK/python"; nm --defined-only "$WORK/python" 2>/dev/null; } >"$WORK/syms.txt" || true
"$PY" - "$WORK/maps.txt" "$WORK/pf.txt" "$WORK/syms.txt" "$ZYGOTE" "$TOP" <<'PYEOF'
import bisect, collections, re, sys

maps_file, faults_file, syms_file, zygote, top = sys.argv[1:6]
maps = []
for line in open(maps_file):
    f = line.split()
    lo, hi = (int(x, 16) for x in f[0].split("-"))
    maps.append((lo, hi, "%s %s" % (f[5].rsplit("/", 1)[-1] if len(f) > 5 else "[anon]", f[1]), len(f) > 5 and "python3" in f[5]))
syms = sorted({(int(f[0], 16), f[2]) for f in (l.split() for l in open(syms_file)) if len(f) == 3 and f[1] in "tTwW"})
starts = [a for a, _ in syms]

def mapping(addr):
    for lo, hi, name, is_python in maps:
        if lo <= addr < hi:
            return name, is_python
    return "?", False

def function(ip):
    name, is_python = mapping(ip)
    if not is_python:
        return name.split()[0]  # a library: its name
    i = bisect.bisect(starts, ip) - 1
    return syms[i][1] if i >= 0 else "?"

per = collections.defaultdict(list)
for line in open(faults_file):
    m = re.search(r"(\d+)\s+address=(0x[0-9a-f]+)\s+ip=(0x[0-9a-f]+)\s+error_code=(0x[0-9a-f]+)", line)
    if m and m[1] != zygote:
        per[m[1]].append((int(m[2], 16), int(m[3], 16), m[4]))
# Workers live for one call; the compiler for the whole run.
workers = [v for v in per.values() if len(v) < 2000]
if not workers:
    sys.exit("no worker's faults were recorded")
n = len(workers)
by_map, by_fn = collections.Counter(), collections.Counter()
for w in workers:
    for addr, ip, kind in w:
        where = mapping(addr)[0]
        by_map[(kind, where)] += 1
        by_fn[(kind, function(ip), where)] += 1
print("%d workers, %.0f page faults each on average" % (n, sum(map(len, workers)) / n))
print("faults per worker by kind and mapping:")
for (kind, where), c in by_map.most_common():
    if c / n >= 0.5:
        print("  %6.1f  %-5s %s" % (c / n, kind, where))
print("faults per worker by faulting function (kind, function, mapping):")
for (kind, fn, where), c in by_fn.most_common(int(top)):
    print("  %6.1f  %-5s %-36s %s" % (c / n, kind, fn, where))
PYEOF
