#!/usr/bin/env bash
# FnCall (issue 5): the memory of an idle Python runner, by process. One
# `dsec up` with 2 Python runners; once they are ready, the proportional set
# size (PSS, /proc/PID/smaps_rollup) of each process in the node's runner
# cgroups, by role: the monitor, the compiler, the zygote and its pre-forked
# worker (both run zygote.py --zygote). DSEC_BENCH_DSEC picks the build.
# Usage: bench/probes/fncall_rss.sh
source "$(dirname "$0")/../lib.sh"
bench_init fncall_rss
bench_build
bench_start_dsec --fncall-pools "python=2:2" --cpu-overcommit 64
bench_wait_python_pool 2 || { echo "the Python pool did not warm up" >&2; exit 1; }
for d in /proc/[0-9]*; do
    # cgroup v1 (the cpuacct line) or v2 (the "0::" line).
    grep -qE "^[0-9]+:([^:]*cpuacct[^:]*)?:/dsec/$NODE/" "$d/cgroup" 2>/dev/null || continue
    cmd=$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null) || continue
    case "$cmd" in
        *--zygote*) role="zygote or worker" ;;
        *--compiler*) role=compiler ;;
        *fncall-monitor*|*fncall-zygote*) role=monitor ;;
        *) continue ;;
    esac
    echo "$role $(awk '/^Pss:/ { print $2 }' "$d/smaps_rollup" 2>/dev/null)"
done | awk '{ kb = $NF; $NF = ""; sum[$0] += kb; n[$0]++ }
    END { for (r in sum) printf "%-20s %d processes, %.1f MB PSS each\n", r, n[r], sum[r] / n[r] / 1024 }' | sort
