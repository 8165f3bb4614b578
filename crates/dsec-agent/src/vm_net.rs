//! A networked microVM's NIC, set up at boot when the kernel command line
//! carries `dsec.net=ADDR/LEN,GATEWAY` (the edge adds it only for a
//! sandbox created with network rules).
//!
//! The NIC is a virtio-net device whose other end is QEMU's user-mode
//! network inside the sandbox's host network namespace and cgroup: every
//! connection the guest makes becomes a socket QEMU opens on the host,
//! where the sandbox's eBPF allowlist decides it. Nothing configured here
//! is trusted: a guest that changes its address or routes only changes
//! what it asks QEMU for. The NIC's driver is loaded from the initramfs's
//! `net/` directory (other microVMs never load it); then, as three ioctls
//! would with `ip`: address, link up, default route. No DHCP client: the
//! addressing is QEMU's, fixed, and comes on the command line.
//!
//! A full VM's NIC gets the same three ioctls (`configure_nic`), its
//! addressing from the setup request and its name found by MAC address:
//! the guest's udev loads its driver and names it.

use std::net::Ipv4Addr;

use rustix::io::Errno;

use crate::setup_error::SetupError;

/// Where the initramfs keeps the NIC's modules.
const NET_MODULES_DIR: &str = "/lib/modules/dsec/net";
/// The interface the kernel names the first NIC (no udev renames it).
const NIC: &[u8] = b"eth0";
/// How long the NIC may take to appear once its driver is loaded.
const NIC_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The guest's side of a networked microVM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetPlan {
    pub addr: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
}

/// The plan on a kernel command line, if any.
pub fn plan_from_cmdline(cmdline: &str) -> Result<Option<NetPlan>, SetupError> {
    let Some(v) = cmdline.split_whitespace().find_map(|w| w.strip_prefix("dsec.net=")) else { return Ok(None) };
    let bad = || SetupError::new(format!("read dsec.net={v:?} (want ADDR/LEN,GATEWAY)"), Errno::INVAL);
    let (cidr, gw) = v.split_once(',').ok_or_else(bad)?;
    let (addr, len) = cidr.split_once('/').ok_or_else(bad)?;
    let prefix: u8 = len.parse().map_err(|_| bad())?;
    if prefix > 32 {
        return Err(bad());
    }
    Ok(Some(NetPlan { addr: addr.parse().map_err(|_| bad())?, prefix, gateway: gw.parse().map_err(|_| bad())? }))
}

/// Loads the NIC's driver and configures it, if the command line asks.
pub fn boot() -> Result<(), SetupError> {
    let cmdline = std::fs::read_to_string("/proc/cmdline").map_err(|e| SetupError::io("read /proc/cmdline", &e))?;
    let Some(plan) = plan_from_cmdline(&cmdline)? else { return Ok(()) };
    crate::vm_init::load_modules_from(NET_MODULES_DIR)?;
    let t0 = std::time::Instant::now();
    let s = Sock::open()?;
    loop {
        match s.configure(NIC, &plan) {
            Ok(()) => return Ok(()),
            // The driver binds the device as it registers; ENODEV only
            // while that is still under way.
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) && t0.elapsed() < NIC_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => return Err(SetupError::io(format!("configure eth0 ({}/{} via {})", plan.addr, plan.prefix, plan.gateway), &e)),
        }
    }
}

/// Configures a full VM's NIC, found by its MAC address, as `nic` says;
/// returns its name. The NIC appears once the guest's udev has loaded its
/// driver (seconds after boot under TCG, more on a loaded host; often in
/// the initramfs already), and udev renames it: it is configured once it
/// is renamed or udev is done with it (or after [`UDEV_WAIT`] without
/// either), so that the rename, which the kernel refuses for an interface
/// that is up, comes first.
pub fn configure_nic(nic: &dsec_agent_proto::VmNic) -> Result<String, SetupError> {
    let plan = NetPlan { addr: nic.address, prefix: nic.prefix, gateway: nic.gateway };
    if plan.prefix > 32 {
        return Err(SetupError::new(format!("read the prefix length /{}", plan.prefix), Errno::INVAL));
    }
    let deadline = std::time::Instant::now() + FULL_VM_NIC_WAIT;
    let mut first_seen = None;
    let s = Sock::open()?;
    loop {
        let found = nic_by_mac(&nic.mac).filter(|(name, index)| {
            let seen = *first_seen.get_or_insert_with(std::time::Instant::now);
            renamed(name) || udev_done_with(*index) || seen.elapsed() >= UDEV_WAIT
        });
        if let Some((name, _)) = found {
            match s.configure(name.as_bytes(), &plan) {
                Ok(()) => return Ok(name),
                // Renamed between the lookup and here: look again.
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {}
                Err(e) => return Err(SetupError::io(format!("configure {name} ({}/{} via {})", plan.addr, plan.prefix, plan.gateway), &e)),
            }
        }
        if std::time::Instant::now() >= deadline {
            return Err(SetupError::new(
                format!("wait {FULL_VM_NIC_WAIT:?} for a network interface with MAC address {}", nic.mac),
                Errno::NODEV,
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// How long a full VM's NIC may take to appear (its driver is a module the
/// guest's udev loads; several guests booting under TCG slow that down).
const FULL_VM_NIC_WAIT: std::time::Duration = std::time::Duration::from_secs(90);

/// How long a found NIC waits for udev to be done with it.
const UDEV_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The interface whose MAC address is `mac`, and its index.
fn nic_by_mac(mac: &str) -> Option<(String, u32)> {
    let read = |dir: &std::path::Path, f: &str| std::fs::read_to_string(dir.join(f)).ok().map(|s| s.trim().to_string());
    std::fs::read_dir("/sys/class/net").ok()?.flatten().find_map(|e| {
        let dir = e.path();
        if !read(&dir, "address")?.eq_ignore_ascii_case(mac) {
            return None;
        }
        let index = read(&dir, "ifindex")?.parse().ok()?;
        Some((e.file_name().to_string_lossy().into_owned(), index))
    })
}

/// Whether interface `name` was renamed since the kernel named it
/// (`NET_NAME_RENAMED` in its `name_assign_type`): udev's rename is done,
/// even if the udev running now (the root's, after the initramfs's) has
/// not got to it yet.
fn renamed(name: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/net/{name}/name_assign_type")).is_ok_and(|t| t.trim() == "4")
}

/// Whether the guest's udev has handled interface `index` (it records each
/// device it is done with in its database); true where no udev runs.
fn udev_done_with(index: u32) -> bool {
    !std::path::Path::new("/run/udev/control").exists() || std::path::Path::new(&format!("/run/udev/data/n{index}")).exists()
}

/// The kernel's `struct rtentry` (linux/route.h) for SIOCADDRT; the libc
/// crate defines it only for some C libraries.
#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr,
    rt_gateway: libc::sockaddr,
    rt_genmask: libc::sockaddr,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_pad4: *mut libc::c_void,
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

/// An AF_INET datagram socket for the interface ioctls.
struct Sock(std::os::fd::OwnedFd);

fn sockaddr(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(ip.octets()) },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size; this is how the
    // kernel's interface ioctls take an IPv4 address.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn netmask(prefix: u8) -> Ipv4Addr {
    Ipv4Addr::from(if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix)) })
}

impl Sock {
    fn open() -> Result<Sock, SetupError> {
        use std::os::fd::FromRawFd;
        // SAFETY: socket(2); the result is checked and owned.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(SetupError::last_os("socket"));
        }
        // SAFETY: a fresh descriptor of ours.
        Ok(Sock(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    fn ioctl<T>(&self, req: libc::c_ulong, arg: &mut T) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: `arg` is the struct `req` takes (ifreq or rtentry),
        // valid for the call.
        if unsafe { libc::ioctl(self.0.as_raw_fd(), req, arg as *mut T) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// An ifreq naming interface `nic` (at most IFNAMSIZ - 1 bytes: longer
    /// names do not exist, so the kernel answers ENODEV).
    fn ifreq(nic: &[u8]) -> libc::ifreq {
        // SAFETY: ifreq is plain data; all zeroes is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (i, b) in nic.iter().take(libc::IFNAMSIZ - 1).enumerate() {
            ifr.ifr_name[i] = *b as libc::c_char;
        }
        ifr
    }

    fn configure(&self, nic: &[u8], p: &NetPlan) -> std::io::Result<()> {
        let mut ifr = Self::ifreq(nic);
        ifr.ifr_ifru.ifru_addr = sockaddr(p.addr);
        self.ioctl(libc::SIOCSIFADDR, &mut ifr)?;
        let mut ifr = Self::ifreq(nic);
        ifr.ifr_ifru.ifru_netmask = sockaddr(netmask(p.prefix));
        self.ioctl(libc::SIOCSIFNETMASK, &mut ifr)?;
        let mut ifr = Self::ifreq(nic);
        self.ioctl(libc::SIOCGIFFLAGS, &mut ifr)?;
        // SAFETY: the kernel filled the flags member of the union.
        unsafe { ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
        self.ioctl(libc::SIOCSIFFLAGS, &mut ifr)?;
        // SAFETY: RtEntry is plain data; all zeroes (null pointers
        // included) is a valid value.
        let mut rt: RtEntry = unsafe { std::mem::zeroed() };
        rt.rt_dst = sockaddr(Ipv4Addr::UNSPECIFIED);
        rt.rt_genmask = sockaddr(Ipv4Addr::UNSPECIFIED);
        rt.rt_gateway = sockaddr(p.gateway);
        rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
        match self.ioctl(libc::SIOCADDRT, &mut rt) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_comes_from_the_command_line() {
        assert_eq!(plan_from_cmdline("console=ttyS0 quiet").unwrap(), None);
        let p = plan_from_cmdline("console=ttyS0 dsec.net=10.0.2.15/24,10.0.2.2 quiet").unwrap().unwrap();
        assert_eq!(p, NetPlan { addr: Ipv4Addr::new(10, 0, 2, 15), prefix: 24, gateway: Ipv4Addr::new(10, 0, 2, 2) });
        for bad in ["dsec.net=10.0.2.15", "dsec.net=10.0.2.15/33,10.0.2.2", "dsec.net=x/24,10.0.2.2", "dsec.net=10.0.2.15/24"] {
            assert!(plan_from_cmdline(bad).is_err(), "{bad}");
        }
        assert_eq!(netmask(24), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(netmask(0), Ipv4Addr::UNSPECIFIED);
    }

    #[test]
    fn a_nic_is_found_by_its_mac_address_and_a_bad_prefix_refused() {
        // The loopback interface's address is all zeroes (any case matches).
        let (name, index) = nic_by_mac("00:00:00:00:00:00").expect("an interface with a zero MAC address (lo)");
        let sys = std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex")).unwrap();
        assert_eq!(sys.trim(), index.to_string());
        assert_eq!(nic_by_mac("52:54:00:D5:EC:FE"), None);
        let nic = dsec_agent_proto::VmNic {
            mac: "52:54:00:d5:ec:fe".into(),
            address: Ipv4Addr::new(10, 0, 2, 15),
            prefix: 33,
            gateway: Ipv4Addr::new(10, 0, 2, 2),
        };
        let e = configure_nic(&nic).unwrap_err();
        assert!(e.errno == Errno::INVAL && e.step.contains("prefix"), "{e}");
    }
}
