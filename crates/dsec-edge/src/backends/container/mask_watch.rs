//! Opens of a container's masked paths (/proc/kpagecgroup, /proc/acpi, ...)
//! become audit events.
//!
//! The agent hides masked files under one empty read-only file and masked
//! directories under one empty read-only directory, both on the sandbox's
//! own tmpfs, and parks an O_PATH descriptor of each at a well-known fd
//! (the agent's `reattach::MASK_FILE_FD` / `MASK_DIR_FD`). The edge takes
//! copies with pidfd_getfd and marks their inodes in one fanotify group for
//! the whole node: an open through any of the masks is an event on that
//! inode. One group per node, not one per sandbox, because the kernel
//! allows a user only 128 fanotify (and 128 inotify) groups by default.
//!
//! An event names the host pid, and carries an fd of the opened file:
//! its device (the sandbox's tmpfs) says which sandbox, its path in the
//! sandbox's mount namespace says which masked path.
//!
//! The marks ask for permission events (FAN_OPEN_PERM), not plain
//! notifications: the opener waits in its open(2) until the edge answers,
//! so it is still alive when its command name is read. A notification
//! arrives after the fact, and a short-lived `ls` or `cat` has often
//! exited by then, leaving the audit trail without a name. The edge
//! always allows (the mask already hides the content); it answers each
//! event right after reading it, and past a node-wide budget it answers
//! without describing, so a sandbox that loops on a masked path costs the
//! edge one read and one write per open. Closing the group (the edge
//! exits) makes the kernel allow whatever is pending.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use tokio::io::unix::AsyncFd;

use crate::backends::container::spawn;

/// Where the agent parks the masks (its `reattach::MASK_FILE_FD` and
/// `MASK_DIR_FD`).
const AGENT_MASK_FILE_FD: i32 = 6;
const AGENT_MASK_DIR_FD: i32 = 7;

/// Opens waiting for the forwarder; beyond that they are dropped (the
/// sandbox's ring would drop them anyway).
const QUEUE: usize = 1024;

/// Opens described per second, node-wide; past that they are allowed
/// without a record (the forwarder would fold them into a summary anyway).
const DESCRIBED_PER_SECOND: u32 = 2000;

/// One open of a masked path.
pub(crate) type MaskedOpen = crate::ops::audit_forward::Refused;

/// The node's fanotify group and which sandbox each watched tmpfs is.
pub struct MaskWatch {
    group: Arc<AsyncFd<OwnedFd>>,
    by_dev: Mutex<Watched>,
}

/// Which sandbox each watched tmpfs is, both ways: events name a device,
/// removals name a sandbox (and a node tearing down thousands must not
/// scan the whole map for each).
#[derive(Default)]
struct Watched {
    /// st_dev of a sandbox's tmpfs -> its id.
    sandbox: HashMap<u64, String>,
    /// Its id -> st_dev.
    dev: HashMap<String, u64>,
}

impl MaskWatch {
    /// Creates the group and starts reading it. None (logged) where the
    /// kernel or the edge's privileges do not allow fanotify: masks still
    /// hide, only their opens go unrecorded.
    pub(crate) fn start() -> Option<(Arc<MaskWatch>, tokio::sync::mpsc::Receiver<MaskedOpen>)> {
        // SAFETY: fanotify_init takes flags only and returns a new fd.
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK,
                (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_LARGEFILE) as libc::c_uint,
            )
        };
        if fd < 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "no fanotify: opens of masked paths will not be audited");
            return None;
        }
        // SAFETY: a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: `fd` is owned by the AsyncFd, which keeps it open for as
        // long as it is registered.
        let group = match unsafe { AsyncFd::register(fd) } {
            Ok(g) => Arc::new(g),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the fanotify group: opens of masked paths will not be audited");
                return None;
            }
        };
        let watch = Arc::new(MaskWatch { group, by_dev: Mutex::new(Watched::default()) });
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
        tokio::spawn(watch.clone().read_events(tx));
        Some((watch, rx))
    }

    /// Watches the masks of the sandbox whose agent is `pidfd`. Best
    /// effort: an agent without parked masks (or an old one) is not an
    /// error, only unwatched.
    pub(crate) fn watch(&self, id: &str, pidfd: &OwnedFd) {
        let mut dev = None;
        for (at, mask) in [(AGENT_MASK_FILE_FD, libc::FAN_OPEN_PERM), (AGENT_MASK_DIR_FD, libc::FAN_OPEN_PERM | libc::FAN_ONDIR)] {
            let Ok(fd) = spawn::pidfd_getfd(pidfd, at) else { continue };
            let Ok(st) = rustix::fs::fstat(&fd) else { continue };
            // Still the startup placeholder (an eventfd): nothing parked.
            use rustix::fs::FileType;
            if !matches!(FileType::from_raw_mode(st.st_mode), FileType::RegularFile | FileType::Directory) {
                continue;
            }
            // fanotify_mark cannot take an O_PATH fd itself; its magic link
            // leads to the same inode.
            let Ok(path) = std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())) else { continue };
            // SAFETY: a valid group fd and a NUL-terminated path.
            let r =
                unsafe { libc::fanotify_mark(self.group.get_ref().as_raw_fd(), libc::FAN_MARK_ADD, mask, libc::AT_FDCWD, path.as_ptr()) };
            if r == 0 {
                dev = Some(st.st_dev);
            } else {
                tracing::debug!(sandbox = id, error = %std::io::Error::last_os_error(), "cannot watch a mask");
            }
        }
        if let Some(dev) = dev {
            let mut w = crate::edge::lock(&self.by_dev);
            if let Some(old) = w.dev.insert(id.to_string(), dev) {
                if w.sandbox.get(&old).is_some_and(|v| v == id) {
                    w.sandbox.remove(&old);
                }
            }
            w.sandbox.insert(dev, id.to_string());
        }
    }

    /// Forgets a removed sandbox (its marks went with its tmpfs).
    pub(crate) fn forget(&self, id: &str) {
        let mut w = crate::edge::lock(&self.by_dev);
        if let Some(dev) = w.dev.remove(id) {
            // A device number is reused once its tmpfs is gone: drop the
            // entry only if it still names this sandbox.
            if w.sandbox.get(&dev).is_some_and(|v| v == id) {
                w.sandbox.remove(&dev);
            }
        }
    }

    async fn read_events(self: Arc<Self>, tx: tokio::sync::mpsc::Sender<MaskedOpen>) {
        let mut buf = vec![0u8; 16 << 10];
        let mut budget = Budget::new(DESCRIBED_PER_SECOND);
        loop {
            let mut guard = match self.group.readable().await {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(error = %e, "fanotify group failed; masked-path auditing stops");
                    return;
                }
            };
            let n = match guard.try_io(|fd| rustix::io::read(fd, &mut buf[..]).map_err(std::io::Error::from)) {
                Ok(Ok(n)) => n,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "reading the fanotify group failed; masked-path auditing stops");
                    return;
                }
                Err(_would_block) => continue,
            };
            for ev in parse(&buf[..n]) {
                // Describe first (the opener is parked until the answer),
                // then answer, then close the event's fd.
                let open = if budget.take() { self.describe(&ev) } else { None };
                self.allow(&ev);
                if let Some(open) = open {
                    // A full queue: the forwarder is behind; drop (the ring
                    // is bounded anyway).
                    let _ = tx.try_send(open);
                }
            }
        }
    }

    /// The sandbox, process and path of one event.
    fn describe(&self, ev: &RawEvent) -> Option<MaskedOpen> {
        let time_ms = crate::model::now_ms();
        let Some(fd) = &ev.fd else {
            tracing::warn!("fanotify queue overflowed: some opens of masked paths were not audited");
            return None;
        };
        let st = rustix::fs::fstat(fd).ok()?;
        let sandbox_id = crate::edge::lock(&self.by_dev).sandbox.get(&st.st_dev)?.clone();
        let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "a masked path".into());
        let (pid, comm) = inner_pid_and_comm(ev.pid);
        let what = if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory { "directory" } else { "file" };
        Some(MaskedOpen { sandbox_id, time_ms, pid, detail: format!("opened {path}, a masked {what} (by {comm}); it reads as empty") })
    }
}

impl MaskWatch {
    /// Lets the opener of a permission event go on. Every permission event
    /// must be answered, or its opener waits until the group is closed.
    fn allow(&self, ev: &RawEvent) {
        let Some(fd) = &ev.fd else { return };
        if ev.mask & libc::FAN_OPEN_PERM == 0 {
            return;
        }
        let answer = libc::fanotify_response { fd: fd.as_raw_fd(), response: libc::FAN_ALLOW };
        // SAFETY: viewing a plain C struct as its bytes, for as long as it lives.
        let bytes =
            unsafe { std::slice::from_raw_parts((&answer as *const libc::fanotify_response).cast::<u8>(), std::mem::size_of_val(&answer)) };
        if let Err(e) = rustix::io::write(self.group.get_ref(), bytes) {
            tracing::warn!(error = %e, "cannot answer a fanotify permission event");
        }
    }
}

/// A per-second allowance of described events.
struct Budget {
    per_second: u32,
    left: u32,
    window: std::time::Instant,
}

impl Budget {
    fn new(per_second: u32) -> Self {
        Budget { per_second, left: per_second, window: std::time::Instant::now() }
    }

    /// Whether one more event may be described in this second.
    fn take(&mut self) -> bool {
        if self.window.elapsed() >= std::time::Duration::from_secs(1) {
            self.window = std::time::Instant::now();
            self.left = self.per_second;
        }
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        true
    }
}

/// One event as read from the group.
struct RawEvent {
    /// None: the queue overflowed.
    fd: Option<OwnedFd>,
    pid: i32,
    mask: u64,
}

/// Splits a read of the group into its events, taking ownership of their
/// fds (every fd the kernel handed us is closed, whatever happens next).
fn parse(buf: &[u8]) -> Vec<RawEvent> {
    let mut out = Vec::new();
    let meta_len = std::mem::size_of::<libc::fanotify_event_metadata>();
    let mut at = 0;
    while at + meta_len <= buf.len() {
        // SAFETY: at least meta_len bytes remain; read_unaligned copes with
        // any alignment of the buffer.
        let m: libc::fanotify_event_metadata = unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
        let len = m.event_len as usize;
        if len < meta_len || at + len > buf.len() {
            break;
        }
        let fd = if m.fd >= 0 {
            // SAFETY: the kernel opened this fd for us in this read; we own
            // it and nobody else knows its number.
            Some(unsafe { OwnedFd::from_raw_fd(m.fd) })
        } else {
            None
        };
        if fd.is_some() || m.mask & libc::FAN_Q_OVERFLOW != 0 {
            out.push(RawEvent { fd, pid: m.pid, mask: m.mask });
        }
        at += len;
    }
    out
}

/// The process's pid inside its own pid namespace (the last `NSpid`
/// entry) and its command name; (0, "?") once it is gone.
fn inner_pid_and_comm(host_pid: i32) -> (u32, String) {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{host_pid}/status")) else { return (0, "?".into()) };
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let pid = field("NSpid:").and_then(|v| v.split_whitespace().last()).and_then(|p| p.parse().ok()).unwrap_or(0);
    let comm = field("Name:").unwrap_or("?").to_string();
    (pid, comm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_or_empty_buffer_yields_no_events() {
        assert!(parse(&[]).is_empty());
        assert!(parse(&[1, 2, 3]).is_empty());
        // A header that claims more bytes than were read.
        // SAFETY: all-zero bytes are a valid value of this plain C struct.
        let mut m: libc::fanotify_event_metadata = unsafe { std::mem::zeroed() };
        m.event_len = 4096;
        m.fd = -1;
        m.metadata_len = std::mem::size_of::<libc::fanotify_event_metadata>() as u16;
        // SAFETY: viewing a plain C struct as its bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts((&m as *const libc::fanotify_event_metadata).cast::<u8>(), m.metadata_len as usize) };
        assert!(parse(bytes).is_empty());
    }

    #[test]
    fn an_overflow_event_is_reported_without_an_fd() {
        // SAFETY: all-zero bytes are a valid value of this plain C struct.
        let mut m: libc::fanotify_event_metadata = unsafe { std::mem::zeroed() };
        m.event_len = std::mem::size_of::<libc::fanotify_event_metadata>() as u32;
        m.metadata_len = m.event_len as u16;
        m.fd = libc::FAN_NOFD;
        m.mask = libc::FAN_Q_OVERFLOW;
        // SAFETY: viewing a plain C struct as its bytes.
        let bytes = unsafe { std::slice::from_raw_parts((&m as *const libc::fanotify_event_metadata).cast::<u8>(), m.event_len as usize) };
        let evs = parse(bytes);
        assert_eq!(evs.len(), 1);
        assert!(evs[0].fd.is_none());
    }

    #[test]
    fn the_budget_refills_each_second() {
        let mut b = Budget::new(2);
        assert!(b.take() && b.take());
        assert!(!b.take(), "a third event in the same second is not described");
        b.window -= std::time::Duration::from_secs(1);
        assert!(b.take(), "a new second brings a new allowance");
    }

    #[test]
    fn the_inner_pid_comes_from_nspid() {
        let (pid, comm) = inner_pid_and_comm(std::process::id() as i32);
        assert_eq!(pid, std::process::id(), "outside any pid namespace of its own, the inner pid is the pid");
        assert!(!comm.is_empty() && comm != "?");
    }
}
