//! Loopback-only network namespaces made ahead of demand.
//!
//! A sandbox without network rules still gets a network namespace of its
//! own (loopback only). Making one costs about half a millisecond of
//! `copy_net_ns` inside the agent's clone, a fifth of a container's whole
//! creation. One thread of the edge makes them in advance instead, with `lo`
//! already up, and keeps a few ready; an agent is cloned without
//! CLONE_NEWNET and joins one (`setns`, microseconds). When a burst drains
//! the pool, creation falls back to CLONE_NEWNET: never slower than before.
//!
//! The namespaces are anonymous: only the pool's descriptors hold them, so
//! they vanish with the edge process, and a namespace handed out is held by
//! the agent alone from its `setns` on. Nothing can leak.

use std::os::fd::OwnedFd;

use crate::prewarm::Prewarm;

pub struct NetnsPool(Prewarm<OwnedFd>);

impl NetnsPool {
    /// Starts the filling thread. Fails only if the thread cannot start.
    pub fn start(size: usize) -> std::io::Result<NetnsPool> {
        // Each `unshare` moves only the filling thread into the new
        // namespace (network namespaces are per thread); it runs nothing
        // else. Closing a descriptor ends a namespace nobody joined.
        Prewarm::start("dsec-netns-pool", "network namespaces", size, make_one, drop).map(NetnsPool)
    }

    /// A ready namespace, if the pool has one.
    pub fn take(&self) -> Option<OwnedFd> {
        self.0.take()
    }

    #[cfg(test)]
    fn ready(&self) -> usize {
        self.0.ready()
    }
}

/// A fresh network namespace with `lo` up, as a descriptor.
fn make_one() -> std::io::Result<OwnedFd> {
    // SAFETY: unsharing only the network namespace changes no memory or
    // descriptor this process shares between threads (the reason the
    // general call is unsafe is CLONE_FILES/CLONE_FS); only this thread
    // moves, and it runs nothing but this pool.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET)? };
    let fd = rustix::fs::open("/proc/thread-self/ns/net", rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())?;
    set_loopback_up()?;
    Ok(fd)
}

/// `ip link set lo up` in the calling thread's network namespace.
fn set_loopback_up() -> std::io::Result<()> {
    loopback_flags(true).map(|_| ())
}

/// The flags of `lo` in the calling thread's network namespace, after
/// setting IFF_UP if `up`.
fn loopback_flags(up: bool) -> std::io::Result<libc::c_short> {
    use std::os::fd::AsRawFd;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    /// Namespaces come out distinct from ours and each other, with lo up,
    /// and the pool refills after a take.
    #[test]
    fn hands_out_fresh_namespaces_and_refills() {
        if !is_root() {
            eprintln!("skipped: needs root to make network namespaces");
            return;
        }
        let pool = NetnsPool::start(3).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while pool.ready() < 3 {
            assert!(std::time::Instant::now() < deadline, "the pool never filled");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let ours = std::fs::metadata("/proc/self/ns/net").unwrap();
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        let ino = |fd: &OwnedFd| rustix::fs::fstat(fd).unwrap().st_ino;
        use std::os::unix::fs::MetadataExt;
        assert_ne!(ino(&a), ours.ino());
        assert_ne!(ino(&a), ino(&b));
        // lo is up inside: join it from a scratch thread and look.
        let flags = std::thread::spawn(move || {
            rustix::thread::move_into_link_name_space(a.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network)).unwrap();
            loopback_flags(false).unwrap()
        })
        .join()
        .unwrap();
        assert_ne!(flags & libc::IFF_UP as libc::c_short, 0, "lo is up in a pooled namespace");
        while pool.ready() < 3 {
            assert!(std::time::Instant::now() < deadline, "the pool never refilled");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        drop(pool);
    }
}
