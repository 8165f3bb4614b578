//! The warm pool: network namespaces made ahead of time, each with its
//! loopback up and a veth to the host already addressed and routed, so
//! that creating a networked sandbox only has its agent join one (a
//! `setns` in the spawn helper's child).
//!
//! A namespace is made on a dedicated thread: `unshare(CLONE_NEWNET)` moves
//! only the calling thread, which then opens a netlink socket inside the
//! new namespace and sends one batch (lo up, the veth with its peer created
//! straight in the host's namespace, the address, link up, the default
//! route); back in the host's namespace a second batch addresses the host
//! side. The namespace lives as long as a descriptor of it does: the
//! pool's, then the sandbox's processes'. When it ends the kernel removes
//! both ends of the veth.
//!
//! Addressing: slot `s` is the /31 `subnet + 2s` (host side) and
//! `subnet + 2s + 1` (sandbox side); slot 0 is the resolver's.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};

use crate::config::NetConfig;
use crate::netlink::{link_index, Batch, Netlink};

/// How long the refill waits after a take while the pool is not empty.
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(20);

/// A namespace ready for a sandbox.
pub struct Warm {
    pub slot: u32,
    pub netns: OwnedFd,
}

struct Slots {
    next: u32,
    free: VecDeque<u32>,
    used: HashSet<u32>,
}

struct Inner {
    cfg: NetConfig,
    tag: String,
    host_ns: OwnedFd,
    warm: Mutex<VecDeque<Warm>>,
    wake: Condvar,
    slots: Mutex<Slots>,
    stop: Mutex<bool>,
}

#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

/// The name of the host side of slot `slot`'s veth.
pub fn host_link(tag: &str, slot: u32) -> String {
    format!("dsv{tag}{slot:x}")
}

impl Pool {
    /// `tag` (4 characters) keeps the link names of edges sharing a host
    /// apart. Starts the refill thread.
    pub fn start(cfg: NetConfig, tag: String) -> io::Result<Pool> {
        let host_ns = open_netns()?;
        let inner = Arc::new(Inner {
            cfg,
            tag,
            host_ns,
            warm: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            slots: Mutex::new(Slots { next: 1, free: VecDeque::new(), used: HashSet::new() }),
            stop: Mutex::new(false),
        });
        let pool = Pool { inner };
        if pool.inner.cfg.pool_size > 0 {
            let p = pool.clone();
            std::thread::Builder::new().name("dsec-netns-pool".into()).spawn(move || p.refill_loop())?;
        }
        Ok(pool)
    }

    /// Marks a slot as taken by a sandbox that survived an edge restart.
    pub fn claim(&self, slot: u32) {
        let mut s = self.inner.slots.lock().unwrap_or_else(|p| p.into_inner());
        s.used.insert(slot);
        s.free.retain(|x| *x != slot);
        if slot >= s.next {
            for x in s.next..slot {
                s.free.push_back(x);
            }
            s.next = slot + 1;
        }
    }

    /// Returns a slot once its sandbox is gone.
    pub fn release(&self, slot: u32) {
        let mut s = self.inner.slots.lock().unwrap_or_else(|p| p.into_inner());
        if s.used.remove(&slot) {
            s.free.push_back(slot);
        }
    }

    /// A ready namespace: from the pool, or made now (on a fresh thread)
    /// when the pool is empty.
    pub fn take(&self) -> io::Result<Warm> {
        let popped = self.inner.warm.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
        self.inner.wake.notify_one();
        if let Some(w) = popped {
            return Ok(w);
        }
        let p = self.clone();
        std::thread::spawn(move || p.make()).join().map_err(|_| io::Error::other("the namespace builder panicked"))?
    }

    pub fn ready(&self) -> usize {
        self.inner.warm.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Ends the refill thread and drops the warm namespaces.
    pub fn shutdown(&self) {
        *self.inner.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.inner.wake.notify_all();
        let drained: Vec<Warm> = self.inner.warm.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        for w in drained {
            self.release(w.slot);
        }
    }

    fn refill_loop(&self) {
        loop {
            {
                let mut warm = self.inner.warm.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if *self.inner.stop.lock().unwrap_or_else(|p| p.into_inner()) {
                        return;
                    }
                    if warm.len() < self.inner.cfg.pool_size {
                        break;
                    }
                    warm = self.inner.wake.wait(warm).unwrap_or_else(|p| p.into_inner());
                }
                // A take wakes us in the middle of a creation: while the
                // pool still has a namespace to give, let that creation
                // finish before competing with it for the CPU (making a
                // namespace and its veth costs about a millisecond).
                if !warm.is_empty() {
                    let _ = self.inner.wake.wait_timeout(warm, REFILL_DELAY);
                }
            }
            match self.make() {
                Ok(w) => {
                    if *self.inner.stop.lock().unwrap_or_else(|p| p.into_inner()) {
                        self.release(w.slot);
                        return;
                    }
                    self.inner.warm.lock().unwrap_or_else(|p| p.into_inner()).push_back(w);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "making a warm network namespace failed");
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
            }
        }
    }

    fn alloc_slot(&self) -> io::Result<u32> {
        let mut s = self.inner.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = match s.free.pop_front() {
            Some(x) => x,
            None if s.next <= self.inner.cfg.max_slots() => {
                s.next += 1;
                s.next - 1
            }
            None => return Err(io::Error::other(format!("the sandbox subnet {} is full", self.inner.cfg.subnet))),
        };
        s.used.insert(slot);
        Ok(slot)
    }

    /// Makes one namespace. Must run on a thread of its own (it moves the
    /// thread into the new namespace and back).
    fn make(&self) -> io::Result<Warm> {
        // A slot whose old veth the kernel has not removed yet answers
        // EEXIST: put it back at the end of the queue and try the next.
        for _ in 0..8 {
            let slot = self.alloc_slot()?;
            match self.make_in(slot) {
                Ok(netns) => return Ok(Warm { slot, netns }),
                Err(e) => {
                    self.release(slot);
                    if e.kind() != io::ErrorKind::AlreadyExists {
                        return Err(e);
                    }
                }
            }
        }
        Err(io::Error::other("no free veth slot (old links are still being removed)"))
    }

    /// Makes a namespace for a slot a sandbox already holds (its earlier
    /// namespace is gone), on a thread of its own. The old veth of the
    /// slot may still be on its way out (EEXIST): retried for a while.
    pub fn make_for(&self, slot: u32) -> io::Result<OwnedFd> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let p = self.clone();
            let made =
                std::thread::spawn(move || p.make_in(slot)).join().map_err(|_| io::Error::other("the namespace builder panicked"))?;
            match made {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                other => return other,
            }
        }
    }

    fn make_in(&self, slot: u32) -> io::Result<OwnedFd> {
        let (host_ip, sandbox_ip) = self.inner.cfg.slot_addrs(slot);
        let host_name = host_link(&self.inner.tag, slot);
        // SAFETY: unshare affects only this thread (CLONE_NEWNET).
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let inside = (|| -> io::Result<OwnedFd> {
            let ns = open_netns()?;
            // Sandboxes get IPv4 only: no IPv6 addresses (so no link-local
            // path to the host) on interfaces made from here on.
            std::fs::write("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1")?;
            let mut nl = Netlink::open()?;
            let mut b = Batch::new();
            b.link_up(1)
                .add_veth("eth0", 2, &host_name, self.inner.host_ns.as_raw_fd())
                .add_addr(2, sandbox_ip, 31)
                .link_up(2)
                .add_default_route(host_ip, 2);
            nl.exchange(b)?;
            Ok(ns)
        })();
        // Back to the host's namespace whatever happened; a thread that
        // cannot go back must not make anything else.
        // SAFETY: setns with a namespace descriptor we own.
        if unsafe { libc::setns(self.inner.host_ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            let e = io::Error::last_os_error();
            panic!("cannot return to the host's network namespace: {e}");
        }
        let ns = inside?;
        self.host_side(&host_name, host_ip)?;
        Ok(ns)
    }

    fn host_side(&self, name: &str, ip: Ipv4Addr) -> io::Result<()> {
        let conf = |family: &str, key: &str, v: &str| std::fs::write(format!("/proc/sys/net/{family}/conf/{name}/{key}"), v);
        conf("ipv6", "disable_ipv6", "1")?;
        // Strict reverse-path filter: a packet from this veth must carry
        // the sandbox's own address (no spoofing another sandbox).
        conf("ipv4", "rp_filter", "1")?;
        if self.inner.cfg.forward {
            conf("ipv4", "forwarding", "1")?;
        }
        let idx = link_index(name)?;
        let mut nl = Netlink::open()?;
        let mut b = Batch::new();
        b.add_addr(idx, ip, 31).link_up(idx);
        nl.exchange(b)
    }
}

/// The calling thread's network namespace.
fn open_netns() -> io::Result<OwnedFd> {
    // SAFETY: open(2) of a constant path; the fd is checked and owned.
    let fd = unsafe { libc::open(c"/proc/thread-self/ns/net".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
