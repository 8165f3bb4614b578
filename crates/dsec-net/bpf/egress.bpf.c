// SPDX-License-Identifier: GPL-2.0
// Per-sandbox egress allowlist, decided on the host (outside the guest).
//
// Attached to the cgroup2 directory of every sandbox that has network
// rules. Default deny: a destination is allowed only if the sandbox's
// entries in `rules` (an LPM trie keyed by cgroup id + IPv4 prefix) name
// its protocol and port, or it is the sandbox's own loopback, or the
// node's DNS resolver on port 53. The user-space side (src/bpf.rs) keeps
// the maps; these programs only read them.
//
// - connect4 / sendmsg4: TCP connects and UDP sends get EPERM, as a
//   firewall's REJECT would, and an event;
// - connect6 / sendmsg6: only ::1 (sandboxes have no IPv6 route);
//   v4-mapped addresses are checked like IPv4;
// - cgroup_skb egress: every IP packet a socket of the sandbox sends (raw
//   sockets, ICMP, and rules removed after a connection was made) is
//   checked again and dropped if not allowed.
//
// Built with Debian's clang (`-target bpf`) against libbpf-dev's headers
// by build.rs; loaded with aya.

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_RANGES 8

#define PROTO_TCP 1
#define PROTO_UDP 2
#define PROTO_ICMP 4

// Kinds of denial, mirrored in src/bpf.rs (DenyKind).
#define KIND_CONNECT4 1
#define KIND_SENDMSG4 2
#define KIND_CONNECT6 3
#define KIND_SENDMSG6 4
#define KIND_PACKET4 5
#define KIND_PACKET6 6

struct rule_key {
	__u32 prefixlen;   // 64 (the cgroup id) + the IPv4 prefix length
	__u32 cgid_hi;     // big-endian halves of the cgroup id
	__u32 cgid_lo;
	__u32 addr;        // network order
};

struct port_range {
	__u16 lo;
	__u16 hi;
	__u8 protos;       // PROTO_* bits
	__u8 pad[3];
};

struct rule_val {
	__u32 n;
	struct port_range r[MAX_RANGES];
};

struct sandbox_val {
	__u32 self_ip;     // the sandbox's address (network order)
	__u32 dns_ip;      // the node's resolver (network order)
};

struct deny_event {
	__u64 cgid;
	__u32 daddr[4];    // IPv4 in daddr[0], or IPv6
	__u32 pid;
	__u16 dport;       // host order
	__u8 proto;        // IPPROTO_*
	__u8 kind;         // KIND_*
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__type(key, struct rule_key);
	__type(value, struct rule_val);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct sandbox_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sandboxes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} denials SEC(".maps");

static __always_inline __u8 proto_bit(__u32 proto)
{
	if (proto == IPPROTO_TCP)
		return PROTO_TCP;
	if (proto == IPPROTO_UDP)
		return PROTO_UDP;
	if (proto == IPPROTO_ICMP)
		return PROTO_ICMP;
	return 0;
}

// Whether the sandbox `cgid` may send `proto` to daddr:dport (both in
// network order).
static __always_inline int allowed4(__u64 cgid, __u32 daddr, __u16 dport_host, __u32 proto)
{
	// The sandbox's own loopback (127.0.0.0/8).
	if ((bpf_ntohl(daddr) >> 24) == 127)
		return 1;
	struct sandbox_val *sb = bpf_map_lookup_elem(&sandboxes, &cgid);
	if (!sb)
		return 0;
	// The sandbox's own address (its traffic to itself stays on its lo).
	if (daddr == sb->self_ip)
		return 1;
	if (daddr == sb->dns_ip && dport_host == 53 && (proto == IPPROTO_UDP || proto == IPPROTO_TCP))
		return 1;
	__u8 bit = proto_bit(proto);
	if (!bit)
		return 0;
	struct rule_key key = {
		.prefixlen = 96,
		.cgid_hi = bpf_htonl((__u32)(cgid >> 32)),
		.cgid_lo = bpf_htonl((__u32)cgid),
		.addr = daddr,
	};
	struct rule_val *v = bpf_map_lookup_elem(&rules, &key);
	if (!v)
		return 0;
	__u32 n = v->n;
#pragma unroll
	for (int i = 0; i < MAX_RANGES; i++) {
		if (i >= n)
			break;
		if (!(v->r[i].protos & bit))
			continue;
		if (bit == PROTO_ICMP)
			return 1;
		if (dport_host >= v->r[i].lo && dport_host <= v->r[i].hi)
			return 1;
	}
	return 0;
}

static __always_inline void report(__u64 cgid, const __u32 *daddr, int v6, __u16 dport, __u8 proto, __u8 kind, __u32 pid)
{
	struct deny_event *e = bpf_ringbuf_reserve(&denials, sizeof(*e), 0);
	if (!e)
		return; // full: the reader is behind; the attempt is still refused
	e->cgid = cgid;
	e->daddr[0] = daddr[0];
	e->daddr[1] = v6 ? daddr[1] : 0;
	e->daddr[2] = v6 ? daddr[2] : 0;
	e->daddr[3] = v6 ? daddr[3] : 0;
	e->pid = pid;
	e->dport = dport;
	e->proto = proto;
	e->kind = kind;
	bpf_ringbuf_submit(e, 0);
}

static __always_inline int check_sock4(struct bpf_sock_addr *ctx, __u8 kind)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	__u32 daddr = ctx->user_ip4;
	__u16 dport = bpf_ntohs((__u16)ctx->user_port);
	__u32 proto = ctx->protocol;
	if (allowed4(cgid, daddr, dport, proto))
		return 1;
	__u32 a[4] = { daddr, 0, 0, 0 };
	report(cgid, a, 0, dport, (__u8)proto, kind, (__u32)(bpf_get_current_pid_tgid() >> 32));
	return 0;
}

static __always_inline int check_sock6(struct bpf_sock_addr *ctx, __u8 kind)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	__u32 a[4] = { ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3] };
	__u16 dport = bpf_ntohs((__u16)ctx->user_port);
	__u32 proto = ctx->protocol;
	// ::1
	if (a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] == bpf_htonl(1))
		return 1;
	// ::ffff:a.b.c.d is IPv4 underneath.
	if (a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0x0000ffff)) {
		if (allowed4(cgid, a[3], dport, proto))
			return 1;
	}
	report(cgid, a, 1, dport, (__u8)proto, kind, (__u32)(bpf_get_current_pid_tgid() >> 32));
	return 0;
}

// One program per hook (the attach type is in the section name).
#define SOCK_HOOK(section, name, check, kind)            \
	SEC(section) int name(struct bpf_sock_addr *ctx) \
	{                                                \
		return check(ctx, kind);                 \
	}

SOCK_HOOK("cgroup/connect4", dsec_connect4, check_sock4, KIND_CONNECT4)
SOCK_HOOK("cgroup/sendmsg4", dsec_sendmsg4, check_sock4, KIND_SENDMSG4)
SOCK_HOOK("cgroup/connect6", dsec_connect6, check_sock6, KIND_CONNECT6)
SOCK_HOOK("cgroup/sendmsg6", dsec_sendmsg6, check_sock6, KIND_SENDMSG6)

SEC("cgroup_skb/egress")
int dsec_egress(struct __sk_buff *skb)
{
	__u64 cgid = bpf_skb_cgroup_id(skb);
	__u8 first;
	if (bpf_skb_load_bytes(skb, 0, &first, 1) < 0)
		return 0;
	if ((first >> 4) == 6) {
		__u32 d[4];
		if (bpf_skb_load_bytes(skb, 24, d, sizeof(d)) < 0)
			return 0;
		if (d[0] == 0 && d[1] == 0 && d[2] == 0 && d[3] == bpf_htonl(1))
			return 1;
		// Kernel-made IPv6 control traffic is not socket-owned and never
		// reaches here; what does is a sandbox process: refused.
		report(cgid, d, 1, 0, 0, KIND_PACKET6, 0);
		return 0;
	}
	if ((first >> 4) != 4)
		return 0;
	struct iphdr ip;
	if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) < 0)
		return 0;
	__u16 dport = 0;
	__u16 frag = bpf_ntohs(ip.frag_off) & 0x1fff;
	if ((ip.protocol == IPPROTO_TCP || ip.protocol == IPPROTO_UDP) && frag == 0) {
		__u16 ports[2];
		if (bpf_skb_load_bytes(skb, ip.ihl * 4, ports, sizeof(ports)) < 0)
			return 0;
		dport = bpf_ntohs(ports[1]);
	}
	// A later fragment carries no ports: it is checked as port 0, so it
	// passes only where every port of its protocol is open.
	if (allowed4(cgid, ip.daddr, dport, ip.protocol))
		return 1;
	// TCP and UDP were refused (and reported) at connect/sendmsg already;
	// report only what those hooks cannot see (raw sockets, ICMP).
	if (frag == 0 && ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP) {
		__u32 a[4] = { ip.daddr, 0, 0, 0 };
		report(cgid, a, 0, dport, ip.protocol, KIND_PACKET4, 0);
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
