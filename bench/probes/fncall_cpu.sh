#!/usr/bin/env bash
# FnCall (issue 5): where a Python call's CPU goes. One `dsec up` with
# 2 Python runners per core, wrk at CLIENTS clients for SECONDS; the CPU
# time every process of the node's runners and the dsec process used
# meanwhile (/proc/PID/stat, before and after), by role, divided by the
# calls: dsec (HTTP, edge), the guest agent (relay), the monitor (the
# runner's per-call work: `dsec-agent fncall-monitor`, or a Python process
# in builds before it), the compiler (Python source to code objects), the
# zygote (its forks) and its children (the workers that become the calls). Processes that lived only during the run
# count through their parent's reaped-children time.
# Usage: bench/probes/fncall_cpu.sh [SECONDS] [CLIENTS]   (defaults 8 s, 16)
source "$(dirname "$0")/../lib.sh"
SECS=${1:-8}
CONNS=${2:-16}
# wrk needs at least as many connections as threads.
THREADS=$(( CONNS < 2 ? 1 : 2 ))
bench_init fncall_cpu
bench_build
bench_start_python_pool
DSEC_BENCH_BODY=$WORK/py.json wrk -t"$THREADS" -c"$CONNS" -d1s -s "$BENCH_DIR/fncall.lua" "$DSEC_ENDPOINT" >/dev/null 2>&1

# One line per process of the node (and dsec): pid role utime stime cutime cstime.
snapshot() {
    local d p cmd role st
    for d in /proc/[0-9]*; do
        p=${d#/proc/}
        if [ "$p" != "$DSEC_PID" ]; then
            # cgroup v1 (the cpuacct line) or v2 (the "0::" line).
            grep -qE "^[0-9]+:([^:]*cpuacct[^:]*)?:/dsec/$NODE/" "$d/cgroup" 2>/dev/null || continue
        fi
        cmd=$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null) || continue
        case "$cmd" in
            *--zygote*) role=zygote ;;
            *--compiler*) role=compiler ;;
            *fncall-monitor*|*fncall-zygote*) role=monitor ;;
            *dsec-agent*) role=agent ;;
            *) role=other ;;
        esac
        [ "$p" = "$DSEC_PID" ] && role=dsec
        st=$(sed 's/^.*) //' "$d/stat" 2>/dev/null) || continue
        # Fields after the command: 12-15 are utime stime cutime cstime.
        echo "$p $role $(echo "$st" | awk '{print $12, $13, $14, $15}')"
    done
}
snapshot >"$WORK/before"
out=$(DSEC_BENCH_BODY=$WORK/py.json wrk -t"$THREADS" -c"$CONNS" -d"${SECS}s" --timeout 30s \
    -s "$BENCH_DIR/fncall.lua" "$DSEC_ENDPOINT" 2>&1)
snapshot >"$WORK/after"
j=$(printf '%s\n' "$out" | sed -n 's/^WRKJSON //p')
[ -n "$j" ] || { printf '%s\n' "$out" >&2; exit 1; }
"$PY" - "$WORK/before" "$WORK/after" "$j" <<'PYEOF'
import json, os, sys
tck = os.sysconf("SC_CLK_TCK")
def load(path):
    return {f[0]: (f[1], *map(int, f[2:])) for f in (line.split() for line in open(path)) if len(f) == 6}
before, after, w = load(sys.argv[1]), load(sys.argv[2]), json.loads(sys.argv[3])
calls = w["requests"]
rows = {}
for pid, (role, u, s, cu, cs) in after.items():
    _, u0, s0, cu0, cs0 = before.get(pid, (role, 0, 0, 0, 0))
    for name, du, ds in ((role, u - u0, s - s0), (role + " children", cu - cu0, cs - cs0)):
        r = rows.setdefault(name, [0, 0])
        r[0] += du
        r[1] += ds
print("%d calls in %.1f s (%.0f/s), p50 %.1f ms, p99 %.1f ms" % (calls, w["duration_us"] / 1e6, calls / (w["duration_us"] / 1e6), w["p50_ms"], w["p99_ms"]))
print("CPU ms per call: role, user, system, total")
total = 0.0
for name, (u, s) in sorted(rows.items()):
    if u + s:
        mu, ms = u * 1000 / tck / calls, s * 1000 / tck / calls
        total += mu + ms
        print("  %-18s %.3f %.3f %.3f" % (name, mu, ms, mu + ms))
print("  %-18s %.3f" % ("all", total))
PYEOF
