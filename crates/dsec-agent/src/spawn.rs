//! Spawning one sandboxed command (clone + exec).
//!
//! Everything that allocates (argv, envp, the program path) is prepared
//! before the clone; the child then runs system calls only, no allocation
//! and no locks (it shares our memory until it execs). A failure before
//! exec is reported back through that shared memory, so a missing program
//! or a bad cwd is an error reply, not a mystery exit 127.
//!
//! We do not use std::process or tokio::process: PID 1 reaps every child
//! with waitpid(-1) (see reaper.rs), which would race their own waiting.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::io::Errno;

use crate::caps;
use crate::users::User;

/// Process-wide facts that decide what a child must undo or drop.
#[derive(Debug, Clone, Copy)]
pub struct ChildPolicy {
    /// The agent runs with oom_score_adj -1000; children go back to 0.
    pub reset_oom: bool,
    /// The agent is a real root: cut the children's capability bounding set.
    pub restrict_caps: bool,
    /// Signals the agent ignores, to be reset to their defaults in children
    /// (see signals.rs).
    pub ignored_signals: u64,
}

pub struct Command<'a> {
    /// Absolute path of the program (looked up beforehand).
    pub program: &'a CStr,
    pub argv: &'a [CString],
    pub envp: &'a [CString],
    /// Working directory, an O_PATH fd resolved inside the root.
    pub cwd: BorrowedFd<'a>,
    pub stdin: BorrowedFd<'a>,
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
    /// Passed as fd 3 (a session's state pipe); every other fd is closed.
    pub fd3: Option<BorrowedFd<'a>>,
    /// stdin is a PTY slave that becomes the controlling terminal.
    pub controlling_tty: bool,
    pub user: &'a User,
}

/// Which step in the child failed (sent back with the errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Fork,
    Setsid,
    Tty,
    Stdio,
    Fds,
    Oom,
    Caps,
    Groups,
    Gid,
    Uid,
    Chdir,
    Exec,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Fork => "clone",
            Step::Setsid => "setsid",
            Step::Tty => "acquire the controlling terminal",
            Step::Stdio => "set up stdin/stdout/stderr",
            Step::Fds => "close inherited fds",
            Step::Oom => "reset oom_score_adj",
            Step::Caps => "drop capabilities",
            Step::Groups => "setgroups",
            Step::Gid => "setgid",
            Step::Uid => "setuid",
            Step::Chdir => "chdir",
            Step::Exec => "exec",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{}: {errno}", step.name())]
pub struct SpawnError {
    pub step: Step,
    pub errno: Errno,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// What the child shares with the parent (CLONE_VM: same memory).
struct Shared<'a, 'b> {
    cmd: &'a Command<'b>,
    policy: ChildPolicy,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    groups: &'a [libc::gid_t],
    /// Set by the child if it fails before exec.
    failed: Option<(Step, i32)>,
}

/// Stack for the child between clone and exec: it only runs `child()`,
/// whose frames are small.
const CHILD_STACK: usize = 32 << 10;

extern "C" fn child_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `Shared`, alive and untouched while the
    // parent is suspended (CLONE_VFORK) until we exec or exit.
    let shared = unsafe { &mut *arg.cast::<Shared<'_, '_>>() };
    let failure = child(shared.cmd, shared.policy, shared.argv, shared.envp, shared.groups);
    shared.failed = Some(failure);
    // SAFETY: _exit(2) never returns and runs no atexit handlers (which
    // would run in the parent's memory).
    unsafe { libc::_exit(127) }
}

/// Starts `cmd` in its own session (so its pid is also its process group id)
/// and returns the pid. The caller registers the pid with the reaper before
/// it next yields to the event loop.
///
/// clone(CLONE_VM | CLONE_VFORK), as posix_spawn does: no page tables to
/// copy and no copy-on-write faults afterwards, and the parent sleeps until
/// the child has exec'd, so a failure is known (through shared memory) by
/// the time this returns.
pub fn spawn(cmd: &Command<'_>, policy: ChildPolicy) -> Result<i32, SpawnError> {
    let mut argv: Vec<*const libc::c_char> = cmd.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = cmd.envp.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());
    let groups: Vec<libc::gid_t> = cmd.user.groups.clone();
    let mut shared = Shared { cmd, policy, argv: &argv, envp: &envp, groups: &groups, failed: None };
    let mut stack = vec![0u8; CHILD_STACK];
    // SAFETY: the stack grows down from its 16-byte aligned top; the buffer
    // outlives the child's use of it (the parent is suspended until exec).
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(CHILD_STACK);
        let top = top.sub(top as usize % 16);
        libc::clone(
            child_entry,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut shared as *mut Shared<'_, '_>).cast(),
        )
    };
    drop(stack);
    if pid < 0 {
        return Err(SpawnError { step: Step::Fork, errno: Errno::from_raw_os_error(errno()) });
    }
    let Some((step, e)) = shared.failed else { return Ok(pid) };
    // The child failed before exec and has exited: collect it here so the
    // reaper never sees an unknown pid for it.
    let mut status = 0;
    // SAFETY: waitpid on our own child with a valid out pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    Err(SpawnError { step, errno: Errno::from_raw_os_error(e) })
}

/// The child side: returns only on failure, with the failing step.
fn child(
    cmd: &Command<'_>,
    policy: ChildPolicy,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    groups: &[libc::gid_t],
) -> (Step, i32) {
    // SAFETY: (the whole block) system calls on fds and pointers that the
    // parent prepared before the clone and keeps alive (it is suspended)
    // until we exec or exit.
    unsafe {
        // Default dispositions and an empty mask: the agent ignores SIGPIPE
        // (Rust's runtime does) and blocks SIGCHLD (for its signalfd); both
        // would otherwise leak into the command.
        crate::signals::reset_to_default(policy.ignored_signals);
        if libc::setsid() < 0 {
            return (Step::Setsid, errno());
        }
        if cmd.controlling_tty && libc::ioctl(cmd.stdin.as_raw_fd(), libc::TIOCSCTTY, 0) < 0 {
            return (Step::Tty, errno());
        }
        for (src, dst) in [(cmd.stdin.as_raw_fd(), 0), (cmd.stdout.as_raw_fd(), 1), (cmd.stderr.as_raw_fd(), 2)] {
            if libc::dup2(src, dst) < 0 {
                return (Step::Stdio, errno());
            }
        }
        let mut first_closed: RawFd = 3;
        if let Some(fd3) = cmd.fd3 {
            if libc::dup2(fd3.as_raw_fd(), 3) < 0 {
                return (Step::Fds, errno());
            }
            first_closed = 4;
        }
        // Nothing else reaches the command: not the channel, not the
        // re-attach fd 4, not other commands' pipes. (Marked CLOEXEC rather
        // than closed: the cwd fd is still needed, and an exec failure must
        // leave the fds as they were.)
        if libc::syscall(libc::SYS_close_range, first_closed as libc::c_uint, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) < 0 {
            return (Step::Fds, errno());
        }
        if policy.reset_oom {
            let path = c"/proc/self/oom_score_adj";
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return (Step::Oom, errno());
            }
            libc::close(fd);
        }
        if policy.restrict_caps {
            if let Err(e) = caps::restrict_in_child() {
                return (Step::Caps, e);
            }
        }
        libc::umask(0o022);
        // setgroups needs CAP_SETGID: skip it when we are not root and the
        // target is ourselves (a non-root plain-mode agent).
        let same_user = libc::getuid() == cmd.user.uid && libc::getgid() == cmd.user.gid;
        if !same_user || libc::getuid() == 0 {
            // Raw system calls: glibc's wrappers may try to broadcast the
            // change to other threads, which a vfork child must not do.
            if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) < 0 {
                return (Step::Groups, errno());
            }
            if libc::syscall(libc::SYS_setresgid, cmd.user.gid, cmd.user.gid, cmd.user.gid) < 0 {
                return (Step::Gid, errno());
            }
            if libc::syscall(libc::SYS_setresuid, cmd.user.uid, cmd.user.uid, cmd.user.uid) < 0 {
                return (Step::Uid, errno());
            }
        }
        // After the uid switch, so the user needs search permission.
        if libc::fchdir(cmd.cwd.as_raw_fd()) < 0 {
            return (Step::Chdir, errno());
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve(cmd.program.as_ptr(), argv.as_ptr(), envp.as_ptr());
        (Step::Exec, errno())
    }
}

/// Finds `name` in `path` (a PATH value) the way execvp would, among
/// executable regular files. Names containing `/` are taken as they are.
pub fn find_program(name: &str, path: &str) -> Option<CString> {
    if name.is_empty() {
        return None;
    }
    if name.contains('/') {
        return CString::new(name).ok();
    }
    for dir in path.split(':') {
        let dir = if dir.is_empty() { "." } else { dir };
        let Ok(candidate) = CString::new(format!("{dir}/{name}")) else { continue };
        if is_executable_file(&candidate) {
            return Some(candidate);
        }
    }
    None
}

fn is_executable_file(path: &CStr) -> bool {
    match rustix::fs::stat(path) {
        Ok(st) => {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
                && rustix::fs::access(path, rustix::fs::Access::EXEC_OK).is_ok()
        }
        Err(_) => false,
    }
}

/// Pipe ends for a child: the child's end blocking, ours non-blocking; both
/// CLOEXEC (the child gets its copy through dup2).
pub fn pipe() -> Result<(OwnedFd, OwnedFd), Errno> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_lookup_follows_path_order() {
        let sh = find_program("sh", "/nonexistent:/bin:/usr/bin").unwrap();
        assert!(sh.to_bytes().ends_with(b"/sh"));
        assert_eq!(find_program("/x/y", "").unwrap().to_bytes(), b"/x/y");
        assert!(find_program("definitely-not-a-program-dsec", "/bin:/usr/bin").is_none());
        assert!(find_program("", "/bin").is_none());
        // A directory named like a program is not a program.
        assert!(find_program("tmp", "/").is_none());
    }
}
