//! Process hygiene at startup, before anything else opens an fd or the
//! event loop exists.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use crate::reattach::{self, CHANNEL_FD, REATTACH_FD};

fn fd_open(fd: i32) -> bool {
    // SAFETY: F_GETFD only queries the fd table.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// Makes the process a clean init: stdio open, only the channel inherited,
/// fd 4 reserved, default signal dispositions (SIGPIPE ignored, SIGCHLD
/// blocked for the reaper's signalfd), umask 0 (the agent sets exact modes
/// itself; children get 022), and a malloc that gives memory back.
pub fn prepare_process() -> io::Result<OwnedFd> {
    // fds 0-2 must exist, or the first pipe we create could land on one and
    // be clobbered by a child's dup2.
    for fd in 0..3 {
        if !fd_open(fd) {
            // SAFETY: opening /dev/null; the result is the lowest free fd,
            // i.e. exactly the hole we are filling.
            if unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    if !fd_open(CHANNEL_FD) {
        return Err(io::Error::other(format!("no channel on fd {CHANNEL_FD}")));
    }
    // Nothing else the edge (or whoever started us) left open survives.
    // SAFETY: close_range on fds we do not use; nothing in this process has
    // opened anything yet.
    if unsafe { libc::syscall(libc::SYS_close_range, REATTACH_FD as libc::c_uint, libc::c_uint::MAX, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    reattach::park_placeholder()?;
    reattach::reserve_parked_fds()?;
    // SAFETY: fd 3 is open (checked above) and owned by us from here on.
    let chan = unsafe { OwnedFd::from_raw_fd(CHANNEL_FD) };
    rustix::io::fcntl_setfd(&chan, rustix::io::FdFlags::CLOEXEC)?;
    // The handshake and setup use blocking I/O.
    let fl = rustix::fs::fcntl_getfl(&chan)?;
    rustix::fs::fcntl_setfl(&chan, fl - rustix::fs::OFlags::NONBLOCK)?;

    // SAFETY: signal(2)/umask(2)/mallopt(3) on process-wide settings before
    // any other code runs; no handlers are installed.
    unsafe {
        // Above all SIGCHLD: ignored, the kernel would reap for us and
        // waitpid would never see an exit status. (glibc's reserved
        // real-time signals are refused by signal(3) and left alone.)
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        libc::umask(0);
        // A fixed mmap threshold (glibc otherwise raises it after the first
        // large free, after which big buffers stay in the heap) and an eager
        // trim keep an idle agent's heap small after a burst of work.
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 10);
    }
    crate::reaper::block_sigchld();
    Ok(chan)
}

/// The spawn helper's hygiene: stdio open, the socket on fd 3, nothing
/// else inherited (its descriptor table is what every agent's clone copies).
pub fn prepare_spawner() -> io::Result<()> {
    for fd in 0..3 {
        if !fd_open(fd) {
            // SAFETY: opening /dev/null fills exactly the lowest free fd.
            if unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    if !fd_open(CHANNEL_FD) {
        return Err(io::Error::other(format!("no socket on fd {CHANNEL_FD}")));
    }
    // SAFETY: close_range on fds nothing in this process uses.
    if unsafe { libc::syscall(libc::SYS_close_range, REATTACH_FD as libc::c_uint, libc::c_uint::MAX, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Our own oom_score_adj (0 if unreadable).
pub fn oom_score_adj() -> i32 {
    std::fs::read_to_string("/proc/self/oom_score_adj").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}
