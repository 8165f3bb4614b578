//! `dsec-agent fncall-exec-zygote CTL REP CMD`: the zygote of a runner
//! whose language is not Python, in place of zygote.py's.
//!
//! Every step of such a runner execs a program (a compiler, an
//! interpreter, the compiled program), so forking a warm Python
//! interpreter for it only cost: each fork copied the page tables of the
//! interpreter's ~15 MiB of mappings, and the exec then tore them down,
//! half of a Lua snippet call's CPU (perf, docs/benchmarks.md). This
//! process maps ~2 MiB. It keeps zygote.py's contract exactly (the same
//! descriptors, the worker message of worker.rs, the report line of
//! report.rs, the same handling of strays), so the monitor drives either
//! alike; a test holds the calls' base environment equal to zygote.py's.
//!
//! The monitor starts it like the Python zygote (spawn.rs): root, in the
//! calls' Landlock domain, no_new_privs, oom_score_adj 1000, no core
//! dumps, killed with the monitor. It forks one worker ahead of each call;
//! the worker receives the step, drops to the call user with the step's
//! rlimits and execs the program. It never sees a call's input or output.

use crate::error::{last_os, malformed, os, refused, RunnerError};
use std::convert::Infallible;
use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

use super::marshal::Reader;
use super::sys::{children_list, read_to_end_at, write_all};
use super::worker::MAX_WORKER_MSG;
use super::{CALL_GID, CALL_UID};

/// The environment of every call, before the step's own variables
/// (BASE_ENV in zygote.py).
pub const BASE_ENV: [(&str, &str); 5] = [
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("HOME", super::SCRATCH),
    ("TMPDIR", super::SCRATCH),
    ("LANG", "C.UTF-8"),
    ("PYTHONDONTWRITEBYTECODE", "1"),
];

pub fn run(args: &[String]) -> Result<(), RunnerError> {
    let fds: Vec<RawFd> =
        args.iter().map(|a| a.parse().map_err(|_| RunnerError::Usage(format!("not a descriptor: {a:?}")))).collect::<Result<_, _>>()?;
    let [ctl, rep, cmd] = fds[..] else { return Err(RunnerError::Usage("usage: dsec-agent fncall-exec-zygote CTL REP CMD".into())) };
    // SAFETY: the monitor passed these three descriptors for us to own.
    let (ctl, rep, cmd) = unsafe { (OwnedFd::from_raw_fd(ctl), OwnedFd::from_raw_fd(rep), OwnedFd::from_raw_fd(cmd)) };
    // Rust's runtime ignores SIGPIPE, and an exec keeps an ignored signal
    // ignored: calls get the defaults, as from zygote.py.
    for sig in [libc::SIGPIPE, libc::SIGXFSZ] {
        // SAFETY: restores a signal's default action; no handler runs.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    let children = children_list()?;
    // Ready: no modules preloaded.
    write_all(rep.as_fd(), b"\n").map_err(os("the monitor is gone"))?;
    loop {
        let pid = fork_once_pids_free()?;
        if pid == 0 {
            drop((ctl, rep, children));
            worker(cmd.as_fd());
        }
        let (status, usage) = wait_for(pid)?;
        // Other children: processes a call made siblings of its worker
        // (clone with CLONE_PARENT). The monitor kills them, then says so.
        let strays = read_to_end_at(children.as_fd(), 0).map(|l| !l.is_empty()).unwrap_or(true);
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        let line = format!("{pid} {status} {:.6} {:.6} {} {}\n", secs(usage.ru_utime), secs(usage.ru_stime), usage.ru_maxrss, strays as u8);
        write_all(rep.as_fd(), line.as_bytes()).map_err(os("the monitor is gone"))?;
        if strays {
            let mut b = [0u8; 1];
            if rustix::io::read(&ctl, &mut b).map_err(os("reading from the monitor"))? == 0 {
                return Ok(()); // the monitor is gone
            }
            reap_strays();
        }
    }
}

/// How long a fork may keep failing for want of pids or memory.
const FORK_RETRY: Duration = Duration::from_secs(30);

/// fork(), waiting out EAGAIN (the runner's pids limit) and ENOMEM: the
/// next worker is forked as soon as the last one ends, while that call's
/// other processes (a fork bomb's) may fill the pids limit until the
/// monitor has killed and reaped them, moments later. Giving up at once
/// would end the zygote, and with it the runner, under the next call.
fn fork_once_pids_free() -> Result<i32, RunnerError> {
    let deadline = Instant::now() + FORK_RETRY;
    let mut delay = Duration::from_millis(1);
    loop {
        // SAFETY: this process is single-threaded; the child only makes
        // system calls and ends in execve or _exit.
        let pid = unsafe { libc::fork() };
        if pid >= 0 {
            return Ok(pid);
        }
        let e = io::Error::last_os_error();
        let transient = matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOMEM));
        if !transient || Instant::now() >= deadline {
            return Err(os("fork")(e));
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(50));
    }
}

/// Waits for the worker `pid`: its wait status and resource usage.
fn wait_for(pid: i32) -> Result<(i32, libc::rusage), RunnerError> {
    loop {
        let mut status = 0;
        let mut usage = MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: wait4 writes only `status` and `usage`.
        let r = unsafe { libc::wait4(pid, &mut status, 0, usage.as_mut_ptr()) };
        if r == pid {
            // SAFETY: wait4 filled it in (and it was zeroed before).
            return Ok((status, unsafe { usage.assume_init() }));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(os("waiting for the worker")(e));
        }
    }
}

/// Reaps the strays the monitor has killed.
fn reap_strays() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only `status`.
        if unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } <= 0 {
            return;
        }
    }
}

/// The forked worker: receives its step and the call's stdio, becomes the
/// call and execs its program. Never returns.
fn worker(cmd: BorrowedFd<'_>) -> ! {
    let mut msg = vec![0u8; MAX_WORKER_MSG];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let received = recvmsg(cmd, &mut [io::IoSliceMut::new(&mut msg)], &mut anc, RecvFlags::CMSG_CLOEXEC);
    let err = match received {
        Ok(r) if r.bytes == 0 => exit(3), // the monitor is gone
        Ok(r) => {
            let mut fds = Vec::new();
            for m in anc.drain() {
                if let RecvAncillaryMessage::ScmRights(rights) = m {
                    fds.extend(rights);
                }
            }
            match become_call(&msg[..r.bytes], &fds) {
                Err(e) => e,
                Ok(never) => match never {},
            }
        }
        Err(e) => os("receiving the call")(e),
    };
    let _ = write_all(io::stderr().as_fd(), format!("dsec: cannot start the program: {err}\n").as_bytes());
    exit(127)
}

fn exit(code: i32) -> ! {
    // SAFETY: ends the worker without running the zygote's destructors.
    unsafe { libc::_exit(code) }
}

/// What a worker message asks for (worker.rs, message()).
#[derive(Debug)]
struct ExecStep<'a> {
    scratch: &'a str,
    argv: Vec<&'a str>,
    env: Vec<(&'a str, &'a str)>,
    time_ms: u64,
    memory_bytes: u64,
    file_bytes: u64,
}

fn parse(msg: &[u8]) -> Result<ExecStep<'_>, RunnerError> {
    let mut r = Reader::new(msg);
    if r.tuple()? != 6 {
        return Err(malformed("a worker message is a 6-tuple"));
    }
    let scratch = r.str()?;
    let argv = if r.none() { Vec::new() } else { r.str_list()? };
    if !r.none() {
        return Err(malformed("this runner runs no Python in its zygote"));
    }
    let env = r.str_dict()?;
    if r.tuple()? != 3 {
        return Err(malformed("the limits are a 3-tuple"));
    }
    let (time_ms, memory_bytes, file_bytes) = (r.int()?, r.int()?, r.int()?);
    if !r.none() {
        return Err(malformed("a code object for a program to exec"));
    }
    if argv.is_empty() {
        return Err(malformed("no program to run"));
    }
    Ok(ExecStep { scratch, argv, env, time_ms, memory_bytes, file_bytes })
}

/// The calls' base environment with the step's variables over it, as
/// `dict(BASE_ENV, **env)` in zygote.py.
fn environment<'a>(step_env: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env: Vec<(&str, &str)> = BASE_ENV.iter().filter(|(k, _)| !step_env.iter().any(|(s, _)| s == k)).copied().collect();
    env.extend_from_slice(step_env);
    env
}

fn cstrings(items: impl Iterator<Item = String>) -> Result<Vec<CString>, RunnerError> {
    items.map(|s| CString::new(s).map_err(|_| refused("a NUL byte in the program's arguments or environment"))).collect()
}

/// become_call_process and the exec of zygote.py's worker_main: the
/// call's stdio, a session of its own, its limits, the call user, the
/// scratch directory, the program. Returns only on failure.
fn become_call(msg: &[u8], fds: &[OwnedFd]) -> Result<Infallible, RunnerError> {
    let step = parse(msg)?;
    let [stdin, stdout, stderr] = fds else { return Err(malformed(format!("{} descriptors instead of the call's three", fds.len()))) };
    let argv = cstrings(step.argv.iter().map(|a| a.to_string()))?;
    let env = cstrings(environment(&step.env).into_iter().map(|(k, v)| format!("{k}={v}")))?;
    let scratch = CString::new(step.scratch).map_err(|_| refused("a NUL byte in the scratch path"))?;
    let ptrs = |v: &[CString]| v.iter().map(|c| c.as_ptr()).chain(std::iter::once(std::ptr::null())).collect::<Vec<_>>();
    let (argv_p, env_p) = (ptrs(&argv), ptrs(&env));
    let cpu_s = (step.time_ms / 1000 + 1).max(1);
    let limit = |resource, soft: u64, hard: u64| {
        let l = libc::rlimit { rlim_cur: soft, rlim_max: hard };
        // SAFETY: setrlimit reads one rlimit that lives across the call.
        (unsafe { libc::setrlimit(resource, &l) } == 0).then_some(()).ok_or_else(|| last_os("setrlimit"))
    };
    // SAFETY: plain system calls on this process's only thread, with
    // descriptors we hold and C strings that outlive them.
    unsafe {
        if libc::setsid() < 0 {
            return Err(last_os("setsid"));
        }
        for (fd, target) in [(stdin, 0), (stdout, 1), (stderr, 2)] {
            if libc::dup2(std::os::fd::AsRawFd::as_raw_fd(fd), target) < 0 {
                return Err(last_os("dup2"));
            }
        }
        // Everything else is closed: the received descriptors (their
        // copies at 0-2 stay) and anything inherited.
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            for fd in 3..1 << 16 {
                libc::close(fd);
            }
        }
        limit(libc::RLIMIT_CPU, cpu_s, cpu_s + 1)?;
        limit(libc::RLIMIT_FSIZE, step.file_bytes, step.file_bytes)?;
        if step.memory_bytes > 0 {
            limit(libc::RLIMIT_AS, step.memory_bytes, step.memory_bytes)?;
        }
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::syscall(libc::SYS_setresgid, CALL_GID, CALL_GID, CALL_GID) != 0
            || libc::syscall(libc::SYS_setresuid, CALL_UID, CALL_UID, CALL_UID) != 0
        {
            return Err(last_os("dropping to the call user"));
        }
        if libc::chdir(scratch.as_ptr()) != 0 {
            return Err(last_os("chdir"));
        }
        libc::execve(argv_p[0], argv_p.as_ptr(), env_p.as_ptr());
    }
    Err(last_os(step.argv[0].to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marshal::Marshal;

    fn message(argv: Option<&[&str]>, python: Option<&str>) -> Vec<u8> {
        let mut m = Marshal::default();
        m.tuple(6);
        m.str("/scratch");
        match argv {
            Some(a) => m.str_list(a.iter().copied()),
            None => m.none(),
        }
        match python {
            Some(p) => m.str(p),
            None => m.none(),
        }
        m.str_dict([("GOMEMLIMIT", "64MiB"), ("HOME", "/elsewhere")].into_iter());
        m.tuple(3);
        m.int(2500);
        m.int(64 << 20);
        m.int(1 << 40);
        m.none();
        m.out
    }

    #[test]
    fn reads_the_monitors_message() {
        let msg = message(Some(&["/usr/bin/lua5.4", "main.lua"]), None);
        let step = parse(&msg).unwrap();
        assert_eq!((step.scratch, step.argv.as_slice()), ("/scratch", &["/usr/bin/lua5.4", "main.lua"][..]));
        assert_eq!((step.time_ms, step.memory_bytes, step.file_bytes), (2500, 64 << 20, 1 << 40));
        // The step's variables win over the base ones, as dict(BASE_ENV, **env).
        let env = environment(&step.env);
        assert!(env.contains(&("HOME", "/elsewhere")) && !env.contains(&("HOME", super::super::SCRATCH)), "{env:?}");
        assert!(env.contains(&("GOMEMLIMIT", "64MiB")) && env.contains(&("LANG", "C.UTF-8")));
        assert!(parse(&message(None, Some("/scratch/main.py"))).unwrap_err().to_string().contains("no Python"));
        assert!(parse(&message(None, None)).unwrap_err().to_string().contains("no program"));
        assert!(parse(&msg[..msg.len() - 3]).is_err());
    }

    /// The calls' base environment is zygote.py's.
    #[test]
    fn base_environment_is_the_python_zygotes() {
        let zygote = crate::ZYGOTE;
        let start = zygote.find("BASE_ENV = {").expect("zygote.py defines BASE_ENV");
        let block = &zygote[start..start + zygote[start..].find('}').unwrap()];
        for (k, v) in BASE_ENV {
            let v = if v == super::super::SCRATCH { "SCRATCH".to_string() } else { format!("\"{v}\"") };
            assert!(block.contains(&format!("\"{k}\": {v}")), "{k} in {block}");
        }
        assert_eq!(block.matches(':').count(), BASE_ENV.len() + 2, "the same number of variables: {block}");
    }
}
