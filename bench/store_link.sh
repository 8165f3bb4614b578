# Sourced by benchmarks that need a shared store behind a real, shaped
# network link (not run on its own). Puts a directory behind an SFTP
# server (OpenSSH's sftp-server, handed each TCP connection by socat) in a
# network namespace of its own, reached from the host over a veth pair
# whose two ends are shaped with tc's token bucket (tbf) to RATE, and
# mounts it on the host with sshfs (FUSE). A POSIX shared store is then a
# directory of that mount, as it would be on a network filesystem.
#
# Why this stack: this kernel has neither NFS nor 9p nor CIFS built in,
# so a FUSE network filesystem is what reaches a remote directory (as a
# FUSE-mounted 3FS would); sshfs's `directport` talks SFTP straight over
# TCP, without ssh's cipher, so the link, not encryption, bounds it; and
# socat's `nofork` gives sftp-server the socket itself (no copy through a
# pipe). netem is not built into this kernel either: the link has its rate
# but no added latency (a veth's round trip is tens of microseconds).
#
#   store_link_up SERVED_DIR MOUNTPOINT RATE   e.g. ... 1gbit
#   store_link_probe FILE_UNDER_MOUNT          prints MB/s of one sequential read
#   store_link_down                            idempotent; safe after a failure
#
# Everything is named after this shell's pid, and store_link_down removes
# only what store_link_up made: the mount, the processes inside the
# namespace (all started here), the namespace and its veth pair.

STORE_LINK_NS=""
STORE_LINK_MNT=""
STORE_LINK_HOST_IF=""

store_link_up() {
    local served=$1 mnt=$2 rate=$3
    local id=$$ port=7022
    # A /30 inside 10.251.0.0/16 chosen from the pid, so two runs at once differ.
    local n=$((id % 16384))
    local net="10.251.$((n / 64)).$(((n % 64) * 4))"
    local server_ip="10.251.$((n / 64)).$(((n % 64) * 4 + 1))"
    local host_ip="10.251.$((n / 64)).$(((n % 64) * 4 + 2))"
    for tool in sshfs socat tc /usr/lib/openssh/sftp-server; do
        command -v "$tool" >/dev/null || { echo "store_link: $tool is missing (scripts/deps.sh installs it)" >&2; return 1; }
    done
    STORE_LINK_NS=dsecst$id
    STORE_LINK_HOST_IF=dsst${id}h
    local ns_if=dsst${id}n
    ip netns add "$STORE_LINK_NS"
    ip link add "$STORE_LINK_HOST_IF" type veth peer name "$ns_if"
    ip link set "$ns_if" netns "$STORE_LINK_NS"
    ip addr add "$host_ip/30" dev "$STORE_LINK_HOST_IF"
    ip link set "$STORE_LINK_HOST_IF" up
    ip -n "$STORE_LINK_NS" addr add "$server_ip/30" dev "$ns_if"
    ip -n "$STORE_LINK_NS" link set "$ns_if" up
    ip -n "$STORE_LINK_NS" link set lo up
    # Both directions at RATE; the burst is a few 64 KiB GSO packets, the
    # queue holds 20 ms at that rate.
    tc qdisc add dev "$STORE_LINK_HOST_IF" root tbf rate "$rate" burst 256kb latency 20ms
    tc -n "$STORE_LINK_NS" qdisc add dev "$ns_if" root tbf rate "$rate" burst 256kb latency 20ms
    ip netns exec "$STORE_LINK_NS" socat "TCP-LISTEN:$port,bind=$server_ip,reuseaddr,fork" \
        "EXEC:/usr/lib/openssh/sftp-server,nofork" 2>/dev/null &
    local up=""
    for _ in $(seq 1 50); do
        if ip netns exec "$STORE_LINK_NS" ss -Hltn "sport = :$port" | grep -q .; then up=1; break; fi
        sleep 0.1
    done
    [ -n "$up" ] || { echo "store_link: the SFTP listener did not come up" >&2; return 1; }
    mkdir -p "$mnt"
    sshfs -o "directport=$port" "$server_ip:$served" "$mnt"
    STORE_LINK_MNT=$mnt
    bench_log "store link: $served served from netns $STORE_LINK_NS ($net/30) over a veth shaped to $rate, mounted at $mnt"
}

store_link_probe() {
    local t0 t1 bytes
    bytes=$(stat -c %s "$1")
    t0=$(date +%s.%N)
    cat "$1" >/dev/null
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v n="$bytes" 'BEGIN { printf "%.0f\n", n / (b - a) / 1e6 }'
}

store_link_down() {
    set +e
    if [ -n "$STORE_LINK_MNT" ]; then
        fusermount3 -u "$STORE_LINK_MNT" 2>/dev/null || fusermount3 -uz "$STORE_LINK_MNT"
        STORE_LINK_MNT=""
    fi
    if [ -n "$STORE_LINK_NS" ]; then
        # Every process in the namespace was started by store_link_up
        # (the listener and the sftp-servers it handed connections to).
        local pid
        for pid in $(ip netns pids "$STORE_LINK_NS" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null; done
        for _ in $(seq 1 20); do
            [ -z "$(ip netns pids "$STORE_LINK_NS" 2>/dev/null)" ] && break
            sleep 0.1
        done
        for pid in $(ip netns pids "$STORE_LINK_NS" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
        ip netns del "$STORE_LINK_NS"
        STORE_LINK_NS=""
    fi
    if [ -n "$STORE_LINK_HOST_IF" ]; then
        # Gone with the namespace's end; deleted here only if that failed.
        ip link del "$STORE_LINK_HOST_IF" 2>/dev/null
        STORE_LINK_HOST_IF=""
    fi
}
