//! Starting the zygote: `python3 -s zygote.py --zygote CTL REP CMD`, a
//! fresh interpreter (never a fork of anything warm: it then holds only its
//! own modules and the preloaded ones, so each of its forks copies less),
//! or, in a runner whose language is not Python, this binary's
//! `fncall-exec-zygote CTL REP CMD` (exec_zygote.rs: the same contract
//! without the interpreter); root, in the Landlock domain of the calls
//! (LANDLOCK_WRITABLE): it writes nothing itself after it starts, so its
//! domain is the calls' domain, entered once here instead of by every
//! worker.

use crate::error::{broken, os, RunnerError};
use std::os::fd::{AsRawFd, OwnedFd};

use super::landlock::{self, LANDLOCK_WRITABLE};
use super::report::Reports;
use super::spawn::{helper, python_helper, Confinement, ZYGOTE_ENV};

/// Our ends of the zygote's descriptors, and what it said when ready.
pub struct Zygote {
    pub pid: i32,
    /// SOCK_SEQPACKET: one message (and the call's stdio) per call.
    pub cmd: OwnedFd,
    /// "Its strays are killed, reap them" (see worker::run).
    pub ctl: OwnedFd,
    /// One line per worker that ended.
    pub reports: Reports,
    /// The preloaded modules it could import.
    pub loaded: Vec<String>,
}

/// Starts the Python zygote from `script` (zygote.py) with `python` and
/// waits for its first line (the modules it preloaded).
pub fn start(python: &str, script: &str) -> Result<Zygote, RunnerError> {
    start_with(|keep, confinement| python_helper(python, script, "zygote", keep, confinement, ZYGOTE_ENV))
}

/// Starts the exec zygote (this binary, `fncall-exec-zygote`) and waits
/// for its first line (no modules).
pub fn start_exec() -> Result<Zygote, RunnerError> {
    let me = std::env::current_exe().map_err(os("finding the monitor's own binary"))?;
    start_with(|keep, confinement| {
        let mut argv = vec![me.to_string_lossy().into_owned(), crate::EXEC_ZYGOTE_MODE.into()];
        argv.extend(keep.iter().map(|fd| fd.to_string()));
        helper(argv, "exec zygote", keep, confinement, &[])
    })
}

/// The descriptors and confinement of a zygote, handed to `spawn`, which
/// starts it with them (in the order CTL REP CMD) and returns its pid.
fn start_with(spawn: impl FnOnce(&[i32], &Confinement) -> Result<i32, RunnerError>) -> Result<Zygote, RunnerError> {
    let (cmd_ours, cmd_theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(os("socketpair"))?;
    let (ctl_theirs, ctl_ours) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(os("pipe"))?;
    let (rep_ours, rep_theirs) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(os("pipe"))?;
    let ruleset = landlock::ruleset(&LANDLOCK_WRITABLE).map_err(os("confining the zygote"))?;
    let keep = [ctl_theirs.as_raw_fd(), rep_theirs.as_raw_fd(), cmd_theirs.as_raw_fd()];
    let confinement = Confinement { ruleset: ruleset.as_ref().map(|r| r.as_raw_fd()), user: None, stdin: None };
    let pid = spawn(&keep, &confinement)?;
    drop((ruleset, ctl_theirs, rep_theirs, cmd_theirs));
    let mut reports = Reports::new(rep_ours);
    let line = reports.line().map_err(|e| broken(format!("the zygote did not start: {e}")))?;
    let loaded = line.split(',').filter(|m| !m.is_empty()).map(String::from).collect();
    Ok(Zygote { pid, cmd: cmd_ours, ctl: ctl_ours, reports, loaded })
}
