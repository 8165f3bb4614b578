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
}
