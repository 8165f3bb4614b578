//! The guard a VM start (or restore) holds while it makes things: if it
//! returns early, with an error or because its future was dropped, the
//! guard undoes what was made so far, so no error path unwinds by hand.
//!
//! Undoing is in the reverse order of making: the QEMU first (SIGKILL and
//! reap, so nothing holds the files or the namespace any more), then the
//! latest cleanup it was given: a start's cgroup alone until its files
//! exist, then its backend's whole cleanup (cgroup, files, network); a
//! restore gives none (its sandbox's files stay, it stays suspended).

use std::os::fd::OwnedFd;

use dsec_agent_proto::client::AgentClient;

use crate::backends::container::spawn::{pidfd_kill, reap};
use crate::backends::instance::Instance;
use crate::backends::Durable;
use crate::cgroup::{CgroupLimits, Cgroups};
use crate::error::EdgeError;

/// What a start has made so far; undone on drop unless disarmed.
#[must_use = "dropping the guard undoes the start at once"]
pub(crate) struct Undo<'a> {
    /// The QEMU (pid, pidfd), once spawned.
    qemu: Option<(i32, OwnedFd)>,
    /// What removes the rest, run after the QEMU is gone.
    cleanup: Option<Box<dyn FnOnce() + Send + 'a>>,
}

impl<'a> Undo<'a> {
    /// A start's first steps, the same in both VM backends: sandbox `id`'s
    /// cgroup (`limits`), then its record made durable (no process may
    /// exist before). The guard returned removes the cgroup; on error it
    /// is gone already.
    pub async fn begin(cgroups: &'a Cgroups, id: &'a str, limits: &CgroupLimits, durable: Durable) -> Result<Self, EdgeError> {
        cgroups.create(id, limits)?;
        let undo = Self::new(move || {
            let _ = cgroups.remove(id);
        });
        durable.await?;
        Ok(undo)
    }

    /// A start that has made what `cleanup` removes.
    pub fn new(cleanup: impl FnOnce() + Send + 'a) -> Self {
        Self { qemu: None, cleanup: Some(Box::new(cleanup)) }
    }

    /// A restore: only its QEMU, once given, is undone.
    pub fn qemu_only() -> Self {
        Self { qemu: None, cleanup: None }
    }

    /// From now on `cleanup` removes what was made (it replaces the
    /// previous one, whose things it covers).
    pub fn then(&mut self, cleanup: impl FnOnce() + Send + 'a) {
        self.cleanup = Some(Box::new(cleanup));
    }

    /// QEMU `pid` (`pidfd`) runs for this start: it is killed and reaped
    /// first. Returns its pidfd, to watch it while the start goes on.
    pub fn spawned(&mut self, pid: i32, pidfd: OwnedFd) -> &OwnedFd {
        &self.qemu.insert((pid, pidfd)).1
    }

    /// The start succeeded without a QEMU of this guard's (another part
    /// of the start returned the sandbox's instance): nothing is undone.
    pub fn disarm(mut self) {
        self.cleanup = None;
        debug_assert!(self.qemu.is_none(), "a guard with a QEMU is disarmed by `ready`");
    }

    /// The start succeeded: its QEMU and `agent` are the sandbox's
    /// instance, and nothing is undone.
    pub fn ready(mut self, agent: AgentClient) -> Result<Instance, EdgeError> {
        self.cleanup = None;
        match self.qemu.take() {
            Some((pid, pidfd)) => Ok(Instance::new(pid, pidfd, agent)),
            None => Err(EdgeError::Invariant("a VM start that finished has a QEMU")),
        }
    }
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if let Some((_, pidfd)) = self.qemu.take() {
            let _ = pidfd_kill(&pidfd, libc::SIGKILL);
            reap(&pidfd);
        }
        if let Some(cleanup) = self.cleanup.take() {
            cleanup();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    #[test]
    fn a_dropped_guard_kills_and_reaps_its_qemu_before_the_cleanup() {
        let child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let pid = child.id() as i32;
        drop(child);
        let pidfd = crate::backends::container::spawn::pidfd_open(pid).unwrap();
        // SAFETY: signal 0 to a pid only asks whether it exists.
        let alive = move || unsafe { libc::kill(pid, 0) } == 0;
        let seen = Mutex::new(None);
        {
            let mut undo = Undo::new(|| *seen.lock().unwrap() = Some(("first", alive())));
            undo.then(|| *seen.lock().unwrap() = Some(("second", alive())));
            undo.spawned(pid, pidfd);
        }
        // Only the latest cleanup ran, once the process was gone (reaped:
        // not even a zombie is left).
        assert_eq!(*seen.lock().unwrap(), Some(("second", false)));
    }

    #[test]
    fn a_disarmed_guard_undoes_nothing() {
        let runs = AtomicUsize::new(0);
        Undo::new(|| {
            runs.fetch_add(1, Ordering::SeqCst);
        })
        .disarm();
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        drop(Undo::new(|| {
            runs.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
