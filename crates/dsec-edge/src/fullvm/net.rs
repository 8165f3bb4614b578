//! A full VM with network rules: the microVM's design (`microvm::net`) on
//! a q35 machine.
//!
//! The NIC is a virtio-net PCI device (the image's kernel has its driver
//! as a module, which udev loads when the device appears; the cloud
//! kernel has no e1000) whose backend is QEMU's user-mode network. QEMU
//! runs in the sandbox's warm network namespace and cgroup2 directory, so
//! every connection or datagram of the guest is a QEMU socket that the
//! sandbox's eBPF allowlist decides, as for a container or a microVM.
//!
//! A full VM boots its own disk with the kernel command line written on
//! it, so the addressing cannot come as `dsec.net=`: once the agent
//! answers, the edge writes a systemd-networkd unit (the image's own
//! network manager, part of systemd) with QEMU's fixed addresses, matched
//! by the NIC's MAC address (udev names PCI NICs by slot), points
//! /etc/resolv.conf at the edge's resolver and starts networkd. As for a
//! microVM nothing configured in the guest is trusted: a guest that
//! changes it only changes what it asks QEMU for. A suspended VM keeps
//! its configuration in its memory image; its QEMU is restored into the
//! same namespace and cgroup2 directory.

use dsec_agent_proto::client::AgentClient;
use dsec_agent_proto::{Command, ExecSpec, Op, Reply, Stdin};

use crate::error::EdgeError;
use crate::microvm::net::{write_guest_file, write_resolv_conf, NETDEV};

/// The NIC's MAC address (QEMU's own prefix), which the guest's unit
/// matches.
pub const GUEST_MAC: &str = "52:54:00:d5:ec:01";
/// Where the guest's network unit goes.
pub const UNIT_PATH: &str = "/etc/systemd/network/10-dsec.network";
/// How long the guest may take to bring the link up (networkd starts,
/// udev has long loaded the driver by the time the agent answers).
const ONLINE_TIMEOUT_S: u64 = 30;

/// The QEMU arguments of the NIC.
pub fn qemu_args() -> Vec<String> {
    let device = format!("virtio-net-pci,netdev=net0,mac={GUEST_MAC}");
    ["-netdev", NETDEV, "-device", &device].iter().map(|s| s.to_string()).collect()
}

/// The guest's networkd unit: QEMU's fixed addressing (the microVM's
/// `dsec.net=`), no IPv6, no DHCP.
pub fn network_unit() -> String {
    format!(
        "# Written by dsec: this VM's NIC (QEMU user-mode network under the sandbox's allowlist).\n\
         [Match]\nMACAddress={GUEST_MAC}\n\n\
         [Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\nDHCP=no\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n"
    )
}

/// Configures the guest's NIC and resolver through its agent, and waits
/// until the link is up.
pub async fn configure_guest(agent: &AgentClient, resolv_conf: String) -> Result<(), EdgeError> {
    write_guest_file(agent, UNIT_PATH, network_unit().as_bytes()).await?;
    write_resolv_conf(agent, resolv_conf).await?;
    let script = format!(
        "systemctl restart systemd-networkd.service && \
         /lib/systemd/systemd-networkd-wait-online --any --timeout={ONLINE_TIMEOUT_S}"
    );
    let spec = ExecSpec {
        command: Command::Shell(script),
        env: vec![],
        cwd: None,
        user: Some("root".into()),
        stdin: Stdin::Null,
        stream_output: false,
        timeout_ms: Some((ONLINE_TIMEOUT_S + 30) * 1000),
        kill_grace_ms: 1000,
        max_output_bytes: 8192,
        session: None,
    };
    match agent.call(Op::Exec(spec)).await? {
        Reply::Exited(r) if r.exit_code == Some(0) => Ok(()),
        Reply::Exited(r) => Err(EdgeError::SetupFailed(format!(
            "bringing up the VM's network (the image needs systemd-networkd) failed ({}): {}",
            r.exit_code.map_or_else(|| format!("signal {:?}", r.signal), |c| format!("exit {c}")),
            String::from_utf8_lossy(&r.stderr).trim()
        ))),
        other => Err(EdgeError::Internal(format!("unexpected reply to the network set-up: {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pci_nic_with_the_fixed_mac_the_unit_matches() {
        let a = qemu_args();
        assert_eq!(a[1], NETDEV);
        assert_eq!(a[3], format!("virtio-net-pci,netdev=net0,mac={GUEST_MAC}"));
        let unit = network_unit();
        assert!(unit.contains(&format!("MACAddress={GUEST_MAC}")) && unit.contains("Address=10.0.2.15/24"));
        assert!(unit.contains("Gateway=10.0.2.2") && unit.contains("IPv6AcceptRA=no"));
        // The microVM's addressing, which QEMU's user-mode network expects.
        assert!(crate::microvm::net::GUEST_APPEND.ends_with("10.0.2.15/24,10.0.2.2"));
    }
}
