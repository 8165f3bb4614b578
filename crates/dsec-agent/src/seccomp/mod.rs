//! The sandbox's system-call filter: what is refused (policy.rs), the BPF
//! it compiles to (bpf.rs), and its installation on the agent.
//!
//! The agent installs it on itself once the sandbox's mounts are made, so
//! every process of the sandbox (commands, sessions, PTYs, FnCall runners)
//! inherits it and none can remove it. no_new_privs comes first: the
//! kernel requires it of an unprivileged filter, and it also means no
//! setuid or file-capability binary ever gains privileges in the sandbox.
//!
//! The agent is then filtered too, and it is the supervisor of its own
//! filter (it answers the notifications): it must never make a refused
//! call itself, or it would wait for its own answer. Nothing it does after
//! setup (exec, files, PTYs, reaping, re-attachment) is on the list.

mod bpf;
pub mod policy;

use std::os::fd::{FromRawFd, OwnedFd};

pub use bpf::BpfError;
use seccompiler::BpfProgram;

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("compile the filter: {0}")]
    Compile(#[from] BpfError),
    #[error("prctl(PR_SET_NO_NEW_PRIVS): {0}")]
    NoNewPrivs(std::io::Error),
    #[error("seccomp(SET_MODE_FILTER): {0}")]
    Install(std::io::Error),
}

/// no_new_privs, then both filters. Returns the listener of the audited
/// one (readable when a process waits for a verdict; see audit.rs).
pub fn install() -> Result<OwnedFd, InstallError> {
    let quiet = bpf::quiet()?;
    let audited = bpf::audited()?;
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(InstallError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    load(&quiet, 0)?;
    let fd = load(&audited, libc::SECCOMP_FILTER_FLAG_NEW_LISTENER)?;
    // SAFETY: with NEW_LISTENER, seccomp returns a new fd (close-on-exec)
    // that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn load(prog: &BpfProgram, flags: libc::c_ulong) -> Result<i32, InstallError> {
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `fprog` points at `prog`, alive for the call; seccompiler's
    // sock_filter has the kernel's layout (#[repr(C)] u16, u8, u8, u32).
    let r = unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, flags, &fprog as *const libc::sock_fprog) };
    if r < 0 {
        return Err(InstallError::Install(std::io::Error::last_os_error()));
    }
    Ok(r as i32)
}
