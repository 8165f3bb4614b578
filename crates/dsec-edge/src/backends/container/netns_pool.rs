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

use crate::lifecycle::prewarm::Prewarm;

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
    let fd =
        rustix::fs::open("/proc/thread-self/ns/net", rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())?;
    dsec_spawn::set_loopback_up()?;
    Ok(fd)
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
            dsec_spawn::loopback_flags().unwrap()
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
