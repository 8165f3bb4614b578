//! Small system-call helpers of the monitor.

use crate::error::{os, RunnerError};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

use super::{CALL_UID, ROOT_UID};

/// Sets the real, effective and saved uid with the raw system call.
/// glibc's setresuid would also signal every other thread to change
/// theirs; the monitor has one thread, and the raw call keeps it obvious
/// that nothing but this thread's credentials change.
fn setresuid(r: u32, e: u32, s: u32) -> io::Result<()> {
    // SAFETY: setresuid takes three integers and touches no memory of ours.
    if unsafe { libc::syscall(libc::SYS_setresuid, r, e, s) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` with the call user's real and effective uid (the saved uid
/// stays root, so we can come back). A failure to come back is fatal: the
/// monitor must never go on with the call user's identity.
pub fn as_call_user<T>(f: impl FnOnce() -> T) -> io::Result<T> {
    setresuid(CALL_UID, CALL_UID, ROOT_UID)?;
    let r = f();
    if let Err(e) = setresuid(ROOT_UID, ROOT_UID, ROOT_UID) {
        eprintln!("dsec-agent fncall-monitor: cannot become root again: {e}");
        std::process::abort();
    }
    Ok(r)
}

/// This single-threaded process's list of children
/// (`/proc/self/task/PID/children`), opened once to be read by
/// `read_to_end_at`: whether any child is left without a scan of /proc.
pub fn children_list() -> Result<OwnedFd, RunnerError> {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let path = format!("/proc/self/task/{me}/children");
    rustix::fs::open(path.as_str(), rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty()).map_err(os(path))
}

/// A small file's bytes (one open, a read or two, one close).
pub fn read_small(path: &str) -> io::Result<Vec<u8>> {
    let fd = rustix::fs::open(path, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())?;
    read_to_end_at(fd.as_fd(), 0)
}

/// Everything in `fd` from `offset` on, by pread (the file offset stays).
pub fn read_to_end_at(fd: BorrowedFd<'_>, mut offset: u64) -> io::Result<Vec<u8>> {
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match rustix::io::pread(fd, &mut chunk, offset) {
            Ok(0) => return Ok(data),
            Ok(n) => {
                data.extend_from_slice(&chunk[..n]);
                offset += n as u64;
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes all of `data` to `fd`.
pub fn write_all(fd: BorrowedFd<'_>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match rustix::io::write(fd, data) {
            Ok(n) => data = &data[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The first executable `prog` in the directories of the calls' PATH.
pub fn which(prog: &str) -> Option<String> {
    ["/usr/local/bin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| format!("{d}/{prog}"))
        .find(|p| rustix::fs::access(p.as_str(), rustix::fs::Access::EXEC_OK).is_ok())
}

/// A memfd holding `data`, its offset back at 0.
pub fn memfd(name: &str, data: &[u8]) -> io::Result<OwnedFd> {
    let name = CString::new(name).expect("memfd names are constants");
    let fd = rustix::fs::memfd_create(name.as_c_str(), rustix::fs::MemfdFlags::CLOEXEC)?;
    if !data.is_empty() {
        write_all(fd.as_fd(), data)?;
        rustix::fs::seek(&fd, rustix::fs::SeekFrom::Start(0))?;
    }
    Ok(fd)
}

/// Takes ownership of a descriptor number the caller just got from the
/// kernel (a libc call rustix does not wrap).
pub fn owned(fd: i32) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned to us by the kernel and nothing else
    // owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
