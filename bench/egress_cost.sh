#!/usr/bin/env bash
# Issue 7 (egress): what a network of its own costs a sandbox, side by side
# in one run on one `dsec up` started with a network configuration:
#   - creation (create -> running, and -> first exec answered) and the exec
#     round trip of sandboxes without rules (own netns, loopback only) vs
#     with rules (a veth from the warm pool + the eBPF allowlist), alternated;
#   - TCP connection setup to a stand-in mirror (a server in a network
#     namespace this script makes) from inside a networked sandbox, through
#     the allowlist, vs the same sandbox after its eBPF programs are
#     detached (bpftool), vs a plain network namespace with the same kind of
#     veth and route (the host's python, no cgroup, no policy).
# Usage: bench/egress_cost.sh [ITERATIONS]   (default 100, ~1 min)
source "$(dirname "$0")/lib.sh"
ITER=${1:-100}
bench_init egress
bench_build

TAG=$$
MNS=dsec-bm-m$TAG      # the mirror's namespace
PNS=dsec-bm-p$TAG      # the "no policy" client's namespace
# Addresses of their own (198.18.11-13.x): the egress tests use
# 198.18.7-9.x, and both may run at once.
MIRROR=198.18.11.1
ROUTED=""
MPID=""
cleanup_net() {
    set +e
    if [ -n "$MPID" ]; then kill "$MPID" 2>/dev/null; wait "$MPID" 2>/dev/null; fi
    if [ -n "$ROUTED" ]; then ip route del 198.18.11.0/29 2>/dev/null; fi
    ip netns del "$MNS" 2>/dev/null
    ip netns del "$PNS" 2>/dev/null
    return 0
}
trap 'cleanup_net; bench_cleanup' EXIT

# The mirror: $MIRROR in its own namespace, routed from the host.
ip netns add "$MNS"
ip link add "bm$TAG" type veth peer name eth0 netns "$MNS"
ip addr add 198.18.12.1/30 dev "bm$TAG"; ip link set "bm$TAG" up
echo 1 >/proc/sys/net/ipv4/conf/"bm$TAG"/forwarding
ip -n "$MNS" addr add 198.18.12.2/30 dev eth0
ip -n "$MNS" addr add $MIRROR/32 dev lo
ip -n "$MNS" link set lo up; ip -n "$MNS" link set eth0 up
ip -n "$MNS" route add default via 198.18.12.1
ip route add 198.18.11.0/29 via 198.18.12.2; ROUTED=1
ip netns exec "$MNS" python3 -c '
import socketserver
class H(socketserver.BaseRequestHandler):
    def handle(self): pass
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    request_queue_size = 1024
S(("0.0.0.0", 8080), H).serve_forever()' &
MPID=$!

# The "no policy" client: a namespace with a veth and a default route to
# the host, like a sandbox's, without cgroup programs.
ip netns add "$PNS"
ip link add "bp$TAG" type veth peer name eth0 netns "$PNS"
ip addr add 198.18.13.1/31 dev "bp$TAG"; ip link set "bp$TAG" up
echo 1 >/proc/sys/net/ipv4/conf/"bp$TAG"/forwarding
ip -n "$PNS" addr add 198.18.13.0/31 dev eth0 2>/dev/null || ip -n "$PNS" addr add 198.18.13.0/31 dev eth0
ip -n "$PNS" link set lo up; ip -n "$PNS" link set eth0 up
ip -n "$PNS" route add default via 198.18.13.1
ip -n "$MNS" route add 198.18.13.0/31 via 198.18.12.1 2>/dev/null || true

cat >"$WORK/network.json" <<JSON
{"subnet": "10.252.0.0/16", "pool_size": 4, "forward": true, "dns_upstream": ["127.0.0.1:53"],
 "services": {"mirror": [{"cidr": "$MIRROR/32", "ports": "8080", "protocols": ["tcp"]}]}}
JSON
bench_start_dsec --network-config "$WORK/network.json"
"$PY" "$BENCH_DIR/egress_bench.py" "$RESULTS/egress_cost.json" "$ITER" "$MIRROR" "$PNS"
