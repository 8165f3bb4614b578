//! Handing one step of a call to the zygote's pre-forked worker and
//! waiting for its end.
//!
//! The worker gets one SOCK_SEQPACKET message, a marshalled tuple
//! `(scratch, argv, python, env, (time_ms, memory_bytes, file_bytes),
//! code)`, with the call's stdin, stdout and stderr memfds; it runs
//! `python` (a script path, in its warm interpreter: `code` is the
//! compiler's marshalled code object, or None to compile the file) or
//! execs `argv`. zygote.py's worker_main reads it.

use crate::error::{os, refused, RunnerError};
use std::collections::BTreeMap;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

use super::cleanup::{kill_all_of_call_user, Family};
use super::marshal::Marshal;
use super::outcome::{outcome, Outcome};
use super::report::Reports;
use super::sys::{memfd, write_all};
use super::zygote::Zygote;
use super::SCRATCH;

/// The largest message the worker receives (MAX_WORKER_MSG in zygote.py).
pub const MAX_WORKER_MSG: usize = 128 << 10;

/// What a step runs: a script in the warm interpreter, or a program.
pub enum Program<'a> {
    /// The script's path and its marshalled code (None: the worker
    /// compiles the file).
    Python {
        path: &'a str,
        code: Option<&'a [u8]>,
    },
    Exec {
        argv: Vec<String>,
    },
}

pub struct Step<'a> {
    pub program: Program<'a>,
    pub env: &'a BTreeMap<String, String>,
    pub time_ms: u64,
    pub memory_bytes: u64,
    /// RLIMIT_FSIZE; raised to one byte past output_bytes, the byte that
    /// proves an overflow.
    pub file_bytes: u64,
    pub output_bytes: u64,
}

/// The call's stdin (holding its input), stdout and stderr: memfds.
pub struct Stdio {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

impl Stdio {
    pub fn new(input: &[u8]) -> std::io::Result<Stdio> {
        Ok(Stdio { stdin: memfd("stdin", input)?, stdout: memfd("stdout", b"")?, stderr: memfd("stderr", b"")? })
    }
}

pub struct Finished {
    pub outcome: Outcome,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// The worker's message for `step`; a code object that does not fit is
/// left out (the worker then compiles the file).
pub fn message(step: &Step<'_>) -> Result<Vec<u8>, RunnerError> {
    let encode = |inline: bool| {
        let mut m = Marshal::default();
        m.tuple(6);
        m.str(SCRATCH);
        match &step.program {
            Program::Exec { argv } => {
                m.str_list(argv.iter().map(String::as_str));
                m.none();
            }
            Program::Python { path, .. } => {
                m.none();
                m.str(path);
            }
        }
        m.str_dict(step.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        m.tuple(3);
        m.int(step.time_ms);
        m.int(step.memory_bytes);
        m.int(step.file_bytes.max(step.output_bytes.saturating_add(1)));
        match &step.program {
            Program::Python { code: Some(code), .. } if inline => m.bytes(code),
            _ => m.none(),
        }
        m.out
    };
    let msg = encode(true);
    if msg.len() <= MAX_WORKER_MSG {
        return Ok(msg);
    }
    let msg = encode(false);
    if msg.len() > MAX_WORKER_MSG {
        return Err(refused(format!("the call's environment and arguments take {} bytes, more than {MAX_WORKER_MSG}", msg.len())));
    }
    Ok(msg)
}

/// How long a call that has not ended runs between two looks at the size
/// of its output: a program that ignores SIGXFSZ (a JVM, Node.js and Go's
/// runtime all do) goes on after its writes start failing, and would
/// otherwise burn its whole time limit. Most calls end long before the
/// first look.
const OUTPUT_CHECK_EVERY: Duration = Duration::from_millis(50);

/// How the wait for a worker's end ended.
#[derive(Debug, PartialEq)]
enum Wait {
    Ended,
    TimedOut,
    /// Its stdout or stderr grew past the output limit.
    OutputExceeded,
}

/// Runs one step in the pre-forked worker (`msg`, from `message`, with
/// `stdio`); the outputs stay in their memfds. Err means the runner is
/// broken (the zygote is gone, or we cannot act as the call user).
pub fn run(
    zygote: &mut Zygote,
    family: &Family,
    msg: &[u8],
    stdio: Stdio,
    time_ms: u64,
    output_bytes: u64,
) -> Result<Finished, RunnerError> {
    let Stdio { stdin, stdout, stderr } = stdio;
    let t0 = Instant::now();
    // The zygote forked the worker that receives this after the previous
    // call (or is about to: the message waits in the socket).
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    let fds = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()];
    if !anc.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(RunnerError::Sys {
            what: "handing the call to the worker".into(),
            source: std::io::Error::other("no room for the call's descriptors"),
        });
    }
    sendmsg(&zygote.cmd, &[IoSlice::new(msg)], &mut anc, SendFlags::NOSIGNAL).map_err(os("handing the call to the worker"))?;
    drop(stdin);
    let over = || [&stdout, &stderr].iter().any(|fd| rustix::fs::fstat(fd).is_ok_and(|st| st.st_size as u64 > output_bytes));
    let waited = wait_for_end(&zygote.reports, Duration::from_millis(time_ms), over)?;
    if waited != Wait::Ended {
        kill_all_of_call_user()?;
    }
    let end = zygote.reports.worker_end()?;
    let mut result = outcome(&end, waited == Wait::TimedOut, t0.elapsed());
    result.output_exceeded |= waited == Wait::OutputExceeded;
    let clean = family.only_helpers_left(end.strays) || family.kill_call_processes()?;
    if end.strays {
        // Killed now: the zygote may reap them and fork the next worker.
        write_all(zygote.ctl.as_fd(), b"r").map_err(os("the zygote is gone"))?;
    }
    result.unclean = !clean;
    Ok(Finished { outcome: result, stdout, stderr })
}

/// Waits until the zygote's next report can be read, at most `limit`,
/// looking every OUTPUT_CHECK_EVERY whether `over_output`.
fn wait_for_end(reports: &Reports, limit: Duration, over_output: impl Fn() -> bool) -> Result<Wait, RunnerError> {
    if reports.has_line() {
        return Ok(Wait::Ended);
    }
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // Rounded up: never wake before the limit.
        let ms = left.min(OUTPUT_CHECK_EVERY).as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let mut pfd = libc::pollfd { fd: reports.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, which lives across the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            return Ok(Wait::Ended);
        }
        if n == 0 {
            if over_output() {
                return Ok(Wait::OutputExceeded);
            }
            if Instant::now() >= deadline {
                return Ok(Wait::TimedOut);
            }
            continue;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(os("waiting for the worker")(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step<'a>(program: Program<'a>, env: &'a BTreeMap<String, String>) -> Step<'a> {
        Step { program, env, time_ms: 1000, memory_bytes: 0, file_bytes: 10, output_bytes: 100 }
    }

    #[test]
    fn python_steps_carry_their_code_until_it_is_too_big() {
        let env = BTreeMap::from([("A".to_string(), "1".to_string())]);
        let small = message(&step(Program::Python { path: "/x/main.py", code: Some(b"CODE") }, &env)).unwrap();
        assert!(small.ends_with(b"s\x04\x00\x00\x00CODE"));
        // file_bytes is raised to output_bytes + 1.
        assert!(small.windows(5).any(|w| w == b"i\x65\x00\x00\x00"));
        let big = vec![b'#'; MAX_WORKER_MSG];
        let m = message(&step(Program::Python { path: "/x/main.py", code: Some(&big) }, &env)).unwrap();
        assert!(m.len() < 1024 && m.ends_with(b"N"), "the worker compiles a big program from its file");
    }

    #[test]
    fn an_oversized_environment_is_refused() {
        let env = BTreeMap::from([("A".to_string(), "x".repeat(MAX_WORKER_MSG))]);
        let e = message(&step(Program::Exec { argv: vec!["/bin/true".into()] }, &env)).unwrap_err();
        assert!(e.to_string().contains("environment"), "{e}");
    }
}
