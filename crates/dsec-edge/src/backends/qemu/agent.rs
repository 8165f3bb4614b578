//! Talking to a VM's guest agent over the virtio-serial socket QEMU
//! serves: the boot tail of a fresh guest (handshake, setup, resolver,
//! within the boot timeout), and re-attachment to one that was set up
//! before (after an edge restart, a restore).

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use dsec_agent_proto::client::AgentClient;
use dsec_agent_proto::{AgentState, Op, Reply, VmSetup};

use super::cmdline::{Accel, VmFiles};
use super::process::{console_tail, process_exited};
use crate::backends::container::spawn::pidfd_open;
use crate::backends::instance::Instance;
use crate::cgroup::Cgroups;
use crate::error::EdgeError;

/// How long a guest may take to boot to its agent, and how a boot that
/// did not is told.
pub(crate) struct BootWait {
    pub timeout: Duration,
    pub accel: Accel,
    /// What boots, for the message ("microVM", "VM").
    pub what: &'static str,
    /// Added to a timeout's message (what to check).
    pub hint: &'static str,
}

impl BootWait {
    /// The error of a boot that did not reach its agent in time.
    pub fn timed_out(&self, files: &VmFiles) -> EdgeError {
        EdgeError::Timeout(format!(
            "the {} did not boot to its agent within {:?} ({} acceleration{}){}",
            self.what,
            self.timeout,
            self.accel.as_str(),
            self.hint,
            console_tail(files)
        ))
    }
}

/// The boot tail of both VM backends, once a fresh guest's QEMU (`qemu`)
/// runs: waits for its agent, has it set the sandbox up (`setup`) and, for
/// a networked sandbox, points its resolver at the node's (`resolv_conf`),
/// all within `wait.timeout`. Errors carry the console's last lines,
/// except an unknown `init_user`, the caller's error as the agent gave it.
pub(crate) async fn boot_to_ready(
    files: &VmFiles,
    qemu: &OwnedFd,
    setup: VmSetup,
    resolv_conf: Option<String>,
    wait: &BootWait,
) -> Result<AgentClient, EdgeError> {
    let booted = async {
        let agent = boot_agent(&files.agent_socket(), qemu, setup).await?;
        if let Some(conf) = resolv_conf {
            super::net::write_resolv_conf(&agent, conf).await?;
        }
        Ok::<_, EdgeError>(agent)
    };
    match tokio::time::timeout(wait.timeout, booted).await {
        Ok(Ok(agent)) => Ok(agent),
        Ok(Err(EdgeError::Agent(a))) if a.kind == dsec_agent_proto::ErrorKind::UnknownUser => Err(EdgeError::Agent(a)),
        Ok(Err(e)) => Err(EdgeError::SetupFailed(format!("{e}{}", console_tail(files)))),
        Err(_) => Err(wait.timed_out(files)),
    }
}

/// Connects to a fresh guest agent and has it set the sandbox up (shared
/// by both VM backends).
pub(crate) async fn boot_agent(socket: &Path, qemu: &OwnedFd, setup: VmSetup) -> Result<AgentClient, EdgeError> {
    let stream = connect_agent(socket, qemu).await?;
    let (agent, hello) = AgentClient::answer(stream).await?;
    if hello.state != AgentState::Fresh {
        return Err(EdgeError::SetupFailed(format!("the guest agent greeted with {:?}", hello.state)));
    }
    match agent.call(Op::SetupVm(setup)).await? {
        Reply::Ready => Ok(agent),
        other => Err(EdgeError::SetupFailed(format!("unexpected reply to setup: {other:?}"))),
    }
}

/// Re-attaches to the running VM `id` whose QEMU is `pid` (after an edge
/// restart; `Backend::adopt` of both VM backends); a networked VM's
/// namespace is kept by the edge again (`egress`: the node's).
pub(crate) async fn reattach(
    cgroups: &Cgroups,
    egress: Option<&dsec_net::Egress>,
    id: &str,
    pid: i32,
    socket: &Path,
) -> Result<Instance, EdgeError> {
    if !cgroups.contains(id, pid) {
        return Err(EdgeError::ProcessReplaced { id: id.to_string(), pid, what: "QEMU" });
    }
    let pidfd = pidfd_open(pid).map_err(EdgeError::sys("pidfd_open of QEMU"))?;
    let agent = attach_ready(id, &pidfd, socket).await?;
    if let Some(eg) = super::net::egress_of(egress, id) {
        super::net::keep_netns_of(eg, id, pid)?;
    }
    Ok(Instance::new(pid, pidfd, agent))
}

/// Connects to the agent of a VM that was set up before (re-adoption,
/// restore): it greets as ready, with its sandbox id.
pub(crate) async fn attach_ready(id: &str, pidfd: &OwnedFd, socket: &Path) -> Result<AgentClient, EdgeError> {
    let attach = async {
        let stream = connect_agent(socket, pidfd).await?;
        let (agent, hello) = AgentClient::connect(stream).await?;
        match hello.state {
            AgentState::Ready { sandbox_id } if sandbox_id == id => Ok(agent),
            other => Err(EdgeError::UnexpectedReply { peer: "the agent", op: "re-attach", reply: format!("{other:?}") }),
        }
    };
    tokio::time::timeout(REATTACH_WAIT, attach).await.map_err(|_| EdgeError::Timeout(format!("re-attaching to the VM {id}")))?
}

/// How long re-adoption waits for a guest agent to greet.
const REATTACH_WAIT: Duration = Duration::from_secs(10);

/// Connects to the agent's socket, which QEMU creates while it starts;
/// gives up if QEMU exits first.
pub(crate) async fn connect_agent(path: &Path, qemu: &OwnedFd) -> Result<tokio::net::UnixStream, EdgeError> {
    let t0 = Instant::now();
    loop {
        match tokio::net::UnixStream::connect(path).await {
            Ok(s) => return Ok(s),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => {
                if process_exited(qemu) {
                    return Err(EdgeError::SetupFailed("QEMU exited during start".into()));
                }
                if t0.elapsed() > Duration::from_secs(10) {
                    return Err(EdgeError::Timeout(format!("QEMU made no agent socket at {}", path.display())));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => return Err(EdgeError::io("connecting to", path)(e)),
        }
    }
}
