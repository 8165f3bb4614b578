//! A full VM with network rules: the design of `qemu::net` on a q35
//! machine.
//!
//! The NIC is a virtio-net PCI device (the image's kernel has its driver
//! as a module, which udev loads when the device appears; the cloud
//! kernel has no e1000) whose backend is QEMU's user-mode network. QEMU
//! runs in the sandbox's warm network namespace and cgroup2 directory, so
//! every connection or datagram of the guest is a QEMU socket that the
//! sandbox's eBPF allowlist decides, as for a container or a microVM.
//!
//! A full VM boots its own disk with the kernel command line written on
//! it, so the addressing cannot come as `dsec.net=`: the setup request
//! carries it instead (`VmSetup::nic`, QEMU's fixed addresses and the
//! NIC's MAC address, by which the agent finds the NIC whatever udev named
//! it), and the agent configures the NIC with the same three ioctls as a
//! microVM's; then the edge points /etc/resolv.conf at its resolver. No
//! network manager of the guest is involved (an image needs none; restarting
//! systemd-networkd for it took 7 s of a 54 s boot under TCG). As for a
//! microVM nothing configured in the guest is trusted: a guest that
//! changes it only changes what it asks QEMU for. A suspended VM keeps
//! its configuration in its memory image; its QEMU is restored into the
//! same namespace and cgroup2 directory.

use std::net::Ipv4Addr;

use dsec_agent_proto::VmNic;

use crate::backends::qemu::net::NETDEV;

/// The NIC's MAC address (QEMU's own prefix), by which the guest's agent
/// finds it.
pub const GUEST_MAC: &str = "52:54:00:d5:ec:01";

/// The QEMU arguments of the NIC.
pub fn qemu_args() -> Vec<String> {
    let device = format!("virtio-net-pci,netdev=net0,mac={GUEST_MAC}");
    ["-netdev", NETDEV, "-device", &device].iter().map(|s| s.to_string()).collect()
}

/// What the agent sets the NIC to: QEMU's user-mode network's fixed
/// addressing (the microVM's `dsec.net=`), no DHCP.
pub fn guest_nic() -> VmNic {
    VmNic { mac: GUEST_MAC.into(), address: Ipv4Addr::new(10, 0, 2, 15), prefix: 24, gateway: Ipv4Addr::new(10, 0, 2, 2) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pci_nic_with_the_fixed_mac_the_agent_looks_for() {
        let a = qemu_args();
        assert_eq!(a[1], NETDEV);
        assert_eq!(a[3], format!("virtio-net-pci,netdev=net0,mac={GUEST_MAC}"));
        let nic = guest_nic();
        assert_eq!(nic.mac, GUEST_MAC);
        // The microVM's addressing, which QEMU's user-mode network expects.
        let append = format!("dsec.net={}/{},{}", nic.address, nic.prefix, nic.gateway);
        assert_eq!(crate::backends::microvm::net::GUEST_APPEND, append);
    }
}
