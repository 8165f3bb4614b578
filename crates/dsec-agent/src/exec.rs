//! Exec: run one command, pump its stdin/stdout/stderr, enforce the timeout
//! and the output cap, and report how it ended.
//!
//! The reply waits for the process to exit *and* its pipes to reach end of
//! file, so no output is lost; but a background child that inherited the
//! pipes must not hold the reply forever, so after the exit we wait at most
//! [`EOF_GRACE`] of silence (while the edge's credit allows reading).

use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::time::Duration;

use dsec_agent_proto::{AgentError, ExecResult, ExecSpec, Reply, Stdin, Stream, MAX_CHUNK_BYTES, MAX_FRAME_BYTES};
use tokio::time::Instant;

use crate::agent::Agent;
use crate::aio::{self, Fd};
use crate::envs;
use crate::errors::cancelled;
use crate::input::Input;
use crate::launch::{self, Launch};
use crate::pgroup::signal_group;
use crate::reaper::ExitStatus;
use crate::request::ReqCtx;

/// How long to keep reading after the command exited, when its pipes stay
/// open because a background process holds them.
pub const EOF_GRACE: Duration = Duration::from_millis(100);

/// A session's state report is a cwd and an `export -p`: far below this.
const STATE_MAX: usize = 1 << 20;

/// Buffered output travels in the reply frame: keep both streams in it.
const BUFFERED_CAP: u64 = (MAX_FRAME_BYTES as u64 / 2) - 4096;

/// A command outside any session (a session's is `session::exec`).
pub async fn exec(agent: &Rc<Agent>, ctx: &Rc<ReqCtx>, spec: ExecSpec) -> Result<Reply, AgentError> {
    envs::validate(&spec.env)?;
    let user = launch::user(agent, spec.user.as_deref())?;
    let mut env = envs::base(&agent.image_env, &user);
    envs::overlay(&mut env, &spec.env);
    let cwd = launch::cwd(agent, spec.cwd.as_deref().unwrap_or(&agent.workdir))?;
    let launch = launch::prepare(launch::argv(agent, &spec.command)?, &env, cwd, user)?;
    let done = run(agent, ctx, &spec, &launch, false).await?;
    Ok(Reply::Exited(done.result))
}

pub struct Finished {
    pub result: ExecResult,
    /// What the command wrote to fd 3, complete up to end of file (sessions).
    pub state: Option<Vec<u8>>,
}

/// One output stream: buffered into the reply or streamed as Data, with the
/// cap applied either way.
struct Sink {
    stream: Stream,
    streaming: bool,
    cap: u64,
    taken: u64,
    kept: Vec<u8>,
    truncated: bool,
}

impl Sink {
    fn new(stream: Stream, spec: &ExecSpec) -> Sink {
        let cap = if spec.stream_output { spec.max_output_bytes } else { spec.max_output_bytes.min(BUFFERED_CAP) };
        Sink { stream, streaming: spec.stream_output, cap, taken: 0, kept: Vec::new(), truncated: false }
    }

    fn full(&self) -> bool {
        self.taken >= self.cap
    }

    /// How much to read now: past the cap we read (and drop) freely; when
    /// streaming, no more than the edge's credit allows.
    fn read_size(&self, ctx: &ReqCtx) -> usize {
        if self.full() || !self.streaming {
            MAX_CHUNK_BYTES
        } else {
            ctx.sendable()
        }
    }

    fn accept(&mut self, ctx: &ReqCtx, data: &[u8]) {
        let room = (self.cap - self.taken.min(self.cap)) as usize;
        let n = room.min(data.len());
        if n > 0 {
            if self.streaming {
                ctx.send_data(self.stream, &data[..n]);
            } else {
                self.kept.extend_from_slice(&data[..n]);
            }
            self.taken += n as u64;
        }
        if n < data.len() {
            self.truncated = true;
        }
    }
}

/// Runs `launch` with the spec's stdin, output, timeout; with `state_pipe`
/// the command also gets a pipe at fd 3 whose content is returned.
pub async fn run(agent: &Rc<Agent>, ctx: &Rc<ReqCtx>, spec: &ExecSpec, launch: &Launch, state_pipe: bool) -> Result<Finished, AgentError> {
    let (out_r, out_w) = launch::pipe()?;
    let (err_r, err_w) = launch::pipe()?;
    let (stdin_child, stdin_ours, mut input): (Option<OwnedFd>, Option<OwnedFd>, Input) = match &spec.stdin {
        Stdin::Null => (None, None, Input::none()),
        Stdin::Bytes(b) => {
            let (r, w) = launch::pipe()?;
            (Some(r), Some(w), Input::bytes(b.clone()))
        }
        Stdin::Stream => {
            let (r, w) = launch::pipe()?;
            (Some(r), Some(w), Input::stream())
        }
    };
    let state = if state_pipe { Some(launch::pipe()?) } else { None };

    let stdin_fd = stdin_child.as_ref().map_or(agent.devnull.as_fd(), |f| f.as_fd());
    let started = Instant::now();
    let pid = launch.spawn(agent, stdin_fd, out_w.as_fd(), err_w.as_fd(), state.as_ref().map(|(_, w)| w.as_fd()), false)?;
    let watch = agent.reaper.watch(pid);
    // Our copies of the child's ends must go, or we would never see EOF.
    drop((out_w, err_w, stdin_child));
    let (state_r, state_w) = match state {
        Some((r, w)) => (Some(r), Some(w)),
        None => (None, None),
    };
    drop(state_w);
    if let Some(sid) = &spec.session {
        agent.sessions.borrow_mut().note_group(sid, pid);
    }

    let fds = (|| {
        Ok::<_, AgentError>((
            aio::register(out_r)?,
            aio::register(err_r)?,
            stdin_ours.map(aio::register).transpose()?,
            state_r.map(aio::register).transpose()?,
        ))
    })();
    let (out, err, stdin, state_fd) = match fds {
        Ok(f) => f,
        Err(e) => {
            // Without its pipes the command cannot be served: stop it.
            signal_group(pid, libc::SIGKILL);
            return Err(e);
        }
    };
    let (mut out, mut err, mut stdin, mut state_fd): (Option<Fd>, Option<Fd>, Option<Fd>, Option<Fd>) =
        (Some(out), Some(err), stdin, state_fd);
    let mut state_buf: Vec<u8> = Vec::new();
    let mut state_ok = state_fd.is_some();

    let mut sinks = [Sink::new(Stream::Stdout, spec), Sink::new(Stream::Stderr, spec)];
    let mut buf = vec![0u8; MAX_CHUNK_BYTES];

    let mut status: Option<ExitStatus> = None;
    let mut exited_at: Option<Instant> = None;
    let mut timed_out = false;
    // Deadlines beyond a year are as good as none (and an absurd timeout
    // from the edge must not overflow).
    let far = started + Duration::from_secs(86400 * 365);
    let mut term_at = spec.timeout_ms.map(|ms| started.checked_add(Duration::from_millis(ms)).unwrap_or(far).min(far));
    let mut kill_at: Option<Instant> = None;
    let mut drain_at: Option<Instant> = None;
    let timer = tokio::time::sleep_until(far);
    tokio::pin!(timer);

    loop {
        // Requests from the edge: signals, cancellation, input.
        for sig in ctx.take_signals() {
            signal_group(pid, sig);
        }
        if let Some(e) = ctx.violation() {
            signal_group(pid, libc::SIGKILL);
            return Err(e);
        }
        if ctx.is_cancelled() {
            signal_group(pid, libc::SIGKILL);
            return Err(cancelled());
        }
        if stdin.is_none() {
            input.discard(ctx);
        } else if input.finished(ctx) {
            stdin = None;
        }

        let can_read = [sinks[0].read_size(ctx) > 0, sinks[1].read_size(ctx) > 0];
        if status.is_some() {
            let open_blocked = (out.is_some() && !can_read[0]) || (err.is_some() && !can_read[1]);
            if out.is_none() && err.is_none() && state_fd.is_none() {
                break;
            }
            // Waiting for credit is not the background-child case: the
            // grace period counts only while we can actually read.
            if open_blocked {
                drain_at = Some(Instant::now() + EOF_GRACE);
            }
        }
        let next = [term_at, kill_at, drain_at].into_iter().flatten().min();
        if let Some(n) = next {
            if timer.deadline() != n {
                timer.as_mut().reset(n);
            }
        }

        tokio::select! {
            _ = ctx.changed() => {}
            st = watch.wait(), if status.is_none() => {
                status = Some(st);
                exited_at = Some(Instant::now());
                drain_at = Some(Instant::now() + EOF_GRACE);
                if timed_out {
                    // The command overran: nothing of its group may linger.
                    signal_group(pid, libc::SIGKILL);
                }
            }
            g = aio::readable(&out), if can_read[0] => {
                if let Ok(mut g) = g {
                    let n = sinks[0].read_size(ctx);
                    match aio::read(&mut g, &mut buf[..n]) {
                        aio::Read::Data(n) => sinks[0].accept(ctx, &buf[..n]),
                        aio::Read::Eof => out = None,
                        aio::Read::NotReady => {}
                    }
                } else {
                    out = None;
                }
            }
            g = aio::readable(&err), if can_read[1] => {
                if let Ok(mut g) = g {
                    let n = sinks[1].read_size(ctx);
                    match aio::read(&mut g, &mut buf[..n]) {
                        aio::Read::Data(n) => sinks[1].accept(ctx, &buf[..n]),
                        aio::Read::Eof => err = None,
                        aio::Read::NotReady => {}
                    }
                } else {
                    err = None;
                }
            }
            g = aio::readable(&state_fd) => {
                if let Ok(mut g) = g {
                    match aio::read(&mut g, &mut buf) {
                        aio::Read::Data(n) => {
                            if state_buf.len() + n > STATE_MAX {
                                state_ok = false;
                            } else {
                                state_buf.extend_from_slice(&buf[..n]);
                            }
                        }
                        aio::Read::Eof => state_fd = None,
                        aio::Read::NotReady => {}
                    }
                } else {
                    state_fd = None;
                }
            }
            g = aio::writable(&stdin), if input.has_pending(ctx) => {
                match g {
                    Ok(mut g) => {
                        if let Some(data) = input.pending(ctx) {
                            match aio::write(&mut g, data) {
                                aio::Write::Wrote(n) => input.wrote(ctx, n),
                                aio::Write::Closed => stdin = None,
                                aio::Write::NotReady => {}
                            }
                        }
                    }
                    Err(_) => stdin = None,
                }
            }
            _ = &mut timer, if next.is_some() => {
                let now = Instant::now();
                if term_at.is_some_and(|t| t <= now) {
                    term_at = None;
                    timed_out = true;
                    signal_group(pid, libc::SIGTERM);
                    kill_at = Some(now.checked_add(Duration::from_millis(spec.kill_grace_ms)).unwrap_or(far).min(far));
                }
                if kill_at.is_some_and(|t| t <= now) {
                    kill_at = None;
                    signal_group(pid, libc::SIGKILL);
                }
                if drain_at.is_some_and(|t| t <= now) && status.is_some() {
                    break;
                }
                timer.as_mut().reset(far);
            }
        }
    }
    let status = status.unwrap_or(ExitStatus::Signal(libc::SIGKILL));
    let ended = exited_at.unwrap_or_else(Instant::now);
    let [o, e] = sinks;
    let result = ExecResult {
        exit_code: match status {
            ExitStatus::Code(c) => Some(c),
            ExitStatus::Signal(_) => None,
        },
        signal: match status {
            ExitStatus::Signal(s) => Some(s),
            ExitStatus::Code(_) => None,
        },
        truncated: o.truncated || e.truncated,
        stdout: o.kept,
        stderr: e.kept,
        timed_out,
        duration_us: ended.duration_since(started).as_micros() as u64,
    };
    // A report is trustworthy only if the shell closed fd 3 (end of file)
    // after writing it, within the size limit.
    let state = (state_ok && state_fd.is_none() && !state_buf.is_empty()).then_some(state_buf);
    Ok(Finished { result, state })
}
