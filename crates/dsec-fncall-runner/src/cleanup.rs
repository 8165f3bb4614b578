//! Ending every process of a call. kill(-1, SIGKILL) with the call user's
//! real and effective uid signals every process whose real or saved uid
//! is the call user's, and nothing else; the kernel walks the process list
//! atomically, so a fork bomb cannot outrun it.

use crate::error::{broken, os, RunnerError};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use super::sys::{as_call_user, children_list, read_small, read_to_end_at};
use super::CALL_UID;

/// How long the processes of a call may take to die before the runner is
/// reported unclean.
const DEATH_DEADLINE: Duration = Duration::from_secs(5);

/// kill(-1, SIGKILL) as the call user. Both the real and the effective uid
/// change (the kernel also matches on the sender's real uid).
pub fn kill_all_of_call_user() -> Result<(), RunnerError> {
    as_call_user(|| {
        // SAFETY: kill takes integers; ESRCH (none left) is fine.
        unsafe { libc::kill(-1, libc::SIGKILL) };
    })
    .map_err(os("becoming the call user to kill its processes"))
}

/// Whose child a process of ours is; what the cleanup must never reap.
pub struct Family {
    /// Our children (/proc/self/task/OUR_PID/children, the main thread's
    /// list: the monitor has one thread), opened once and read by pread.
    children: OwnedFd,
    pub zygote: i32,
    /// None in a runner without Python's warm path (the exec zygote's).
    pub compiler: Option<i32>,
}

impl Family {
    pub fn new(zygote: i32, compiler: Option<i32>) -> Result<Self, RunnerError> {
        Ok(Family { children: children_list()?, zygote, compiler })
    }

    /// Whether the call left no process at all (our only children are the
    /// zygote and the compiler), known from one small file
    /// and the zygote's report instead of a scan of /proc. Every process a
    /// call starts descends from its worker; when a process dies its
    /// children go to the nearest subreaper above it, which is us (the
    /// zygote is not one), so a process that outlived the worker is our
    /// child or a descendant of one. The only way to get another parent is
    /// clone(CLONE_PARENT), which makes a sibling of the caller: from the
    /// worker, a child of the zygote, so the zygote must have had no other
    /// child when it reaped the worker (`zygote_strays`, from its report;
    /// only such a stray could make another one later). Anything
    /// unexpected, or a file we cannot read, takes the full path (kill,
    /// scan, reap).
    pub fn only_helpers_left(&self, zygote_strays: bool) -> bool {
        if zygote_strays {
            return false;
        }
        match read_to_end_at(self.children.as_fd(), 0) {
            Ok(list) => match self.compiler {
                Some(compiler) => children_are(&list, &[self.zygote, compiler]),
                None => children_are(&list, &[self.zygote]),
            },
            Err(_) => false,
        }
    }

    /// SIGKILLs every process of the call user and returns once none is
    /// left (orphans come to us, a subreaper, and are reaped here): true,
    /// or false if one would not die in time. Err if the zygote died.
    pub fn kill_call_processes(&self) -> Result<bool, RunnerError> {
        kill_all_of_call_user()?;
        let deadline = Instant::now() + DEATH_DEADLINE;
        while Instant::now() < deadline {
            if !call_processes_left() {
                self.reap_orphans()?;
                return Ok(true);
            }
            let mut status = 0;
            // SAFETY: waitpid writes only `status`.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid < 0 {
                return Ok(true); // no child at all: nothing can be left
            }
            self.not_a_helper(pid)?;
            if pid == 0 {
                // Something still runs (or is dying): send again, wait a little.
                kill_all_of_call_user()?;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(false)
    }

    /// Reaps the calls' orphans that have ended (never the zygote).
    pub fn reap_orphans(&self) -> Result<(), RunnerError> {
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes only `status`.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                return Ok(());
            }
            self.not_a_helper(pid)?;
        }
    }

    /// Err if `pid`, just reaped, was the zygote or the compiler.
    fn not_a_helper(&self, pid: i32) -> Result<(), RunnerError> {
        match pid {
            p if p == self.zygote => Err(broken("the zygote died")),
            p if Some(p) == self.compiler => Err(broken("the compiler died")),
            _ => Ok(()),
        }
    }
}

/// Whether a /proc children list names exactly the processes `pids`.
fn children_are(list: &[u8], pids: &[i32]) -> bool {
    let mut listed: Vec<&[u8]> = list.split(|b| b.is_ascii_whitespace()).filter(|s| !s.is_empty()).collect();
    let mut want: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
    listed.sort_unstable();
    want.sort_unstable();
    listed.len() == want.len() && listed.iter().zip(&want).all(|(a, b)| *a == b.as_bytes())
}

/// Whether a live process of the call user still exists (in our pid
/// namespace). Zombies are dead: ours are reaped by our caller, the
/// zygote's by the zygote before its next fork. The worker the zygote
/// forks for the next call runs as root until it receives that call, so it
/// is never among them.
pub fn call_processes_left() -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else { return true };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { continue };
        let Ok(st) = rustix::fs::stat(format!("/proc/{pid}").as_str()) else { continue };
        if st.st_uid == CALL_UID && !is_zombie(pid) {
            return true;
        }
    }
    false
}

/// Whether /proc/PID/stat says the process has exited (Z or X). A process
/// already gone counts as exited.
fn is_zombie(pid: &str) -> bool {
    let Ok(st) = read_small(&format!("/proc/{pid}/stat")) else { return true };
    state_of_stat(&st).is_none_or(|s| s == b'Z' || s == b'X')
}

/// The state letter of a /proc/PID/stat line (after the command's `)`).
fn state_of_stat(stat: &[u8]) -> Option<u8> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    stat.get(close + 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_list_must_name_only_the_helpers() {
        assert!(children_are(b"42 7 ", &[7, 42]));
        assert!(!children_are(b"42 7 43 ", &[7, 42]));
        assert!(!children_are(b"42 ", &[7, 42]));
        assert!(!children_are(b"", &[7, 42]));
        assert!(!children_are(b"420 7 ", &[7, 42]));
    }

    #[test]
    fn the_state_follows_the_last_parenthesis() {
        assert_eq!(state_of_stat(b"12 (a) b) Z 1 2"), Some(b'Z'));
        assert_eq!(state_of_stat(b"12 (sh) S 1"), Some(b'S'));
        assert_eq!(state_of_stat(b"garbage"), None);
    }
}
