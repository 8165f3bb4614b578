//! `dsec-agent spawner`: the edge's spawn helper (see dsec_spawn::protocol).
//!
//! Started by the edge when it starts, it keeps a tiny descriptor table, so
//! the clone of each agent copies almost nothing however many sandboxes the
//! edge holds. It clones with CLONE_PARENT: every agent is the edge's child.
//! It serves one request at a time and exits when the edge closes the socket.
//!
//! By default an agent is a fork of the helper (`dsec_spawn::clone_fork`),
//! not a new execve of this binary: the helper is single-threaded and holds
//! nothing of the edge's, so its copy is a clean starting point, and the
//! exec's start-up (glibc's `cpuid` probing, which traps to the hypervisor
//! on a VM, and the relocation of the static-pie binary) is paid once per
//! helper instead of once per sandbox. The price: every agent of one helper
//! shares the helper's address-space layout. `--exec` (`dsec up
//! --agent-exec`) gives each agent a fresh layout at that cost.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use dsec_spawn::protocol;

use crate::setup_error::SetupError;
use crate::start_error::StartError;

pub fn run(exec_each: bool) -> Result<(), StartError> {
    // Forking is sound only while this process has one thread; it never
    // starts another, so checking once is enough.
    let fork = !exec_each && dsec_spawn::single_threaded().map_err(StartError::os("count our threads"))?;
    // Our own binary, by its real path: exec'ing /proc/self/exe would name
    // every agent `exe` in ps and /proc/PID/comm.
    let exe = std::fs::read_link("/proc/self/exe").map_err(StartError::os("readlink /proc/self/exe"))?;
    let exe = std::ffi::CString::new(exe.into_os_string().into_encoded_bytes())
        .map_err(|_| SetupError::new("our own path, which contains NUL", rustix::io::Errno::INVAL))?;
    // SAFETY: fd 3 is the socket the edge gave us (checked by fcntl in
    // main before calling here); we own it from now on.
    let sock = unsafe { OwnedFd::from_raw_fd(dsec_spawn::AGENT_CHANNEL_FD) };
    rustix::io::fcntl_setfd(&sock, rustix::io::FdFlags::CLOEXEC).map_err(|e| SetupError::new("fcntl fd 3", e))?;
    let mut buf = [0u8; 64];
    loop {
        let (n, mut fds) = match protocol::recv_fds(sock.as_fd(), &mut buf) {
            Ok((0, _)) => return Ok(()), // the edge is gone
            Ok(v) => v,
            Err(e) => return Err(StartError::Os { step: "receive from the spawner socket", source: e }),
        };
        // The channel, then optionally a network namespace to join.
        let netns = if fds.len() == 2 { fds.pop() } else { None };
        let channel = fds.pop();
        let answer = match (protocol::decode_request(&buf[..n]), channel) {
            (Some(flags), Some(channel)) => {
                let flags = flags as libc::c_int | libc::CLONE_PARENT;
                let started = if fork {
                    fork_agent(flags, channel, netns)
                } else {
                    dsec_spawn::spawn_in(&exe, "dsec-agent", &["container"], flags, channel.as_fd(), netns.as_ref().map(|n| n.as_fd()))
                };
                match started {
                    Ok((pid, pidfd)) => protocol::send(sock.as_fd(), &protocol::encode_answer(pid, 0), Some(pidfd.as_fd())),
                    Err(e) => protocol::send(sock.as_fd(), &protocol::encode_answer(-1, e.raw_os_error().unwrap_or(libc::EIO)), None),
                }
            }
            _ => protocol::send(sock.as_fd(), &protocol::encode_answer(-1, libc::EINVAL), None),
        };
        answer.map_err(StartError::os("answer on the spawner socket"))?;
    }
}

/// Forks a container agent into new namespaces (`flags`), joining `netns`
/// first if given, with `channel` as its fd 3. Returns in the helper only;
/// the child becomes the agent and exits when it ends.
fn fork_agent(flags: libc::c_int, channel: OwnedFd, netns: Option<OwnedFd>) -> std::io::Result<(i32, OwnedFd)> {
    // SAFETY: this process is single-threaded (checked in `run`), and the
    // agent code the child runs does not use glibc's cached thread id.
    match unsafe { dsec_spawn::clone_fork(flags)? } {
        dsec_spawn::Forked::Parent { pid, pidfd } => Ok((pid, pidfd)),
        dsec_spawn::Forked::Child => std::process::exit(become_agent(channel, netns)),
    }
}

/// In the forked child: the namespace, the channel on fd 3 in place of the
/// helper's socket, then the agent's ordinary start (which closes every
/// other descriptor the helper had).
fn become_agent(channel: OwnedFd, netns: Option<OwnedFd>) -> i32 {
    use std::os::fd::AsRawFd;
    if let Some(ns) = netns {
        if let Err(e) = rustix::thread::move_into_link_name_space(ns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network)) {
            eprintln!("dsec-agent: joining the network namespace: {e}");
            return 127;
        }
    }
    // SAFETY: dup2 onto fd 3 replaces this copy's reference to the helper's
    // socket (the helper keeps its own); `channel` stays open until the
    // agent's start closes every descriptor above 3.
    if unsafe { libc::dup2(channel.as_raw_fd(), dsec_spawn::AGENT_CHANNEL_FD) } < 0 {
        eprintln!("dsec-agent: channel onto fd 3: {}", std::io::Error::last_os_error());
        return 127;
    }
    // The descriptor numbers close with the agent's close_range; forget
    // the owner so nothing closes fd numbers twice.
    std::mem::forget(channel);
    crate::forked_container_agent()
}
