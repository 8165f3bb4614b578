//! Operations carried out by a sandbox's guest agent: exec, sessions, PTYs
//! and files. The edge checks ownership and state, resumes a paused sandbox
//! first (transparently), counts the request as activity (for the idle TTL)
//! and forwards it over the agent channel.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dsec_agent_proto::client::Call;
use dsec_agent_proto::{ExecResult, ExecSpec, Op, Reply, WriteFileSpec};

use crate::backends::instance::Instance;
use crate::edge::{ActivityGuard, Edge, Entry};
use crate::error::EdgeError;
use crate::model::{BackendKind, Caller, State};

/// What a caller may ask of a running sandbox's agent outside the
/// trajectory log: reads, and the streams the node's own services use
/// (FnCall runners install their programs and start their monitors with
/// them). A closed set, so the HTTP layer cannot reach the agent's
/// lifecycle operations (set-up, identity, shutdown, audit records,
/// change walks): those stay inside the edge. Logged operations go through
/// [`Edge::run_step`] and its siblings as a [`crate::StepOp`].
#[derive(Debug, Clone, PartialEq)]
pub enum AgentRequest {
    /// Reply: `Stat`.
    Stat { path: String },
    /// Reply: `Dir`.
    ListDir { path: String },
    /// The refused attempts recorded after `after`. Reply: `Audit`.
    AuditEvents { after: u64 },
    /// A file's content as `Data` frames. Reply: `Done`.
    ReadFile { path: String, offset: u64, limit: Option<u64> },
    /// A directory as a tar stream. Reply: `Done`.
    TarCreate { path: String },
    /// A file written from `Data` frames. Reply: `Written`.
    WriteFile(WriteFileSpec),
    /// A command, unlogged. Reply: `Exited`.
    Exec(ExecSpec),
}

impl AgentRequest {
    fn into_op(self) -> Op {
        match self {
            AgentRequest::Stat { path } => Op::Stat { path },
            AgentRequest::ListDir { path } => Op::ListDir { path },
            AgentRequest::AuditEvents { after } => Op::AuditEvents { after },
            AgentRequest::ReadFile { path, offset, limit } => Op::ReadFile { path, offset, limit },
            AgentRequest::TarCreate { path } => Op::TarCreate { path },
            AgentRequest::WriteFile(spec) => Op::WriteFile(spec),
            AgentRequest::Exec(spec) => Op::Exec(spec),
        }
    }
}

/// Extra time the edge waits beyond a command's own timeout and kill grace
/// before giving up on the agent.
const EXEC_SLACK: Duration = Duration::from_secs(10);

impl Edge {
    pub(crate) async fn running(&self, caller: &Caller, id: &str) -> Result<(Arc<Entry>, Arc<Instance>), EdgeError> {
        let entry = self.entry(caller, id)?;
        if entry.state().is_paused() {
            self.resume(caller, id).await?;
        }
        let state = entry.state();
        match (state, entry.instance()) {
            (State::Running, Some(inst)) => Ok((entry, inst)),
            (state, _) => Err(EdgeError::NotRunning { id: id.to_string(), state: state.as_str() }),
        }
    }

    /// The root directory of a running container sandbox as the host sees
    /// it: `/proc/PID/root` of its agent (PID 1 inside), beneath which a
    /// path resolves in the sandbox's own mount namespace. For the node's
    /// own services that meet a process of theirs inside at a Unix socket
    /// (FnCall runners); a VM's files have no such view.
    pub async fn container_root(&self, caller: &Caller, id: &str) -> Result<PathBuf, EdgeError> {
        let (entry, inst) = self.running(caller, id).await?;
        match entry.record().spec.backend {
            BackendKind::Container => Ok(PathBuf::from(format!("/proc/{}/root", inst.pid))),
            other => Err(EdgeError::UnsupportedBackend(format!("{id} is a {other:?} sandbox: its files have no host view"))),
        }
    }

    /// Runs a command to completion (buffered output).
    pub async fn exec(&self, caller: &Caller, id: &str, spec: ExecSpec) -> Result<ExecResult, EdgeError> {
        let (entry, inst) = self.running(caller, id).await?;
        let _activity = entry.begin();
        self.exec_on(&inst, spec).await
    }

    /// Runs a command on a running sandbox's agent, bounded by the command's
    /// own timeout plus slack.
    pub(crate) async fn exec_on(&self, inst: &Instance, spec: ExecSpec) -> Result<ExecResult, EdgeError> {
        self.inner.counters.exec();
        let deadline = spec.timeout_ms.map(|t| Duration::from_millis(t + spec.kill_grace_ms) + EXEC_SLACK);
        let t0 = std::time::Instant::now();
        let call = inst.agent.call(Op::Exec(spec));
        let reply = match deadline {
            Some(d) => tokio::time::timeout(d, call)
                .await
                .map_err(|_| EdgeError::AgentUnavailable("the agent did not finish a timed-out command".into()))
                .and_then(|r| r.map_err(EdgeError::from)),
            None => call.await.map_err(EdgeError::from),
        };
        self.inner.counters.exec_done(t0.elapsed());
        let reply = reply?;
        match reply {
            Reply::Exited(r) => Ok(r),
            other => Err(EdgeError::UnexpectedReply { peer: "the agent", op: "exec", reply: format!("{other:?}") }),
        }
    }

    /// A request without data streams (stat, list, mkdir, remove, sessions).
    pub async fn call(&self, caller: &Caller, id: &str, req: AgentRequest) -> Result<Reply, EdgeError> {
        let (entry, inst) = self.running(caller, id).await?;
        let _activity = entry.begin();
        Ok(inst.agent.call(req.into_op()).await?)
    }

    /// A request with data streams (streaming exec, PTY, file and tar
    /// transfers). The guard counts the stream as activity until dropped.
    pub async fn open(&self, caller: &Caller, id: &str, req: AgentRequest) -> Result<(Call, ActivityGuard), EdgeError> {
        let (entry, inst) = self.running(caller, id).await?;
        let activity = entry.begin();
        let call = inst.agent.open(req.into_op()).await?;
        Ok((call, activity))
    }
}
