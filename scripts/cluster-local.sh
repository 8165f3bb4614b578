#!/usr/bin/env bash
# A real dsec cluster on one machine, for trying the cluster shape out and
# for tests (as root):
#
#   cluster-local.sh up [--edges N] [--dir DIR]   start it; print the
#                                                 DSEC_ENDPOINT, DSEC_TOKEN
#                                                 and DSEC_CA_CERT lines to
#                                                 export
#   cluster-local.sh down [--dir DIR]             stop it and remove all it made
#
# What runs: a PostgreSQL server (Debian's, through postgres-test.sh: trial
# data, fsync off), two `dsec apiserver` replicas on it, a `dsec watcher`,
# and N `dsec edge --join` processes (default 4), each in a network namespace
# of its own with its own address on a bridge this script makes. Every link
# is TLS under a cluster CA `dsec cluster init` makes in DIR/ca. DIR
# (default /var/lib/dsec/cluster-local) holds the CA, certificates, logs,
# process ids and each edge's data; `down` stops what `up` started (by the
# PIDs it recorded), deletes the namespaces and bridge, and removes DIR.
#
# DSEC_BIN (default target/release/dsec) and DSEC_IMAGES_DIR (default
# /var/lib/dsec/images, made by `dsec image setup`) say what to run;
# DSEC_CLUSTER_EDGE_FLAGS adds flags to every edge (`--no-fncall`, say).
set -Eeuo pipefail
cd "$(dirname "$0")/.."

cmd=${1:-}
shift || true
edges=4
dir=/var/lib/dsec/cluster-local
while [[ $# -gt 0 ]]; do
  case $1 in
    --edges) edges=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "error: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $cmd == up || $cmd == down ]] || { echo "usage: $0 up [--edges N] [--dir DIR] | down [--dir DIR]" >&2; exit 2; }
[[ $edges =~ ^[0-9]+$ && $edges -ge 1 && $edges -le 32 ]] || { echo "error: --edges must be 1-32" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "error: run as root (network namespaces, cgroups, mounts)" >&2; exit 1; }
bin=$(realpath "${DSEC_BIN:-target/release/dsec}")
images=${DSEC_IMAGES_DIR:-/var/lib/dsec/images}

# The state `down` reads: one `KEY VALUE` per line, appended as things are made.
state=$dir/state
record() { echo "$1 $2" >>"$state"; }
recorded() { [[ -f $state ]] && awk -v k="$1" '$1 == k { print $2 }' "$state"; }

# Ends a process this script started, if that PID is still a dsec process.
stop_pid() {
  local pid=$1
  [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' </proc/"$pid"/cmdline | grep -q dsec || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "warning: process $pid did not stop within 30 s; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
}

down() {
  [[ -f $state ]] || { echo "nothing to stop: no cluster at $dir"; return 0; }
  echo "==> stopping the edges (their sandboxes stop with them)"
  for pid in $(recorded edge-pid); do stop_pid "$pid" & done
  wait
  echo "==> stopping the apiservers and the watcher"
  for pid in $(recorded pid); do stop_pid "$pid"; done
  for pg in $(recorded postgres); do scripts/postgres-test.sh destroy "$pg"; done
  for ns in $(recorded netns); do ip netns del "$ns" 2>/dev/null || true; done
  for br in $(recorded bridge); do ip link del "$br" 2>/dev/null || true; done
  if grep -q " $(realpath "$dir")[/ ]" /proc/self/mounts; then
    echo "error: mounts remain under $dir; not removing it:" >&2
    grep " $(realpath "$dir")[/ ]" /proc/self/mounts >&2
    exit 1
  fi
  rm -rf "$dir"
  echo "==> the local cluster is down"
}

if [[ $cmd == down ]]; then
  down
  exit 0
fi

[[ -x $bin ]] || { echo "error: $bin is missing (scripts/build.sh builds it)" >&2; exit 1; }
[[ -d $images/containers || -d $images ]] || { echo "error: no images in $images (dsec image setup)" >&2; exit 1; }
if [[ -e $state ]]; then
  echo "error: a local cluster is up at $dir already (run: $0 down --dir $dir)" >&2
  exit 1
fi
mkdir -p "$dir"
dir=$(realpath "$dir")
# PostgreSQL runs as its own user, which must reach DIR/pg.
if ! runuser -u postgres -- test -x "$dir"; then
  echo "error: the postgres user cannot enter $dir (a mode-0700 parent?); choose another --dir" >&2
  rmdir "$dir" 2>/dev/null || true
  exit 1
fi
state=$dir/state
: >"$state"
# Whatever fails from here on, nothing is left behind. (Command
# substitutions inherit the trap: only the script's own shell cleans up.)
failed() {
  [[ $BASHPID == "$$" ]] || return 0
  trap - ERR
  echo "error: the cluster did not come up; removing what was made. The logs' last lines:" >&2
  tail -n 5 "$dir"/*.log >&2 2>/dev/null || true
  down
}
trap failed ERR

tag=$(head -c 2 /dev/urandom | od -An -tx1 | tr -d ' \n')
subnet=$((0x${tag:0:2} % 200 + 20))
bridge=dsl$tag
host_ip=10.215.$subnet.1
api_a=https://$host_ip:8443
api_b=https://$host_ip:8444
watcher=https://$host_ip:8490

echo "==> network: bridge $bridge on $host_ip/24, one namespace per edge"
ip link add "$bridge" type bridge
record bridge "$bridge"
ip addr add "$host_ip/24" dev "$bridge"
ip link set "$bridge" up
for i in $(seq 1 "$edges"); do
  ns=dsl$tag-e$i
  ip netns add "$ns"
  record netns "$ns"
  ip link add "dsl${tag}h$i" type veth peer name "dsl${tag}n$i"
  ip link set "dsl${tag}n$i" netns "$ns"
  ip link set "dsl${tag}h$i" master "$bridge"
  ip link set "dsl${tag}h$i" up
  ip -n "$ns" addr add "10.215.$subnet.$((10 + i))/24" dev "dsl${tag}n$i"
  ip -n "$ns" link set "dsl${tag}n$i" up
  ip -n "$ns" link set lo up
done

echo "==> PostgreSQL"
record postgres "$dir/pg"
pg=$(scripts/postgres-test.sh start "$dir/pg")
db=${pg%/*}/dsec
psql "$pg" -v ON_ERROR_STOP=1 -qc "CREATE DATABASE dsec" >/dev/null

echo "==> the cluster CA and certificates"
"$bin" cluster init --dir "$dir/ca" >/dev/null
ca=$dir/ca/ca.pem
"$bin" cluster cert --ca-dir "$dir/ca" --name apiserver --host "$host_ip" --out-dir "$dir/certs" >/dev/null
"$bin" cluster cert --ca-dir "$dir/ca" --name watcher --host "$host_ip" --out-dir "$dir/certs" >/dev/null
for i in $(seq 1 "$edges"); do
  "$bin" cluster cert --ca-dir "$dir/ca" --name "edge-$i" --host "10.215.$subnet.$((10 + i))" --out-dir "$dir/certs" >/dev/null
done

# start NAME KIND CMD...: runs CMD in a session of its own, logging to DIR/NAME.log.
start() {
  local name=$1 kind=$2
  shift 2
  setsid "$@" </dev/null >"$dir/$name.log" 2>&1 &
  record "$kind" $!
}
wait_up() {
  for _ in $(seq 1 600); do
    curl -sf --cacert "$ca" "$1/healthz" >/dev/null && return 0
    sleep 0.1
  done
  echo "error: $1 did not come up" >&2
  return 1
}
api_tls=(--tls-cert "$dir/certs/apiserver.pem" --tls-key "$dir/certs/apiserver-key.pem" --cluster-ca "$ca")

echo "==> apiserver replicas and the watcher"
# Replica A first: it makes the schema and the admin token.
start api-a pid "$bin" apiserver --data-dir "$dir/api-a" --database "$db" --listen "${api_a#https://}" \
  --watcher "$watcher" "${api_tls[@]}"
wait_up "$api_a"
start watcher pid "$bin" watcher --database "$db" --listen "${watcher#https://}" \
  --tls-cert "$dir/certs/watcher.pem" --tls-key "$dir/certs/watcher-key.pem" --cluster-ca "$ca"
wait_up "$watcher"
start api-b pid "$bin" apiserver --data-dir "$dir/api-b" --database "$db" --listen "${api_b#https://}" \
  --watcher "$watcher" "${api_tls[@]}"
wait_up "$api_b"
admin=$(cat "$dir/api-a/admin-token")
join_token=$(curl -sf --cacert "$ca" -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
  -d '{}' "$api_a/v1/cluster/join-tokens" | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')

echo "==> $edges edges joining"
for i in $(seq 1 "$edges"); do
  # nsenter enters the network namespace only: `ip netns exec` would also
  # remount /sys, hiding the host's cgroup hierarchy.
  start "edge-$i" edge-pid nsenter "--net=/run/netns/dsl$tag-e$i" "$bin" edge --data-dir "$dir/edge-$i" \
    --images-dir "$images" --node "edge-$i" --listen "10.215.$subnet.$((10 + i)):8081" \
    --cluster-secret-file "$dir/edge-$i.secret" --tls-cert "$dir/certs/edge-$i.pem" \
    --tls-key "$dir/certs/edge-$i-key.pem" --cluster-ca "$ca" --stop-sandboxes-on-exit \
    --join "$api_a" --join-token "$join_token" --label "edge=$i" ${DSEC_CLUSTER_EDGE_FLAGS:-}
done
ready=0
for _ in $(seq 1 1200); do
  ready=$(DSEC_ENDPOINT=$api_b DSEC_TOKEN=$admin DSEC_CA_CERT=$ca "$bin" node ls 2>/dev/null | grep -c ' ready ' || true)
  [[ $ready -ge $edges ]] && break
  sleep 0.1
done
if [[ $ready -lt $edges ]]; then
  echo "error: $ready of $edges edges are ready after 120 s" >&2
  false
fi
trap - ERR

DSEC_ENDPOINT=$api_a,$api_b DSEC_TOKEN=$admin DSEC_CA_CERT=$ca "$bin" node ls
cat <<EOF
==> the local cluster is up ($dir); to use it:
export DSEC_ENDPOINT=$api_a,$api_b
export DSEC_TOKEN=$admin
export DSEC_CA_CERT=$ca
# and to remove it: $0 down --dir $dir
EOF
