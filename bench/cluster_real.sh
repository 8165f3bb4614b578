#!/usr/bin/env bash
# The cluster's extra hop, real: a creation burst through two apiserver
# replicas (alternating, one client each) in front of EDGES edges, each in a
# network namespace of its own, TLS on every link (scripts/cluster-local.sh),
# side by side with the same burst against one `dsec up` on this machine
# (no hop, plain HTTP on loopback). Rounds alternate which goes first.
# Reports completion time, creation p50/p99 and the ratio cluster / dsec up.
# Usage: bench/cluster_real.sh [PER_EDGE] [EDGES] [CONCURRENCY] [ROUNDS]
#   (default 500 4 32 2)
source "$(dirname "$0")/lib.sh"
PER_EDGE=${1:-500}
EDGES=${2:-4}
CONC=${3:-32}
ROUNDS=${4:-2}
TOTAL=$((PER_EDGE * EDGES))
bench_init cluster_real
bench_build
chmod 755 "$WORK" # PostgreSQL's own user must reach the cluster's directory.
CLUSTER_DIR=$WORK/cluster
cluster_down() { [ -e "$CLUSTER_DIR/state" ] && "$REPO/scripts/cluster-local.sh" down --dir "$CLUSTER_DIR" >/dev/null || true; }
BENCH_CLEANUP_HOOK=cluster_down
# Tiny sandboxes, so that one node holds the whole burst too; no FnCall
# runners on either side.
SANDBOX=(--image busybox --memory-mb 16 --cpu 0.01 --disk-mb 16)

burst() { # burst OUT [dsec-bench flags...]
    local out=$1
    shift
    "$BENCH" throughput "$@" "${SANDBOX[@]}" --burst "$TOTAL" --cycles 0 --concurrency "$CONC" --out "$out" >&2
}

cluster_round() {
    bench_log "round $1: the cluster ($EDGES edges, two replicas, TLS)"
    DSEC_BIN=$DSEC DSEC_IMAGES_DIR=$IMAGES_DIR DSEC_CLUSTER_EDGE_FLAGS=--no-fncall \
        "$REPO/scripts/cluster-local.sh" up --edges "$EDGES" --dir "$CLUSTER_DIR" >"$WORK/up.log"
    local endpoint token ca
    endpoint=$(sed -n 's/^export DSEC_ENDPOINT=//p' "$WORK/up.log")
    token=$(sed -n 's/^export DSEC_TOKEN=//p' "$WORK/up.log")
    ca=$(sed -n 's/^export DSEC_CA_CERT=//p' "$WORK/up.log")
    burst "$RESULTS/cluster_real_cluster_$1.json" --endpoint "$endpoint" --token "$token" --ca-cert "$ca"
    "$REPO/scripts/cluster-local.sh" down --dir "$CLUSTER_DIR" >/dev/null
}

up_round() {
    bench_log "round $1: one dsec up"
    bench_start_dsec
    burst "$RESULTS/cluster_real_up_$1.json" --endpoint "$DSEC_ENDPOINT" --token "$DSEC_TOKEN"
    bench_stop_dsec >/dev/null
    DSEC_PID=""
}

for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then cluster_round "$r"; up_round "$r"; else up_round "$r"; cluster_round "$r"; fi
done

"$PY" - "$RESULTS" "$ROUNDS" "$TOTAL" "$EDGES" "$CONC" <<'PY' | tee "$RESULTS/cluster_real.txt"
import json, statistics, sys
results, rounds, total, edges, conc = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def load(side):
    out = []
    for r in range(1, rounds + 1):
        b = json.load(open(f"{results}/cluster_real_{side}_{r}.json"))["levels"][0]["dsec"]["burst"]
        out.append(b)
    return out
c, u = load("cluster"), load("up")
def med(rows, f):
    return statistics.median(f(x) for x in rows)
print(f"{total} busybox creations at concurrency {conc}: {edges} netns edges behind two TLS replicas vs one dsec up; median of {rounds} rounds")
print(f"{'figure':34} {'cluster':>10} {'dsec up':>10} {'ratio':>7}")
for name, f in [
    ("completion, s", lambda b: b["wall_s"]),
    ("creations/s", lambda b: b["rate_per_s"]),
    ("creation p50, ms", lambda b: b["latency_ms"]["p50_ms"]),
    ("creation p99, ms", lambda b: b["latency_ms"]["p99_ms"]),
]:
    a, b = med(c, f), med(u, f)
    print(f"{name:34} {a:10.2f} {b:10.2f} {a / b:6.2f}x")
errors = sum(x["errors"] for x in c + u)
print(f"errors: {errors}")
PY
