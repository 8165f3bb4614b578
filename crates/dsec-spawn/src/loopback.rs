//! `ip link set lo up` without `ip`: the one interface of a fresh network
//! namespace, brought up by whoever makes the namespace (the agent after
//! its clone, or the edge's pool of namespaces made ahead).

use std::os::fd::AsRawFd;

/// Brings `lo` up in the calling thread's network namespace.
pub fn set_loopback_up() -> std::io::Result<()> {
    lo_flags(true).map(|_| ())
}

/// The flags of `lo` in the calling thread's network namespace.
pub fn loopback_flags() -> std::io::Result<libc::c_short> {
    lo_flags(false)
}

/// One socket and the ioctls: read the flags, and set IFF_UP if `up`.
fn lo_flags(up: bool) -> std::io::Result<libc::c_short> {
    let s = rustix::net::socket_with(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    // SAFETY: a zeroed ifreq of the right size, naming "lo", passed to
    // ioctls that read and write only that struct; `s` is an open socket.
    unsafe {
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            ifr.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if up {
            ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(ifr.ifr_ifru.ifru_flags)
    }
}
