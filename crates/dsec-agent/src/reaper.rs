//! PID 1's duty: reap every child, including orphans re-parented to us.
//!
//! SIGCHLD is blocked and read from a signalfd; on each wake-up we call
//! waitpid(-1, WNOHANG) until nothing is left, hand the statuses of pids
//! somebody waits for to them, and drop the rest (orphans). Waiters register
//! right after the spawn, before the agent yields to the event loop, so no exit
//! can be reaped before its waiter exists.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::rc::Rc;

use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    fn from_wait(status: i32) -> Option<ExitStatus> {
        if libc::WIFEXITED(status) {
            Some(ExitStatus::Code(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(ExitStatus::Signal(libc::WTERMSIG(status)))
        } else {
            None
        }
    }
}

#[derive(Default)]
struct Slot {
    status: Cell<Option<ExitStatus>>,
    notify: Notify,
}

#[derive(Default)]
pub struct Reaper {
    waiters: RefCell<HashMap<i32, Rc<Slot>>>,
}

/// Waits for one child's exit; unregisters itself when dropped.
pub struct ExitWatch {
    pid: i32,
    slot: Rc<Slot>,
    reaper: Rc<Reaper>,
}

impl ExitWatch {
    /// Resolves once the child has exited (cancel-safe).
    pub async fn wait(&self) -> ExitStatus {
        loop {
            if let Some(s) = self.slot.status.get() {
                return s;
            }
            self.slot.notify.notified().await;
        }
    }
}

impl Drop for ExitWatch {
    fn drop(&mut self) {
        self.reaper.waiters.borrow_mut().remove(&self.pid);
    }
}

/// Blocks SIGCHLD in this (single) thread so it is only seen through the
/// signalfd. Must run before the runtime starts; children unblock it.
pub fn block_sigchld() {
    // SAFETY: plain sigset manipulation on a stack value.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

impl Reaper {
    pub fn watch(self: &Rc<Self>, pid: i32) -> ExitWatch {
        let slot = Rc::new(Slot::default());
        self.waiters.borrow_mut().insert(pid, slot.clone());
        ExitWatch { pid, slot, reaper: self.clone() }
    }

    /// Reaps everything that has exited so far.
    pub fn reap(&self) {
        loop {
            let mut status = 0;
            // SAFETY: waitpid with a valid out pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                // 0: children left but none exited; -1/ECHILD: no children.
                return;
            }
            let Some(st) = ExitStatus::from_wait(status) else { continue };
            if let Some(slot) = self.waiters.borrow_mut().remove(&pid) {
                slot.status.set(Some(st));
                slot.notify.notify_one();
            }
        }
    }

    /// The reaping task: runs for the agent's lifetime.
    pub async fn run(self: Rc<Self>) -> std::io::Result<()> {
        let fd = signalfd()?;
        let fd = crate::aio::watch(fd)?;
        // Children may have exited before the signalfd existed.
        self.reap();
        let mut buf = [0u8; 128 * 8];
        loop {
            let mut guard = fd.readable().await?;
            // Drain the queued signal records; SIGCHLD coalesces, so one
            // record may stand for many exits: waitpid finds them all.
            loop {
                match guard.try_io(|fd| rustix::io::read(fd.get_ref(), &mut buf).map_err(std::io::Error::from)) {
                    Ok(Ok(n)) if n > 0 => continue,
                    _ => break,
                }
            }
            self.reap();
        }
    }
}

fn signalfd() -> std::io::Result<OwnedFd> {
    // SAFETY: signalfd on a stack sigset; the returned fd is owned by us.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        let fd = libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}
