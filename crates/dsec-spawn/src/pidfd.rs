//! pidfd helpers: a pidfd names one process for its whole life, so
//! signalling or waiting through it never hits a recycled pid.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Waits for the process behind `pidfd` if it is our child; returns its wait
/// status. Harmless (ECHILD) for an adopted process that is not our child.
pub fn reap(pidfd: &OwnedFd) -> Option<i32> {
    // SAFETY: siginfo_t is plain data filled by waitid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid with P_PIDFD on a valid pidfd and a valid out pointer.
    let r = unsafe { libc::waitid(libc::P_PIDFD, pidfd.as_raw_fd() as libc::id_t, &mut info, libc::WEXITED) };
    if r < 0 {
        return None;
    }
    // SAFETY: waitid filled a SIGCHLD siginfo; si_status is valid for it.
    Some(unsafe { info.si_status() })
}

/// Sends `signal` through a pidfd (never hits a recycled pid).
pub fn pidfd_kill(pidfd: &OwnedFd, signal: libc::c_int) -> std::io::Result<()> {
    // SAFETY: pidfd_send_signal with a valid pidfd and no siginfo.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signal, std::ptr::null::<libc::siginfo_t>(), 0) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Opens a pidfd for an existing process (re-adoption after a restart).
pub fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Duplicates fd `target` of the process behind `pidfd` into this process.
pub fn pidfd_getfd(pidfd: &OwnedFd, target: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd returns a new fd (CLOEXEC) or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}
