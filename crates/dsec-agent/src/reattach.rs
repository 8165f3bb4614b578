//! Surviving an edge restart.
//!
//! The container agent's channel is a socketpair whose other end lives in
//! the edge. When the edge dies we see EOF, but the sandbox must live on, so
//! the agent does not exit: it creates a fresh socketpair, parks one end at
//! the well-known fd [`REATTACH_FD`] and serves the other. A restarted edge
//! finds the agent's pid (it is the sandbox's init), takes a copy of fd 4
//! with pidfd_getfd(2) (needs CAP_SYS_PTRACE over us, which the edge has and
//! the sandbox does not: the agent is not dumpable), and talks on it. The
//! agent greets it with `Hello { state: Ready { sandbox_id } }`, and once
//! the edge has said Hello the agent drops its own copy of the edge's end,
//! so that the next edge death is again seen as EOF.
//!
//! fd 4 is reserved from startup with a placeholder (an eventfd), so no
//! other fd ever lands on that number and "fd 4" always means "the end for
//! the edge" (or nothing useful). It is CLOEXEC, and children close every fd
//! above 2 before exec anyway: no sandboxed process can inherit it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub const CHANNEL_FD: RawFd = 3;
pub const REATTACH_FD: RawFd = 4;
/// An O_PATH descriptor of the container's writable overlay upper, for the
/// edge to take with pidfd_getfd(2) when it packs the sandbox's changes
/// into a layer (`pack_diff`): after pivot_root no path leads to it.
/// Reserved like fd 4, CLOEXEC, never reachable from the sandbox.
pub const UPPER_FD: RawFd = 5;
/// O_PATH descriptors of the empty file and the empty directory that hide
/// a container's masked paths, for the edge to take with pidfd_getfd(2)
/// and watch with fanotify (an open of a masked path becomes an audit
/// event). Reserved like fd 5.
pub const MASK_FILE_FD: RawFd = 6;
pub const MASK_DIR_FD: RawFd = 7;

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Puts an inert placeholder at fd 4 (replacing whatever is there).
pub fn park_placeholder() -> io::Result<()> {
    park_placeholder_at(REATTACH_FD)
}

/// Reserves fds 5-7 until the container setup parks its descriptors there
/// (copies of the placeholder at fd 4: one eventfd for all of them).
pub fn reserve_parked_fds() -> io::Result<()> {
    for fd in [UPPER_FD, MASK_FILE_FD, MASK_DIR_FD] {
        // SAFETY: dup3 of our own placeholder onto numbers we reserve.
        check(unsafe { libc::dup3(REATTACH_FD, fd, libc::O_CLOEXEC) })?;
    }
    Ok(())
}

fn park_placeholder_at(target: RawFd) -> io::Result<()> {
    // SAFETY: eventfd returns a new fd that we own; dup3 onto the target
    // replaces a number we reserve for ourselves; the temporary fd is then
    // closed.
    unsafe {
        let fd = check(libc::eventfd(0, libc::EFD_CLOEXEC))?;
        if fd != target {
            let r = libc::dup3(fd, target, libc::O_CLOEXEC);
            libc::close(fd);
            check(r)?;
        }
    }
    Ok(())
}

/// Parks `fd` at one of the reserved numbers ([`UPPER_FD`],
/// [`MASK_FILE_FD`], [`MASK_DIR_FD`]).
pub fn park(fd: OwnedFd, at: RawFd) -> io::Result<()> {
    debug_assert!([UPPER_FD, MASK_FILE_FD, MASK_DIR_FD].contains(&at));
    // SAFETY: dup3 onto our reserved number; `fd` is closed on drop.
    check(unsafe { libc::dup3(fd.as_raw_fd(), at, libc::O_CLOEXEC) })?;
    Ok(())
}

/// A new channel: the edge's end parked at fd 4, ours returned.
pub fn new_channel() -> io::Result<OwnedFd> {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two new fds that we own from here on.
    check(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) })?;
    // SAFETY: both fds were just created and are owned by nobody else.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: dup3 onto our reserved number; `theirs` is closed on drop.
    check(unsafe { libc::dup3(theirs.as_raw_fd(), REATTACH_FD, libc::O_CLOEXEC) })?;
    Ok(ours)
}

/// The edge has attached: forget its end.
pub fn release() {
    if let Err(e) = park_placeholder() {
        eprintln!("dsec-agent: cannot release fd {REATTACH_FD}: {e}");
    }
}
