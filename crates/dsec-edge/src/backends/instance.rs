//! A running sandbox's runtime handles, whatever its backend.

use std::os::fd::OwnedFd;

use dsec_agent_proto::client::AgentClient;

pub struct Instance {
    /// Host pid of the guest agent (PID 1 inside the sandbox).
    pub pid: i32,
    pub pidfd: OwnedFd,
    pub agent: AgentClient,
}

impl Instance {
    pub fn new(pid: i32, pidfd: OwnedFd, agent: AgentClient) -> Self {
        Self { pid, pidfd, agent }
    }

    /// SIGKILL to the sandbox's process. For a container that is PID 1 of
    /// its pid namespace: the kernel kills every other process in it first.
    pub fn kill(&self) -> std::io::Result<()> {
        dsec_spawn::pidfd_kill(&self.pidfd, libc::SIGKILL)
    }

    /// Waits for the process to exit and collects its status. Blocking.
    pub fn reap(&self) -> Option<i32> {
        dsec_spawn::reap(&self.pidfd)
    }

    /// True once the process has exited.
    pub fn has_exited(&self) -> bool {
        crate::backends::qemu::process::process_exited(&self.pidfd)
    }
}
