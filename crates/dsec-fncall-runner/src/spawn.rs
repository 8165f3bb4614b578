//! Starting the runner's helpers (the zygote, the compiler): a fresh
//! `python3 -s zygote.py --MODE FD...` each, or this binary's
//! `fncall-exec-zygote FD...` (exec_zygote.rs), forked from the monitor
//! (which is single-threaded and has not yet served a call) and confined
//! before its exec in what it must keep for life.
//!
//! Isolated like `python3 -I`, but by hand: `-I` would also ignore the
//! PYTHON* variables the zygote is given on purpose (see ZYGOTE_ENV), so
//! the helper gets `-s` (no user site), PYTHONSAFEPATH (no script
//! directory on sys.path) and an environment without any other PYTHON*
//! or GLIBC_TUNABLES variable.

use crate::error::{last_os, refused, RunnerError};
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

/// The zygote's allocator, chosen for a process that forks once per call.
/// The default (pymalloc) keeps objects in 1 MiB arenas of 4 KiB pages;
/// a fork copies a page-table entry for each of those pages, and each
/// worker's exit removes them all again, one page at a time (together a
/// quarter of a call's CPU, measured by perf). With glibc's malloc for
/// every object, and glibc asked to back its heap with transparent huge
/// pages (madvise; the host's THP mode "madvise" or "always" allows it),
/// the zygote's objects sit in 2 MiB folios, which fork and exit handle a
/// folio at a time. A worker's first write to a page still copies just
/// that 4 KiB page. The 8 MiB top pad makes glibc's first extension of
/// the heap one mapping big enough to hold aligned 2 MiB blocks (with the
/// default, the first 3 MiB, where the interpreter's start-up objects
/// live, stayed in 4 KiB pages). Older glibc ignores the tunables; hosts
/// with THP off get the plain glibc heap.
///
/// LD_BIND_NOW: the dynamic linker resolves every symbol of the interpreter
/// and its libraries (and of the extension modules it loads later) when it
/// loads them, in the zygote, once. Lazily, the first call of a C function
/// the zygote never called (`_exit`, `setresuid`, ...) was resolved in each
/// worker: the linker's code and the libraries' symbol tables faulted in,
/// and a GOT page copied, ~14 page faults of ~290 per call.
pub const ZYGOTE_ENV: &[(&str, &str)] =
    &[("PYTHONMALLOC", "malloc"), ("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1:glibc.malloc.top_pad=8388608"), ("LD_BIND_NOW", "1")];

/// The helper's environment: `inherited` (the monitor's own) without any
/// PYTHON*, GLIBC_TUNABLES or LD_BIND_* variable, then PYTHONSAFEPATH and
/// `extra`.
fn helper_env(inherited: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>, extra: &[(&str, &str)]) -> Vec<CString> {
    let mut env: Vec<CString> = inherited
        .filter(|(k, _)| {
            let k = k.as_encoded_bytes();
            !k.starts_with(b"PYTHON") && !k.starts_with(b"LD_BIND_") && k != b"GLIBC_TUNABLES"
        })
        .filter_map(|(k, v)| {
            let mut kv = k.into_encoded_bytes();
            kv.push(b'=');
            kv.extend(v.into_encoded_bytes());
            CString::new(kv).ok()
        })
        .collect();
    for (k, v) in [("PYTHONSAFEPATH", "1")].iter().chain(extra) {
        env.push(CString::new(format!("{k}={v}")).expect("constant without NUL"));
    }
    env
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
}

/// Forks and execs `python -s script --mode FD...` with `keep` open in it
/// (`script` may be `-`: read from `confinement.stdin`) and `extra_env`
/// in its environment; returns its pid.
pub fn python_helper(
    python: &str,
    script: &str,
    mode: &str,
    keep: &[i32],
    confinement: &Confinement,
    extra_env: &[(&str, &str)],
) -> Result<i32, RunnerError> {
    let mut argv = vec![python.to_string(), "-s".into(), script.into(), format!("--{mode}")];
    argv.extend(keep.iter().map(|fd| fd.to_string()));
    helper(argv, mode, keep, confinement, extra_env)
}

/// Forks and execs `argv` (its program a path) with `keep` open in it and
/// `extra_env` in its environment; returns its pid. `mode` names it in
/// errors.
pub fn helper(
    argv: Vec<String>,
    mode: &str,
    keep: &[i32],
    confinement: &Confinement,
    extra_env: &[(&str, &str)],
) -> Result<i32, RunnerError> {
    let argv: Vec<CString> = argv
        .into_iter()
        .map(|a| CString::new(a).map_err(|_| refused(format!("a NUL in the {mode}'s command"))))
        .collect::<Result<_, _>>()?;
    let argv_ptrs = null_terminated(&argv);
    let env = helper_env(std::env::vars_os(), extra_env);
    let env_ptrs = null_terminated(&env);
    let monitor = rustix::process::getpid().as_raw_nonzero().get();
    // SAFETY: the monitor is single-threaded (it never starts a thread),
    // so the child may run any code; it only makes system calls and ends
    // in execv or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(last_os("fork"));
    }
    if pid == 0 {
        let err = child(monitor, keep, confinement, &argv_ptrs, &env_ptrs);
        let _ = write_all(io::stderr().as_fd(), format!("dsec-agent fncall-monitor: starting the {mode}: {err}\n").as_bytes());
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(127) };
    }
    Ok(pid)
}

/// In the forked child: keep the helper's descriptors across exec,
/// confine it, tie its life to the monitor's and exec. Returns only on
/// failure.
fn child(monitor: i32, keep: &[i32], confinement: &Confinement, argv: &[*const libc::c_char], env: &[*const libc::c_char]) -> io::Error {
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
    // SAFETY: argv and env are NULL-terminated arrays of C strings that
    // outlive the call; execve returns only on failure.
    unsafe { libc::execve(argv[0], argv.as_ptr(), env.as_ptr()) };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_get_no_inherited_python_or_glibc_settings_only_ours() {
        let inherited = [
            ("PATH", "/bin"),
            ("PYTHONPATH", "/evil"),
            ("PYTHONMALLOC", "debug"),
            ("GLIBC_TUNABLES", "x=1"),
            ("LD_BIND_NOT", "1"),
            ("DSEC_FNCALL_PRELOAD", "math"),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let env = helper_env(inherited.into_iter(), ZYGOTE_ENV);
        let env: Vec<&str> = env.iter().map(|c| c.to_str().unwrap()).collect();
        assert_eq!(
            env,
            [
                "PATH=/bin",
                "DSEC_FNCALL_PRELOAD=math",
                "PYTHONSAFEPATH=1",
                "PYTHONMALLOC=malloc",
                "GLIBC_TUNABLES=glibc.malloc.hugetlb=1:glibc.malloc.top_pad=8388608",
                "LD_BIND_NOW=1"
            ]
        );
    }
}
