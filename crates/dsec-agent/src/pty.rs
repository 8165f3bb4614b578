//! Interactive terminals: a program on a new PTY, keystrokes in as `Data`,
//! screen output out as `Data{Pty}` under the credit window.

use std::os::fd::AsFd;
use std::rc::Rc;

use dsec_agent_proto::{AgentError, ExecResult, PtySpec, Reply, Stream, MAX_CHUNK_BYTES};
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;
use tokio::time::Instant;

use crate::agent::Agent;
use crate::aio;
use crate::envs;
use crate::errors::{cancelled, os_err};
use crate::exec::EOF_GRACE;
use crate::input::Input;
use crate::launch;
use crate::pgroup::signal_group;
use crate::reaper::ExitStatus;
use crate::request::ReqCtx;

fn winsize(rows: u16, cols: u16) -> Winsize {
    Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 }
}

pub async fn open(agent: &Rc<Agent>, ctx: &Rc<ReqCtx>, spec: PtySpec) -> Result<Reply, AgentError> {
    envs::validate(&spec.env)?;
    let user = launch::user(agent, spec.user.as_deref())?;
    let mut env = envs::base(&agent.image_env, &user);
    if envs::get(&env, "TERM").is_none() {
        envs::set(&mut env, "TERM", "xterm");
    }
    envs::overlay(&mut env, &spec.env);
    let cwd = launch::cwd(agent, spec.cwd.as_deref().unwrap_or(&agent.workdir))?;
    let (argv, login_name) = match &spec.command {
        Some(c) => (launch::argv(agent, c)?, None),
        None => {
            // The user's login shell, started as a login shell (`-sh`).
            let shell = if crate::spawn::find_program(&user.shell, "")
                .is_some_and(|p| rustix::fs::access(&p, rustix::fs::Access::EXEC_OK).is_ok())
            {
                user.shell.clone()
            } else {
                "/bin/sh".to_string()
            };
            let base = shell.rsplit('/').next().unwrap_or("sh").to_string();
            (vec![shell], Some(format!("-{base}")))
        }
    };
    let mut launch = launch::prepare(argv, &env, cwd, user)?;
    if let (Some(name), Some(arg0)) = (login_name, launch.argv.first_mut()) {
        *arg0 = std::ffi::CString::new(name).map_err(|_| crate::errors::invalid("shell name"))?;
    }

    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).map_err(|e| os_err("open the PTY", e))?;
    rustix::pty::unlockpt(&master).map_err(|e| os_err("unlockpt", e))?;
    rustix::termios::tcsetwinsize(&master, winsize(spec.rows.max(1), spec.cols.max(1))).map_err(|e| os_err("set the window size", e))?;
    // TIOCGPTPEER opens the slave through the master itself: no path lookup
    // in /dev/pts, which the sandbox could have tampered with.
    let slave = rustix::pty::ioctl_tiocgptpeer(&master, OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
        .map_err(|e| os_err("open the PTY slave", e))?;
    let pid = launch.spawn(agent, slave.as_fd(), slave.as_fd(), slave.as_fd(), None, true)?;
    let watch = agent.reaper.watch(pid);
    let started = Instant::now();
    drop(slave);

    let mut term = match aio::register(master) {
        Ok(t) => Some(t),
        Err(e) => {
            signal_group(pid, libc::SIGKILL);
            return Err(e);
        }
    };
    let mut input = Input::stream();
    let mut buf = vec![0u8; MAX_CHUNK_BYTES];
    let mut status: Option<ExitStatus> = None;
    let mut exited_at = started;
    let mut drain_at: Option<Instant> = None;

    loop {
        for sig in ctx.take_signals() {
            signal_group(pid, sig);
        }
        if let Some((rows, cols)) = ctx.take_resize() {
            if let Some(t) = &term {
                // The kernel sends SIGWINCH to the terminal's foreground group.
                let _ = rustix::termios::tcsetwinsize(t.get_ref(), winsize(rows.max(1), cols.max(1)));
            }
        }
        if let Some(e) = ctx.abort_error() {
            // Cancelled, or the edge went away: hang up like a closed
            // terminal would, then make sure the group is gone.
            drop(term.take());
            signal_group(pid, libc::SIGHUP);
            signal_group(pid, libc::SIGKILL);
            return Err(if ctx.is_cancelled() { cancelled() } else { e });
        }
        if term.is_none() {
            input.discard(ctx);
        }
        let can_read = ctx.sendable() > 0;
        if status.is_some() {
            if term.is_none() {
                break;
            }
            if !can_read {
                drain_at = Some(Instant::now() + EOF_GRACE);
            }
        }
        let deadline = drain_at.unwrap_or_else(|| started + std::time::Duration::from_secs(86400 * 365));

        tokio::select! {
            _ = ctx.changed() => {}
            st = watch.wait(), if status.is_none() => {
                status = Some(st);
                exited_at = Instant::now();
                drain_at = Some(exited_at + EOF_GRACE);
            }
            g = aio::readable(&term), if can_read => {
                match g {
                    Ok(mut g) => {
                        let n = ctx.sendable();
                        match aio::read(&mut g, &mut buf[..n]) {
                            aio::Read::Data(n) => ctx.send_data(Stream::Pty, &buf[..n]),
                            aio::Read::Eof => term = None,
                            aio::Read::NotReady => {}
                        }
                    }
                    Err(_) => term = None,
                }
            }
            g = aio::writable(&term), if input.has_pending(ctx) => {
                match g {
                    Ok(mut g) => {
                        if let Some(data) = input.pending(ctx) {
                            match aio::write(&mut g, data) {
                                aio::Write::Wrote(n) => input.wrote(ctx, n),
                                aio::Write::Closed => term = None,
                                aio::Write::NotReady => {}
                            }
                        }
                    }
                    Err(_) => term = None,
                }
            }
            _ = tokio::time::sleep_until(deadline), if drain_at.is_some() => {
                if status.is_some() {
                    break;
                }
            }
        }
    }
    let status = status.unwrap_or(ExitStatus::Signal(libc::SIGKILL));
    Ok(Reply::Exited(ExecResult {
        exit_code: match status {
            ExitStatus::Code(c) => Some(c),
            ExitStatus::Signal(_) => None,
        },
        signal: match status {
            ExitStatus::Signal(s) => Some(s),
            ExitStatus::Code(_) => None,
        },
        duration_us: exited_at.duration_since(started).as_micros() as u64,
        ..Default::default()
    }))
}
