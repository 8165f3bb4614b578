//! Starting guest agents as PID 1 of fresh namespaces.
//!
//! The edge does not clone agents itself: a clone copies the caller's file
//! descriptor table, and the edge holds a few descriptors per sandbox, so
//! creation would slow down as the node fills. A small helper started when
//! the edge starts (`dsec-agent spawner`, a handful of descriptors) clones
//! each agent with CLONE_PARENT, so the agent is still the edge's child and
//! the edge gets its pidfd (see `dsec_spawn::protocol`). If the helper dies,
//! the next spawn starts a new one.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use dsec_spawn::protocol;

pub use dsec_spawn::{pidfd_getfd, pidfd_kill, pidfd_open, reap};

/// Namespaces of a container sandbox. The cgroup namespace is entered by the
/// agent itself, after the edge has moved it into its cgroup.
pub const CONTAINER_NAMESPACES: libc::c_int =
    libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWNET;

pub struct SpawnedAgent {
    pub pid: i32,
    /// Refers to the agent process for its whole life (no pid reuse races).
    pub pidfd: OwnedFd,
    /// The edge's end of the agent's channel.
    pub channel: UnixStream,
}

/// The spawn helper: a child of the edge that clones agents for it.
struct Helper {
    sock: OwnedFd,
    pidfd: OwnedFd,
}

impl Drop for Helper {
    fn drop(&mut self) {
        // Closing the socket ends the helper; kill it anyway (it may be
        // wedged) and reap it.
        let _ = pidfd_kill(&self.pidfd, libc::SIGKILL);
        reap(&self.pidfd);
    }
}

pub struct Spawner {
    agent_path: CString,
    /// Each agent execs the binary afresh (instead of being forked from the
    /// helper; see the agent's spawner.rs).
    exec_each: bool,
    helper: Mutex<Option<Helper>>,
}

enum AskError {
    /// The helper is gone or broken: start another one.
    Helper(std::io::Error),
    /// The helper ran the clone and it failed.
    Spawn(std::io::Error),
}

impl Spawner {
    /// Starts the helper now, while the edge's descriptor table is small.
    pub fn new(agent_path: CString, exec_each: bool) -> std::io::Result<Spawner> {
        let helper = start_helper(&agent_path, exec_each)?;
        Ok(Spawner { agent_path, exec_each, helper: Mutex::new(Some(helper)) })
    }

    /// Starts `dsec-agent container` in new namespaces with a fresh channel.
    pub fn spawn(&self, ns_flags: libc::c_int) -> std::io::Result<SpawnedAgent> {
        self.spawn_in(ns_flags, None)
    }

    /// Like `spawn`, the agent joining network namespace `netns` (leave
    /// CLONE_NEWNET out of `ns_flags`).
    pub fn spawn_in(&self, ns_flags: libc::c_int, netns: Option<std::os::fd::BorrowedFd<'_>>) -> std::io::Result<SpawnedAgent> {
        let (ours, theirs) = UnixStream::pair()?;
        let mut guard = self.helper.lock().unwrap_or_else(|p| p.into_inner());
        let mut last = None;
        for _attempt in 0..2 {
            if guard.is_none() {
                *guard = Some(start_helper(&self.agent_path, self.exec_each)?);
            }
            let helper = guard.as_ref().expect("a helper was just started");
            match ask(helper, ns_flags, &theirs, netns) {
                Ok((pid, pidfd)) => return Ok(SpawnedAgent { pid, pidfd, channel: ours }),
                Err(AskError::Spawn(e)) => return Err(e),
                Err(AskError::Helper(e)) => {
                    tracing::warn!(error = %e, "the spawn helper failed; starting a new one");
                    *guard = None;
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("spawn helper unavailable")))
    }
}

fn start_helper(agent_path: &CString, exec_each: bool) -> std::io::Result<Helper> {
    let (ours, theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    let args: &[&str] = if exec_each { &["spawner", "--exec"] } else { &["spawner"] };
    let (_pid, pidfd) = dsec_spawn::spawn(agent_path, "dsec-agent", args, 0, theirs.as_fd())?;
    Ok(Helper { sock: ours, pidfd })
}

fn ask(
    h: &Helper,
    ns_flags: libc::c_int,
    channel: &UnixStream,
    netns: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<(i32, OwnedFd), AskError> {
    let mut fds = vec![channel.as_fd()];
    fds.extend(netns);
    protocol::send_fds(h.sock.as_fd(), &protocol::encode_request(ns_flags as u32), &fds).map_err(AskError::Helper)?;
    let mut buf = [0u8; protocol::ANSWER_BYTES];
    let (n, pidfd) = protocol::recv(h.sock.as_fd(), &mut buf).map_err(AskError::Helper)?;
    let Some((pid, errno)) = protocol::decode_answer(&buf[..n]) else {
        return Err(AskError::Helper(std::io::Error::other("the spawn helper closed or sent garbage")));
    };
    if errno != 0 {
        return Err(AskError::Spawn(std::io::Error::from_raw_os_error(errno)));
    }
    match pidfd {
        Some(fd) => Ok((pid, fd)),
        None => Err(AskError::Helper(std::io::Error::other("the spawn helper sent no pidfd"))),
    }
}
