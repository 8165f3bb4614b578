#!/usr/bin/env bash
# Benchmark 5: 10,000 create/destroy cycles (16 workers) leave nothing
# behind: processes, mounts, cgroups, namespaces, files under the data dir
# (databases excluded) and open fds of the dsec process, counted before and
# after (the generator prints the table); then once more after the platform
# has exited.
# Usage: bench/leaks.sh [CYCLES] [CONCURRENCY]   (default 10000 16, ~1 min)
source "$(dirname "$0")/lib.sh"
CYCLES=${1:-10000}
CONC=${2:-16}
bench_init leaks
bench_build
bench_wait_kernel_settled
"$BENCH" counts --data-dir "$WORK/data" --node "$NODE" >"$WORK/counts-before-up.json"
bench_start_dsec
"$BENCH" churn --dsec-pid "$DSEC_PID" --data-dir "$DATA_DIR" --node "$NODE" --cycles "$CYCLES" \
    --concurrency "$CONC" --exec --out "$RESULTS/leaks.json"
bench_stop_dsec >/dev/null
"$BENCH" counts --data-dir "$DATA_DIR" --node "$NODE" >"$WORK/counts-after-exit.json"
"$PY" - "$RESULTS/leaks.json" "$WORK/counts-before-up.json" "$WORK/counts-after-exit.json" "$NODE" <<'PYEOF'
import glob, json, sys
path, before, after, node = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), sys.argv[4]
d = json.load(open(path))
left = sorted(glob.glob(f"/sys/fs/cgroup/*/dsec/{node}"))
d["platform_exit"] = {"before_dsec_up": before, "after_dsec_exit": after, "node_cgroup_parents_left": left}
json.dump(d, open(path, "w"), indent=1)
print("\nbefore `dsec up` -> after it exited (host-wide)")
for k in ["processes_host", "agent_processes", "mounts_host", "mounts_data_dir", "cgroups_dsec", "cgroups_node", "net_namespaces", "mnt_namespaces", "data_dir_files"]:
    print(f"  {k:<16} {before[k]:>6} -> {after[k]:>6}")
if left:
    print(f"  note: the node's empty cgroup parents remain after exit: {len(left)} dirs (dsec/{node} in each hierarchy)")
PYEOF
