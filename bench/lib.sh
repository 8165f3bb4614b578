# Shared by the bench/*.sh scripts (sourced, not run). Each script gets:
#   bench_init NAME      work dir, results dir, cleanup trap
#   bench_build          release binaries + the dsec-bench generator
#   bench_start_dsec ... its own `dsec up` (temp data dir, free loopback port,
#                        the shared images dir); sets DSEC_PID, DSEC_ENDPOINT,
#                        DSEC_TOKEN, DATA_DIR, NODE
#   bench_stop_dsec      SIGTERM it (sandboxes stop with it) and wait
#   bench_wait_python_pool N [LANG]  until the FnCall pool of LANG (default
#                        python) has N idle runners
#   bench_need_hugetlb   crun on this hybrid cgroup v1 layout needs the
#                        hugetlb hierarchy mounted; mounted here if missing
#                        and unmounted again at exit
# The trap kills only what the script started (by pid), unmounts only what
# it mounted, restores what it changed (pid_max), and removes its temp dirs.

set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$BENCH_DIR")
IMAGES_DIR=${DSEC_IMAGES_DIR:-/var/lib/dsec/images}
RESULTS=${DSEC_BENCH_RESULTS:-$BENCH_DIR/results}
DSEC=${DSEC_BENCH_DSEC:-$REPO/target/release/dsec}
BENCH=${DSEC_BENCH_BIN:-$REPO/target/release/dsec-bench}
PY=${PYTHON:-python3}
# The wrk scripts load their shared done() from here.
export DSEC_BENCH_LUA_DIR=$BENCH_DIR
# The scripts' Python parts use this checkout's SDK, whatever is installed.
export PYTHONPATH=$REPO/sdk/python${PYTHONPATH:+:$PYTHONPATH}

DSEC_PID=""
WORK=""
NODE=""
DATA_DIR=""
MOUNTED_HUGETLB=""
OLD_PID_MAX=""
BENCH_NAME=""
# A script that sets up more than this file knows (a shaped link, a store
# server) names a function here; cleanup runs it once dsec is stopped.
BENCH_CLEANUP_HOOK=""

bench_log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

bench_init() {
    BENCH_NAME=$1
    [ "$(id -u)" = 0 ] || { echo "the benchmarks need root (namespaces, cgroups, mounts)" >&2; exit 1; }
    mkdir -p "$RESULTS"
    WORK=$(mktemp -d "/tmp/dsec-bench-$BENCH_NAME.XXXXXX")
    NODE="b$(printf '%s' "$BENCH_NAME" | tr -cd 'a-z0-9' | cut -c1-12)$$"
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}

bench_build() {
    if [ -n "${DSEC_BENCH_NO_BUILD:-}" ]; then return; fi
    bench_log "building (scripts/build.sh, cargo build --release -p dsec-bench)"
    (cd "$REPO" && scripts/build.sh >/dev/null && cargo build --release -p dsec-bench --quiet)
}

# bench_start_dsec [extra `dsec up` flags...]
# DSEC_BENCH_UP_FLAGS adds flags to every benchmark's `dsec up` (say
# `--writable-layer tmpfs`, to compare with a build that had no disk layer).
# FnCall runners are off unless the flags configure them (--fncall-*): the
# sandbox benchmarks count and measure the node's sandboxes, and warm
# runners would be among them.
bench_start_dsec() {
    local fncall=--no-fncall
    case " $* " in *" --fncall-"*) fncall="" ;; esac
    DATA_DIR=$WORK/data
    mkdir -p "$DATA_DIR"
    local log=$WORK/dsec.log
    # Thousands of sandboxes hold thousands of fds in the dsec process: give
    # it room (the edge raises its soft limit to the hard one).
    (ulimit -Hn 1048576 2>/dev/null || true; ulimit -Sn "$(ulimit -Hn)";
     exec "$DSEC" up --data-dir "$DATA_DIR" --images-dir "$IMAGES_DIR" --listen 127.0.0.1:0 \
        --node "$NODE" --stop-sandboxes-on-exit $fncall ${DSEC_BENCH_UP_FLAGS:-} "$@") >"$log" 2>&1 &
    DSEC_PID=$!
    local addr=""
    for _ in $(seq 1 300); do
        addr=$(sed -n 's/^dsec is up at \(http:[^ ]*\).*/\1/p' "$log" | head -1)
        [ -n "$addr" ] && break
        kill -0 "$DSEC_PID" 2>/dev/null || { cat "$log" >&2; echo "dsec up died" >&2; exit 1; }
        sleep 0.1
    done
    [ -n "$addr" ] || { cat "$log" >&2; echo "dsec up did not come up" >&2; exit 1; }
    export DSEC_ENDPOINT=$addr
    DSEC_TOKEN=$(cat "$DATA_DIR/admin-token")
    export DSEC_TOKEN
    bench_log "dsec up: pid $DSEC_PID at $DSEC_ENDPOINT, node $NODE, data $DATA_DIR"
}

# bench_wait_python_pool N [LANG]: waits (up to 30 s) until the FnCall pool
# of LANG (default python) of the running dsec has N idle runners; fails
# otherwise.
bench_wait_python_pool() {
    local ready=False
    for _ in $(seq 1 150); do
        ready=$(curl -sS -H "Authorization: Bearer $DSEC_TOKEN" "$DSEC_ENDPOINT/v1/fncall/pools" |
            "$PY" -c 'import json,sys
try: print({x["language"]: x for x in json.load(sys.stdin)["pools"]}[sys.argv[2]]["idle"] == int(sys.argv[1]))
except (ValueError, KeyError): print(False)' "$1" "${2:-python}" || true)
        [ "$ready" = True ] && return 0
        sleep 0.2
    done
    return 1
}

# FnCall benchmarks of Python calls: starts the platform with a fixed pool
# of N Python runners (PY_RUNNERS; default 2 per core), writes the
# benchmark snippet's request to $WORK/py.json and waits until every runner
# is idle.
bench_start_python_pool() {
    PY_RUNNERS=${1:-$((2 * $(nproc)))}
    bench_start_dsec --fncall-pools "python=$PY_RUNNERS:$PY_RUNNERS" --cpu-overcommit 64
    printf '%s' '{"language":"python","code":"print(sum(i * i for i in range(100)))"}' >"$WORK/py.json"
    bench_wait_python_pool "$PY_RUNNERS" || { echo "the Python pool did not warm up" >&2; exit 1; }
}

# Stops the platform (its sandboxes stop with it) and waits; prints seconds.
bench_stop_dsec() {
    [ -n "$DSEC_PID" ] || return 0
    local t0 t1
    t0=$(date +%s.%N)
    kill -TERM "$DSEC_PID" 2>/dev/null || true
    for _ in $(seq 1 1200); do
        kill -0 "$DSEC_PID" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$DSEC_PID" 2>/dev/null; then
        bench_log "dsec did not exit in 120 s; killing it"
        kill -KILL "$DSEC_PID" 2>/dev/null || true
    fi
    wait "$DSEC_PID" 2>/dev/null || true
    t1=$(date +%s.%N)
    DSEC_PID=""
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f\n", b - a }'
}

bench_need_hugetlb() {
    if ! awk '$9 == "cgroup" && $NF ~ /hugetlb/ {f=1} END {exit !f}' /proc/self/mountinfo; then
        mkdir -p /sys/fs/cgroup/hugetlb
        mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb
        MOUNTED_HUGETLB=/sys/fs/cgroup/hugetlb
        bench_log "mounted the hugetlb cgroup hierarchy for crun (unmounted at exit)"
    fi
}

bench_raise_pid_max() {
    OLD_PID_MAX=$(cat /proc/sys/kernel/pid_max)
    if [ "$OLD_PID_MAX" -lt "$1" ]; then
        echo "$1" >/proc/sys/kernel/pid_max
        bench_log "pid_max $OLD_PID_MAX -> $1 (restored at exit)"
    else
        OLD_PID_MAX=""
    fi
}

# Waits (at most $1 seconds, default 180) until the kernel has finished
# tearing down an earlier run's network namespaces: their cleanup runs in
# kernel workers and would otherwise land on this run's first creations.
# A namespace count that has not fallen for 3 s counts as settled. Logs the
# host's free memory too: a page cache that fills memory makes later
# allocations reclaim, which shows in creation times.
bench_wait_kernel_settled() {
    local limit=${1:-180} start=$SECONDS last="" same=0 now
    while [ $((SECONDS - start)) -lt "$limit" ]; do
        now=$(awk '$1 == "net_namespace" {print $2}' /proc/slabinfo 2>/dev/null)
        [ -n "$now" ] || break
        if [ "$now" = "$last" ]; then
            same=$((same + 1))
            [ "$same" -ge 3 ] && break
        else
            same=0
        fi
        last=$now
        sleep 1
    done
    bench_log "kernel settled after $((SECONDS - start)) s: ${last:-?} network namespaces, MemFree $(awk '/^MemFree/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo), page cache $(awk '/^Cached/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
}

# Kills agents left in this node's cgroups (only if dsec itself could not
# stop them) and removes the node's cgroups.
bench_reap_node() {
    [ -n "$NODE" ] || return 0
    local d pid
    for d in /sys/fs/cgroup/*/dsec/"$NODE"/*/; do
        [ -f "$d/cgroup.procs" ] || continue
        while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$d/cgroup.procs"
    done
    for d in /sys/fs/cgroup/*/dsec/"$NODE"/*/ /sys/fs/cgroup/*/dsec/"$NODE"/; do
        [ -d "$d" ] && rmdir "$d" 2>/dev/null || true
    done
}

# bench_cleanup [RC]: RC defaults to the status the script is exiting with.
bench_cleanup() {
    local rc=${1:-$?}
    set +e
    trap - EXIT INT TERM
    if [ -n "$DSEC_PID" ]; then
        bench_log "cleanup: stopping dsec (pid $DSEC_PID)"
        bench_stop_dsec >/dev/null
    fi
    bench_reap_node
    if [ -n "$BENCH_CLEANUP_HOOK" ]; then "$BENCH_CLEANUP_HOOK"; fi
    # Host swap never outlives a benchmark: a dsec that was killed leaves its
    # swap file on.
    if [ -n "$WORK" ]; then
        local s
        for s in $(awk 'NR > 1 {print $1}' /proc/swaps); do
            case "$s" in "$WORK"/*) swapoff "$s" && rm -f "$s" ;; esac
        done
    fi
    # crun containers left by a generator that died (normally it deletes its own).
    if [ -n "$WORK" ] && [ -d "$WORK/crun/state" ]; then
        local id
        for id in $(ls "$WORK/crun/state" 2>/dev/null); do
            crun --root "$WORK/crun/state" delete -f "$id" >/dev/null 2>&1
        done
        for d in /sys/fs/cgroup/*/dsecbench-crun-*/*/ /sys/fs/cgroup/*/dsecbench-crun-*/; do
            [ -d "$d" ] && [ -z "$(cat "$d/cgroup.procs" 2>/dev/null)" ] && rmdir "$d" 2>/dev/null
        done
    fi
    if [ -n "$MOUNTED_HUGETLB" ]; then
        umount "$MOUNTED_HUGETLB" && rmdir "$MOUNTED_HUGETLB" 2>/dev/null
    fi
    if [ -n "$OLD_PID_MAX" ]; then
        echo "$OLD_PID_MAX" >/proc/sys/kernel/pid_max
    fi
    if [ -n "$WORK" ] && [ -d "$WORK" ]; then
        [ -f "$WORK/dsec.log" ] && cp "$WORK/dsec.log" "$RESULTS/$BENCH_NAME.dsec.log"
        # Mount points of the data dir (layer mounts) are gone with dsec;
        # refuse to recurse into anything still mounted.
        if ! grep -q " $WORK" /proc/self/mountinfo; then
            rm -rf "$WORK"
        else
            bench_log "cleanup: $WORK still has mounts; left in place"
        fi
    fi
    exit "$rc"
}
