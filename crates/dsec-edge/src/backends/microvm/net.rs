//! A microVM's NIC: a virtio-net device (virtio-mmio) on QEMU's user-mode
//! network, as `qemu::net` describes; the guest's addressing comes on the
//! kernel command line (`dsec.net=`).

use crate::backends::qemu::net::NETDEV;

/// The guest's fixed addressing, QEMU's user-mode defaults: the kernel
/// command line hands it to the guest agent (`dsec.net=`).
pub const GUEST_APPEND: &str = "dsec.net=10.0.2.15/24,10.0.2.2";

/// The QEMU arguments of the microVM's NIC (virtio-mmio).
pub fn qemu_args() -> Vec<String> {
    ["-netdev", NETDEV, "-device", "virtio-net-device,netdev=net0"].iter().map(|s| s.to_string()).collect()
}

/// QEMU's argv for `launch`, with the NIC and the guest's addressing if
/// `networked`.
pub fn with_nic(launch: &mut super::cmdline::VmLaunch<'_>, networked: bool) -> Vec<String> {
    if networked {
        launch.extra_append = GUEST_APPEND;
    }
    let mut args = super::cmdline::qemu_args(launch);
    if networked {
        args.extend(qemu_args());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nic_offers_no_service_beside_nat() {
        let a = qemu_args().join(" ");
        assert!(a.contains("ipv6=off") && a.contains("restrict=off"));
        for service in ["hostfwd", "guestfwd", "tftp", "smb", "bootfile"] {
            assert!(!a.contains(service), "{service} in {a}");
        }
        assert!(GUEST_APPEND.starts_with("dsec.net=10.0.2.15/24,"));
    }
}
