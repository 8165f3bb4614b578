//! One clone(2) + execve that is safe from a multi-threaded process.
//!
//! The edge is a multi-threaded tokio process, so the child of a plain fork
//! could deadlock on a lock another thread held (malloc, for one). Like
//! posix_spawn, we clone with CLONE_VM | CLONE_VFORK onto a small private
//! stack: the child shares our memory, runs only async-signal-safe syscalls
//! (dup2, sigprocmask, execve, _exit) and the calling thread is suspended
//! until the child has exec'd. That also avoids copying the page tables of an
//! edge holding thousands of sandboxes, which makes fork slower as N grows.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The fd on which the agent finds its channel (see dsec-agent).
pub const AGENT_CHANNEL_FD: RawFd = 3;

const CHILD_STACK_BYTES: usize = 64 * 1024;

/// Everything the child touches, prepared before clone so the child never
/// allocates.
struct ChildArgs {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    channel_fd: RawFd,
    /// A network namespace to join before execve, or -1 (the agent of a
    /// sandbox with network rules joins a pre-warmed one).
    netns_fd: RawFd,
    /// /dev/null, for the agent's stdin and stdout: it must not hold the
    /// edge's own stdout (a pipe, a terminal) open for its whole life.
    null_fd: RawFd,
    old_mask: libc::sigset_t,
    /// Written by the child if execve fails; read by the parent after the
    /// vfork-style clone returns (shared memory through CLONE_VM).
    exec_errno: libc::c_int,
}

extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points at the parent's ChildArgs, alive until this child
    // execs or exits because the parent is suspended by CLONE_VFORK. Only
    // async-signal-safe calls follow.
    unsafe {
        let a = &mut *(arg as *mut ChildArgs);
        // Both sources are above fd 3 (see high_fd), so no dup2 here
        // clobbers another's source.
        if libc::dup2(a.channel_fd, AGENT_CHANNEL_FD) < 0 {
            a.exec_errno = *libc::__errno_location();
            libc::_exit(127);
        }
        if a.netns_fd >= 0 && libc::setns(a.netns_fd, libc::CLONE_NEWNET) != 0 {
            a.exec_errno = *libc::__errno_location();
            libc::_exit(127);
        }
        libc::dup2(a.null_fd, 0);
        libc::dup2(a.null_fd, 1);
        libc::sigprocmask(libc::SIG_SETMASK, &a.old_mask, std::ptr::null_mut());
        libc::execve(a.path, a.argv, a.envp);
        a.exec_errno = *libc::__errno_location();
        libc::_exit(127)
    }
}

/// Starts `path` (as `argv0 args...`) with the extra clone `flags`
/// (namespaces, CLONE_PARENT), `channel` on its fd 3, /dev/null on 0 and 1,
/// the caller's stderr on 2, and an empty environment. Returns the child's
/// pid and a pidfd for it.
pub fn spawn(path: &CStr, argv0: &str, args: &[&str], flags: libc::c_int, channel: BorrowedFd<'_>) -> std::io::Result<(i32, OwnedFd)> {
    spawn_in(path, argv0, args, flags, channel, None)
}

/// [`spawn`], with the child joining the network namespace `netns` (instead
/// of making one: leave CLONE_NEWNET out of `flags`) before it execs.
pub fn spawn_in(
    path: &CStr,
    argv0: &str,
    args: &[&str],
    flags: libc::c_int,
    channel: BorrowedFd<'_>,
    netns: Option<BorrowedFd<'_>>,
) -> std::io::Result<(i32, OwnedFd)> {
    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?; // CLOEXEC
                                                                                      // The child dup2s onto 0, 1 and 3: its sources must not be among those
                                                                                      // numbers (a process started with stdin closed hands out fd 0).
    let theirs = high_fd(channel.try_clone_to_owned()?)?;
    let null = high_fd(null.into())?;

    let cstring = |s: &str| CString::new(s).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL));
    let argv_c: Vec<CString> = std::iter::once(argv0).chain(args.iter().copied()).map(cstring).collect::<Result<_, _>>()?;
    let mut argv: Vec<*const libc::c_char> = argv_c.iter().map(|c| c.as_ptr()).collect();
    argv.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];

    let mut stack = vec![0u8; CHILD_STACK_BYTES];
    // SAFETY: the stack grows down on x86_64; the top is 16-byte aligned as
    // the ABI wants.
    let stack_top = unsafe { stack.as_mut_ptr().add(CHILD_STACK_BYTES) };
    let stack_top = ((stack_top as usize) & !15) as *mut libc::c_void;

    let mut args_block = ChildArgs {
        path: path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        channel_fd: theirs.as_raw_fd(),
        netns_fd: netns.map_or(-1, |n| n.as_raw_fd()),
        null_fd: null.as_raw_fd(),
        // SAFETY: sigset_t is plain data; it is filled by pthread_sigmask.
        old_mask: unsafe { std::mem::zeroed() },
        exec_errno: 0,
    };

    // Block every signal so no handler of ours runs on the child's borrowed
    // stack between clone and execve; the child restores the mask itself.
    // SAFETY: plain libc calls on local, initialised sigset_t values.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut args_block.old_mask);
    }

    let mut pidfd: libc::c_int = -1;
    let flags = flags | libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;
    // SAFETY: child_main only uses `args_block`, the argv/envp arrays and the
    // stack, all of which outlive the child's use of them because CLONE_VFORK
    // suspends this thread until the child has exec'd or exited. With
    // CLONE_PIDFD the kernel stores the pidfd through the parent_tid pointer.
    let pid = unsafe {
        libc::clone(child_main, stack_top, flags, &mut args_block as *mut ChildArgs as *mut libc::c_void, &mut pidfd as *mut libc::c_int)
    };
    let clone_err = std::io::Error::last_os_error();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &args_block.old_mask, std::ptr::null_mut()) };
    drop(stack);

    if pid < 0 {
        return Err(clone_err);
    }
    // SAFETY: CLONE_PIDFD succeeded, so `pidfd` is a fresh fd we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop(theirs);
    if args_block.exec_errno != 0 {
        // The child has exited; reap it so no zombie is left.
        crate::reap(&pidfd);
        return Err(std::io::Error::from_raw_os_error(args_block.exec_errno));
    }
    Ok((pid, pidfd))
}

/// Moves `fd` to a number above the agent's fixed fds (CLOEXEC kept).
fn high_fd(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new fd we own, or -1.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if new < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `new` was just created by fcntl.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn passes_the_channel_on_fd_3() {
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let (_pid, pidfd) = spawn(c"/bin/sh", "sh", &["-c", "echo ready >&3"], 0, theirs.as_fd()).unwrap();
        drop(theirs);
        let mut buf = String::new();
        ours.read_to_string(&mut buf).unwrap();
        assert_eq!(buf, "ready\n");
        assert_eq!(crate::reap(&pidfd), Some(0));
    }

    #[test]
    fn a_missing_binary_is_an_error_not_a_zombie() {
        let (_ours, theirs) = UnixStream::pair().unwrap();
        let err = spawn(c"/nonexistent/agent", "agent", &[], 0, theirs.as_fd()).expect_err("spawn must fail");
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    }
}
