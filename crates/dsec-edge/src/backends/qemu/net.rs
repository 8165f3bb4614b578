//! A VM with network rules (microVM or full VM): the same per-sandbox
//! egress policy as a container, enforced outside the guest.
//!
//! The guest gets a virtio-net NIC whose backend is QEMU's user-mode
//! network (libslirp): every connection or datagram the guest sends
//! becomes a socket QEMU itself opens on the host. That QEMU runs in the
//! sandbox's own network namespace (a warm one from the pool, with its
//! veth) and in its cgroup2 directory, where the connect4/sendmsg4 and
//! packet eBPF programs check each of those sockets against the
//! sandbox's allowlist, exactly as they check a container's processes.
//! A refused connect becomes a refused connection in the guest (slirp
//! answers the guest's SYN with a reset) and an audit event.
//!
//! What slirp itself offers the guest, and why none of it bypasses the
//! policy:
//! - its gateway address (10.0.2.2) is the host's loopback *of QEMU's
//!   namespace*: the sandbox's own, where nothing listens (QEMU's
//!   sockets are Unix sockets);
//! - its DNS forwarder (10.0.2.3) sends queries to the nameserver of the
//!   host's resolv.conf through a QEMU socket, checked like any other
//!   (refused unless allowed); the guest is pointed at the edge's
//!   resolver instead, reached like from a container;
//! - DHCP answers only inside QEMU; TFTP, SMB and port forwards are not
//!   configured; IPv6 is off.
//!
//! vhost-net (a tap in the namespace) is not needed, and not available on
//! every host. The NIC device is each machine's (`microvm::net`,
//! `fullvm::net`).

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use crate::error::EdgeError;
use crate::model::SandboxSpec;

/// The NIC's backend, shared by both VM backends: user-mode network,
/// nothing offered but NAT (no IPv6, no TFTP/SMB, no forwards).
pub const NETDEV: &str = "user,id=net0,net=10.0.2.0/24,host=10.0.2.2,dns=10.0.2.3,ipv4=on,ipv6=off,restrict=off";

/// Where a networked VM's QEMU goes before it execs: the sandbox's network
/// namespace and its cgroup2 directory (the eBPF programs' key).
pub struct QemuNet {
    pub netns: OwnedFd,
    /// `cgroup.procs` of the sandbox's cgroup2 directory.
    pub procs: PathBuf,
}

/// Points the sandbox's resolver at the node's (the sandbox may change the
/// file; its allowlist decides what any resolver could reach).
pub(crate) async fn write_resolv_conf(agent: &dsec_agent_proto::client::AgentClient, conf: String) -> Result<(), EdgeError> {
    write_guest_file(agent, "/etc/resolv.conf", conf.as_bytes()).await
}

/// Writes `path` in the guest (root's, mode 0644, parents made) through
/// its agent.
async fn write_guest_file(agent: &dsec_agent_proto::client::AgentClient, path: &str, content: &[u8]) -> Result<(), EdgeError> {
    let spec = dsec_agent_proto::WriteFileSpec {
        path: path.into(),
        mode: 0o644,
        append: false,
        create_parents: true,
        max_bytes: 4096,
        owner: None,
    };
    let call = agent.open(dsec_agent_proto::Op::WriteFile(spec)).await?;
    call.send_data(content).await?;
    call.send_eof()?;
    let (_, reply) = call.collect().await?;
    match reply {
        Ok(dsec_agent_proto::Reply::Written { .. }) => Ok(()),
        Err(e) => Err(EdgeError::SetupFailed(format!("writing {path}: {}", e.message))),
        other => Err(EdgeError::SetupFailed(format!("unexpected reply writing {path}: {other:?}"))),
    }
}

/// The node's egress if VM `id` has a network (taken back from its
/// persisted state after an edge restart). Shared by both VM backends.
pub(crate) fn egress_of<'a>(egress: Option<&'a dsec_net::Egress>, id: &str) -> Option<&'a dsec_net::Egress> {
    let eg = egress?;
    (eg.is_networked(id) || eg.adopt(id).unwrap_or(false)).then_some(eg)
}

/// The namespace and cgroup2 directory a restored QEMU of VM `id` joins:
/// those of its boot. None for a VM without a network.
pub(crate) fn network_of(egress: Option<&dsec_net::Egress>, id: &str) -> Result<Option<QemuNet>, EdgeError> {
    match egress_of(egress, id) {
        None => Ok(None),
        Some(eg) => Ok(Some(QemuNet { netns: eg.netns_of(id)?, procs: eg.cgroup_procs(id) })),
    }
}

/// A warm namespace and the allowlist of sandbox `id`, ready for its QEMU
/// to join (nothing is left on error).
pub(crate) fn prepare_network(eg: &dsec_net::Egress, id: &str, spec: &SandboxSpec) -> Result<QemuNet, EdgeError> {
    let warm = eg.take()?;
    let procs = match eg.prepare(id, warm.slot, &spec.network_rules) {
        Ok(p) => p,
        Err(e) => {
            drop(warm.netns); // `prepare` released the slot
            return Err(e.into());
        }
    };
    Ok(QemuNet { netns: warm.netns, procs })
}

/// After an edge restart, the namespace of a networked VM's running QEMU
/// (`pid`): QEMU holds it; the edge keeps it too, for a later suspend.
pub(crate) fn keep_netns_of(eg: &dsec_net::Egress, id: &str, pid: i32) -> Result<(), EdgeError> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).map_err(EdgeError::sandbox_sys(id, "open the network namespace"))?;
    eg.keep_netns(id, ns.into());
    Ok(())
}
