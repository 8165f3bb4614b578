//! `dsec-agent spawner`: the edge's spawn helper (see dsec_spawn::protocol).
//!
//! Started by the edge when it starts, it keeps a tiny descriptor table, so
//! the clone of each agent copies almost nothing however many sandboxes the
//! edge holds. It clones with CLONE_PARENT: every agent is the edge's child.
//! It serves one request at a time and exits when the edge closes the socket.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use dsec_spawn::protocol;

pub fn run() -> Result<(), String> {
    // Our own binary, by its real path: exec'ing /proc/self/exe would name
    // every agent `exe` in ps and /proc/PID/comm.
    let exe = std::fs::read_link("/proc/self/exe").map_err(|e| format!("readlink /proc/self/exe: {e}"))?;
    let exe = std::ffi::CString::new(exe.into_os_string().into_encoded_bytes())
        .map_err(|_| "our own path contains NUL".to_string())?;
    // SAFETY: fd 3 is the socket the edge gave us (checked by fcntl in
    // main before calling here); we own it from now on.
    let sock = unsafe { OwnedFd::from_raw_fd(dsec_spawn::AGENT_CHANNEL_FD) };
    rustix::io::fcntl_setfd(&sock, rustix::io::FdFlags::CLOEXEC).map_err(|e| format!("fd 3: {e}"))?;
    let mut buf = [0u8; 64];
    loop {
        let (n, mut fds) = match protocol::recv_fds(sock.as_fd(), &mut buf) {
            Ok((0, _)) => return Ok(()), // the edge is gone
            Ok(v) => v,
            Err(e) => return Err(format!("spawner socket: {e}")),
        };
        // The channel, then optionally a network namespace to join.
        let netns = if fds.len() == 2 { fds.pop() } else { None };
        let channel = fds.pop();
        let answer = match (protocol::decode_request(&buf[..n]), channel) {
            (Some(flags), Some(channel)) => {
                let flags = flags as libc::c_int | libc::CLONE_PARENT;
                match dsec_spawn::spawn_in(&exe, "dsec-agent", &["container"], flags, channel.as_fd(), netns.as_ref().map(|n| n.as_fd())) {
                    Ok((pid, pidfd)) => protocol::send(sock.as_fd(), &protocol::encode_answer(pid, 0), Some(pidfd.as_fd())),
                    Err(e) => protocol::send(sock.as_fd(), &protocol::encode_answer(-1, e.raw_os_error().unwrap_or(libc::EIO)), None),
                }
            }
            _ => protocol::send(sock.as_fd(), &protocol::encode_answer(-1, libc::EINVAL), None),
        };
        answer.map_err(|e| format!("spawner socket: {e}"))?;
    }
}
