//! The agent's process-wide state, shared (single-threaded, `Rc`) by every
//! request task.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::Duration;

use crate::envs::Env;
use crate::paths::Root;
use crate::pgroup::{group_alive, own_children, signal_group};
use crate::reaper::Reaper;
use crate::session_state::Sessions;
use crate::spawn::ChildPolicy;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// PID 1 of a container sandbox's namespaces.
    Container,
    /// The init of a microVM (PID 1 of the guest kernel).
    Vm,
    /// A service of a full VM's own operating system (its init is the
    /// guest's, e.g. systemd): the guest's root is the sandbox's.
    Guest,
    /// No namespaces of its own; file operations confined to a directory.
    Plain,
}

/// What the sandbox is: from SetupContainer, or defaults in plain mode.
pub struct Identity {
    pub sandbox_id: String,
    /// The image's default environment, working directory and user.
    pub image_env: Env,
    pub workdir: String,
    pub default_user: String,
}

pub struct Agent {
    pub mode: Mode,
    /// Changes once, in a microVM restored from a memory image
    /// (`vm_identity`).
    pub sandbox_id: RefCell<String>,
    pub root: Root,
    /// Plain mode: the root directory's path as the kernel reports cwds
    /// (to map a session's `$PWD` back to a sandbox path).
    pub root_path: Option<String>,
    pub image_env: Env,
    pub workdir: String,
    pub default_user: String,
    pub reaper: Rc<Reaper>,
    pub sessions: RefCell<Sessions>,
    /// Process groups of the commands we started that may still be alive
    /// (Shutdown in plain mode kills these; in container mode kill(-1) does).
    groups: RefCell<HashSet<i32>>,
    pub devnull: OwnedFd,
    pub policy: ChildPolicy,
    /// Refused attempts (blocked system calls) and tampering seen, for
    /// `Op::AuditEvents`.
    pub audit: Rc<RefCell<crate::audit::Ring>>,
    pub tamper: crate::tamper::Watch,
    /// Requests running (over every connection).
    active: Cell<usize>,
    idle: tokio::sync::Notify,
    /// Container mode: the overlay's upper directory (see `changes` and
    /// `tamper`).
    pub upper: std::cell::OnceCell<OwnedFd>,
    /// What the last walk of `upper` found new (see `changes`).
    pub changes_seen: RefCell<crate::changes::Seen>,
}

impl Agent {
    pub fn new(mode: Mode, id: Identity, root: Root, root_path: Option<String>, devnull: OwnedFd, policy: ChildPolicy) -> Rc<Agent> {
        Rc::new(Agent {
            mode,
            sandbox_id: RefCell::new(id.sandbox_id),
            root,
            root_path,
            image_env: id.image_env,
            workdir: id.workdir,
            default_user: id.default_user,
            reaper: Rc::new(Reaper::default()),
            sessions: RefCell::new(Sessions::default()),
            groups: RefCell::new(HashSet::new()),
            devnull,
            policy,
            audit: Rc::default(),
            tamper: crate::tamper::Watch::default(),
            active: Cell::new(0),
            idle: tokio::sync::Notify::new(),
            upper: std::cell::OnceCell::new(),
            changes_seen: RefCell::new(Default::default()),
        })
    }

    pub fn request_started(&self) {
        self.active.set(self.active.get() + 1);
    }

    pub fn request_finished(&self) {
        self.active.set(self.active.get().saturating_sub(1));
        if self.active.get() == 0 {
            self.idle.notify_one();
        }
    }

    /// Hands memory freed by finished requests back to the kernel once the
    /// agent has been idle for a moment: glibc only trims the top of the
    /// heap by itself, and an idle agent should cost as little as the day it
    /// started (thousands of them share a host).
    pub async fn trim_when_idle(self: Rc<Self>) {
        loop {
            self.idle.notified().await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            if self.active.get() == 0 {
                // SAFETY: malloc_trim only returns free heap pages.
                unsafe { libc::malloc_trim(0) };
            }
        }
    }

    /// Remembers a new process group; prunes empty ones now and then so the
    /// set stays small.
    pub fn track_group(&self, pgid: i32) {
        let mut g = self.groups.borrow_mut();
        if g.len() >= 256 {
            g.retain(|&p| group_alive(p));
        }
        g.insert(pgid);
    }

    /// SIGKILL to every process we know of.
    pub fn kill_everything(&self) {
        match self.mode {
            // As PID 1 of the namespace this reaches every process in it but
            // ourselves.
            Mode::Container | Mode::Vm => {
                // SAFETY: kill(2) with integer arguments.
                unsafe { libc::kill(-1, libc::SIGKILL) };
            }
            // Never kill(-1) outside our own pid namespace; in a full VM
            // it would also end the guest's own services.
            Mode::Plain | Mode::Guest => {
                for &pg in self.groups.borrow().iter() {
                    signal_group(pg, libc::SIGKILL);
                }
            }
        }
        self.groups.borrow_mut().clear();
    }

    /// Plain mode, on the way out: nothing we started may outlive us. Kills
    /// our process groups and every direct child (orphans adopted as a
    /// subreaper included), then reaps them for up to a second so none is
    /// left as a zombie of the host's init.
    pub fn kill_and_reap_all(&self) {
        self.kill_everything();
        for pid in own_children() {
            // SAFETY: kill(2) of our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        loop {
            let mut status = 0;
            // SAFETY: waitpid with a valid out pointer.
            match unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } {
                p if p > 0 => continue,
                0 if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                _ => return,
            }
        }
    }

    /// The shell commands run through: bash when the sandbox has it. It is
    /// the sandbox's own program (the platform's work is done by the agent's
    /// code, never by a program of the image), so a replaced shell affects
    /// only this sandbox's commands; the first use of a replaced one is
    /// recorded as an audit event.
    pub fn shell(&self) -> &'static str {
        let shell = if crate::spawn::find_program("/bin/bash", "").is_some_and(|p| is_exec(&p)) { "/bin/bash" } else { "/bin/sh" };
        self.tamper.check(self.upper.get(), shell, &self.audit);
        shell
    }
}

fn is_exec(p: &std::ffi::CStr) -> bool {
    rustix::fs::access(p, rustix::fs::Access::EXEC_OK).is_ok()
        && rustix::fs::stat(p).is_ok_and(|s| rustix::fs::FileType::from_raw_mode(s.st_mode) == rustix::fs::FileType::RegularFile)
}
