//! Starting the runner's Python helpers (the zygote, the compiler): a
//! fresh `python3 -I zygote.py --MODE FD...` each, forked from the monitor
//! (which is single-threaded and has not yet served a call) and confined
//! before its exec in what it must keep for life.

use std::ffi::CString;
use std::io;
use std::os::fd::AsFd;

use super::landlock;
use super::sys::write_all;

/// What a helper keeps across its exec: set in the forked child.
pub struct Confinement {
    /// The Landlock ruleset to enter (None: the kernel has no Landlock).
    pub ruleset: Option<i32>,
    /// The uid and gid to become (None: stay root).
    pub user: Option<(u32, u32)>,
    /// A descriptor to become the helper's stdin (the script, for a helper
    /// whose uid may not open it: the runner's own files are root's).
    pub stdin: Option<i32>,
}

/// Forks and execs `python -I script --mode FD...` with `keep` open in it
/// (`script` may be `-`: read from `confinement.stdin`); returns its pid.
pub fn python_helper(python: &str, script: &str, mode: &str, keep: &[i32], confinement: &Confinement) -> Result<i32, String> {
    let mut argv = vec![python.to_string(), "-I".into(), script.into(), format!("--{mode}")];
    argv.extend(keep.iter().map(|fd| fd.to_string()));
    let argv: Vec<CString> = argv.into_iter().map(|a| CString::new(a).map_err(|_| format!("a NUL in the {mode}'s command"))).collect::<Result<_, _>>()?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let monitor = rustix::process::getpid().as_raw_nonzero().get();
    // SAFETY: the monitor is single-threaded (it never starts a thread),
    // so the child may run any code; it only makes system calls and ends
    // in execv or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", io::Error::last_os_error()));
    }
    if pid == 0 {
        let err = child(monitor, keep, confinement, &argv_ptrs);
        let _ = write_all(io::stderr().as_fd(), format!("dsec-agent fncall-monitor: starting the {mode}: {err}\n").as_bytes());
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(127) };
    }
    Ok(pid)
}

/// In the forked child: keep the helper's descriptors across exec,
/// confine it, tie its life to the monitor's and exec. Returns only on
/// failure.
fn child(monitor: i32, keep: &[i32], confinement: &Confinement, argv: &[*const libc::c_char]) -> io::Error {
    if let Some(fd) = confinement.stdin {
        // SAFETY: dup2 between descriptors we hold (the copy is inheritable).
        if unsafe { libc::dup2(fd, 0) } < 0 {
            return io::Error::last_os_error();
        }
    }
    for fd in keep {
        // SAFETY: fcntl on a descriptor we hold.
        if unsafe { libc::fcntl(*fd, libc::F_SETFD, 0) } != 0 {
            return io::Error::last_os_error();
        }
    }
    if let Err(e) = confine(confinement) {
        return e;
    }
    // The helper must not outlive the monitor (kept across exec; set after
    // the uid change, which would clear it).
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) } != 0 {
        return io::Error::last_os_error();
    }
    // SAFETY: getppid cannot fail.
    if unsafe { libc::getppid() } != monitor {
        return io::Error::other("the monitor died before its helper started");
    }
    // SAFETY: argv is a NULL-terminated array of C strings that outlive
    // the call; execv returns only on failure.
    unsafe { libc::execv(argv[0], argv.as_ptr()) };
    io::Error::last_os_error()
}

/// The OOM killer's first choice, no core dumps, the uid change if any,
/// no_new_privs (a setuid program in the image cannot give privileges
/// back), then the Landlock domain.
fn confine(c: &Confinement) -> io::Result<()> {
    std::fs::write("/proc/self/oom_score_adj", b"1000")?;
    rustix::process::setrlimit(rustix::process::Resource::Core, rustix::process::Rlimit { current: Some(0), maximum: Some(0) })?;
    if let Some((uid, gid)) = c.user {
        // SAFETY: plain credential system calls on this (only) thread of
        // the child.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
    }
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if let Some(fd) = c.ruleset {
        landlock::restrict_self(fd)?;
    }
    Ok(())
}
