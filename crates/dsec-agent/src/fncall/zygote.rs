//! Starting the zygote: a fresh `python3 -I zygote.py --zygote CTL REP CMD`
//! (never a fork of a warm monitor: it then holds only its own modules and
//! the preloaded ones, so each of its forks copies less), confined before
//! its exec in what every call inherits.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use super::landlock;
use super::report::Reports;
use super::sys::{which, write_all};

/// Our ends of the zygote's descriptors, and what it said when ready.
pub struct Zygote {
    pub pid: i32,
    /// SOCK_SEQPACKET: one message (and the call's stdio) per call.
    pub cmd: OwnedFd,
    /// "Its strays are killed, reap them" (see Monitor::run_in_worker).
    pub ctl: OwnedFd,
    /// One line per worker that ended.
    pub reports: Reports,
    /// The preloaded modules it could import.
    pub loaded: Vec<String>,
}

/// Starts the zygote from `script` (zygote.py) and waits for its first
/// line (the modules it preloaded).
pub fn start(script: &str) -> Result<Zygote, String> {
    let python = which("python3").ok_or("the image has no python3")?;
    let (cmd_ours, cmd_theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| format!("socketpair: {e}"))?;
    let (ctl_theirs, ctl_ours) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    let (rep_ours, rep_theirs) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    let ruleset = landlock::ruleset().map_err(|e| e.to_string())?;
    let theirs = [ctl_theirs.as_raw_fd(), rep_theirs.as_raw_fd(), cmd_theirs.as_raw_fd()];
    let mut argv = vec![python.clone(), "-I".into(), script.into(), "--zygote".into()];
    argv.extend(theirs.iter().map(|fd| fd.to_string()));
    let argv: Vec<CString> = argv.into_iter().map(|a| CString::new(a).map_err(|_| "a NUL in the zygote's path".to_string())).collect::<Result<_, _>>()?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let monitor = rustix::process::getpid();
    // SAFETY: the monitor is single-threaded (it never starts a thread),
    // so the child may run any code; it only makes system calls and ends
    // in execv or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", io::Error::last_os_error()));
    }
    if pid == 0 {
        let ruleset = ruleset.as_ref().map(|r| r.as_raw_fd());
        let err = child(monitor.as_raw_nonzero().get(), &theirs, ruleset, &argv_ptrs);
        let _ = write_all(io::stderr().as_fd(), format!("dsec-agent fncall-monitor: starting the zygote: {err}\n").as_bytes());
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(127) };
    }
    drop((ruleset, ctl_theirs, rep_theirs, cmd_theirs));
    let mut reports = Reports::new(rep_ours);
    let line = reports.line().map_err(|e| format!("the zygote did not start: {e}"))?;
    let loaded = line.split(',').filter(|m| !m.is_empty()).map(String::from).collect();
    Ok(Zygote { pid, cmd: cmd_ours, ctl: ctl_ours, reports, loaded })
}

/// In the forked child: keep the zygote's three descriptors across exec,
/// tie its life to the monitor's, confine it and exec. Returns only on
/// failure.
fn child(monitor: i32, keep: &[i32; 3], ruleset: Option<i32>, argv: &[*const libc::c_char]) -> io::Error {
    for fd in keep {
        // SAFETY: fcntl on a descriptor we hold.
        if unsafe { libc::fcntl(*fd, libc::F_SETFD, 0) } != 0 {
            return io::Error::last_os_error();
        }
    }
    // The zygote must not outlive the monitor (kept across exec).
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) } != 0 {
        return io::Error::last_os_error();
    }
    // SAFETY: getppid cannot fail.
    if unsafe { libc::getppid() } != monitor {
        return io::Error::other("the monitor died before the zygote started");
    }
    if let Err(e) = confine(ruleset) {
        return e;
    }
    // SAFETY: argv is a NULL-terminated array of C strings that outlive
    // the call; execv returns only on failure.
    unsafe { libc::execv(argv[0], argv.as_ptr()) };
    io::Error::last_os_error()
}

/// What the zygote and so every call inherits, set once and kept across
/// exec: the OOM killer's first choice, no core dumps, no_new_privs (a
/// setuid program in the image cannot give the call user privileges), and
/// the Landlock domain (LANDLOCK_WRITABLE). The zygote itself writes
/// nothing after it starts, so its domain is the calls' domain, entered
/// once here instead of by every worker.
fn confine(ruleset: Option<i32>) -> io::Result<()> {
    std::fs::write("/proc/self/oom_score_adj", b"1000")?;
    rustix::process::setrlimit(rustix::process::Resource::Core, rustix::process::Rlimit { current: Some(0), maximum: Some(0) })?;
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if let Some(fd) = ruleset {
        landlock::restrict_self(fd)?;
    }
    Ok(())
}
