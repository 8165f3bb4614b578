//! clone(2) with fork semantics (no CLONE_VM, no new stack) into new
//! namespaces, for a single-threaded caller that wants its child to go on
//! running its own code instead of exec'ing.
//!
//! The spawn helper uses it to start agents without an `execve`: exec'ing
//! the static agent costs about 0.4 ms of CPU per sandbox here, most of it
//! glibc's start-up probing the CPU with `cpuid`, which traps to the
//! hypervisor (~8 us each on these VMs), plus the relocation of a
//! static-pie binary, whose dirtied pages every exec'd agent then holds
//! privately. A forked agent shares those pages with the helper instead.
//!
//! glibc's `fork()` cannot take namespace flags or CLONE_PARENT, so this is
//! the raw system call, and the child is a copy made behind glibc's back:
//! its thread descriptor still carries the parent's thread id (glibc uses
//! it for `raise`/`pthread_kill` of the calling thread, and for
//! error-checking and robust mutexes, none of which the agent uses), and no
//! `pthread_atfork` handlers ran. That is only sound if the caller is
//! single-threaded (no lock can be held by a thread that does not exist in
//! the child): [`clone_fork`] is unsafe for that reason, and
//! [`single_threaded`] lets a caller check it once.

use std::os::fd::{FromRawFd, OwnedFd};

/// What [`clone_fork`] returns: in the parent the child's pid and pidfd; in
/// the child nothing.
pub enum Forked {
    Parent { pid: i32, pidfd: OwnedFd },
    Child,
}

/// Clones the calling process with `flags` (namespaces, CLONE_PARENT...)
/// plus CLONE_PIDFD, with SIGCHLD as the exit signal.
///
/// # Safety
/// The calling process must be single-threaded (see [`single_threaded`]),
/// and the child must not rely on glibc's idea of its own thread id.
pub unsafe fn clone_fork(flags: libc::c_int) -> std::io::Result<Forked> {
    let mut pidfd: libc::c_int = -1;
    let flags = (flags | libc::CLONE_PIDFD) as libc::c_ulong | libc::SIGCHLD as libc::c_ulong;
    // SAFETY: the raw clone syscall on x86_64 takes (flags, newsp,
    // parent_tid, child_tid, tls). A null newsp gives fork semantics: the
    // child runs on a copy-on-write copy of this stack and returns here
    // with 0. CLONE_PIDFD stores the pidfd through parent_tid, which points
    // at a live local. The caller promises a single-threaded process, so
    // the child's copy of memory holds no lock another thread owns.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            std::ptr::null_mut::<libc::c_void>(),
            &mut pidfd as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_void>(),
            0usize,
        )
    };
    match ret {
        r if r < 0 => Err(std::io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => {
            // SAFETY: CLONE_PIDFD succeeded, so `pidfd` is a fresh fd we own.
            let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
            Ok(Forked::Parent { pid: pid as i32, pidfd })
        }
    }
}

/// Whether this process has exactly one thread (the precondition of
/// [`clone_fork`]).
pub fn single_threaded() -> std::io::Result<bool> {
    threads().map(|n| n == 1)
}

/// Threads of this process, from /proc/self/stat's 20th field.
fn threads() -> std::io::Result<usize> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // The command name (field 2) may contain spaces and parentheses: count
    // fields after its closing parenthesis.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    after
        .split_whitespace()
        .nth(17)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| std::io::Error::other("cannot read the thread count from /proc/self/stat"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_with_a_second_thread_is_not_single_threaded() {
        let t = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
        assert!(threads().unwrap() >= 2);
        assert!(!single_threaded().unwrap());
        t.join().unwrap();
    }
}
