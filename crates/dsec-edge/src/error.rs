//! The edge's error type, with the API error code each maps to.

use dsec_agent_proto::{client::ClientError, AgentError, ErrorKind};
use dsec_api::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("invalid limits: {0}")]
    InvalidLimits(String),
    #[error("{0}")]
    UnsupportedBackend(String),
    #[error("{0}")]
    UnsupportedNetwork(String),
    #[error("sandbox {0} not found")]
    SandboxNotFound(String),
    #[error("{0}")]
    ImageNotFound(String),
    #[error("sandbox {id} is {state}, not running")]
    NotRunning { id: String, state: &'static str },
    #[error("sandbox {id} is {state}: its processes are gone, so it cannot be paused or resumed")]
    Ended { id: String, state: &'static str },
    /// The answer to a creation whose sandbox was stopped (or deleted)
    /// before it ran.
    #[error("sandbox {id} was stopped before it started: {reason}")]
    StoppedWhileCreating { id: String, reason: String },
    #[error("no capacity: {0}")]
    NoCapacity(String),
    #[error("creation queue full: {0}")]
    QueueFull(String),
    #[error("no sandbox of job {0:?} is visible here")]
    JobNotFound(String),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("the sandbox's agent is unavailable: {0}")]
    AgentUnavailable(String),
    /// A failure the agent reported for one operation.
    #[error("{}", .0.message)]
    Agent(AgentError),
    #[error("sandbox setup failed: {0}")]
    SetupFailed(String),
    /// A system call about one sandbox (its pidfd, its network
    /// namespace, a socket of its own) failed.
    #[error("{call} of {id}: {source}")]
    SandboxSys {
        id: String,
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A program the edge runs for a sandbox (qemu-img, a command in the
    /// guest) failed.
    #[error("{program} failed: {detail}")]
    Command { program: &'static str, detail: String },
    /// A peer of the edge's own (the guest agent, QEMU) answered with
    /// what the protocol does not allow at that point.
    #[error("{peer} answered {op} with {reply}")]
    UnexpectedReply { peer: &'static str, op: &'static str, reply: String },
    /// The process recorded for a sandbox is no longer its own (it ended
    /// and its pid may be reused).
    #[error("pid {pid} is no longer the {what} of {id}")]
    ProcessReplaced { id: String, pid: i32, what: &'static str },
    /// No process was recorded for a sandbox that should have one.
    #[error("sandbox {0} has no recorded process")]
    NoProcess(String),
    /// QEMU ended a migration (suspend to disk, a memory snapshot) with
    /// a failure of its own.
    #[error("QEMU migration {state}: {why}")]
    Migration { state: String, why: String },
    /// The QEMU kept ready for the next microVM did not start.
    #[error("the standby QEMU did not come up: {0}")]
    StandbyFailed(String),
    /// Work was refused because the edge is stopping.
    #[error("the edge is shutting down")]
    ShuttingDown,
    /// Something the node must have for this sandbox is missing (the
    /// guest agent binary, a cgroup2 mount, a mounted layer).
    #[error("{0}")]
    NodeSetup(String),
    /// The node's egress machinery (eBPF programs, resolver, warm pool).
    #[error("egress: {0}")]
    Net(Box<dsec_net::NetError>),
    /// The node's swap file for paused sandboxes.
    #[error(transparent)]
    Swap(#[from] crate::pause::swap::SwapError),
    /// The DAX copy of a layer a full VM maps as pmem could not be made.
    #[error("making the pmem copy of a layer: {0}")]
    PmemCopy(Box<dsec_image::BuildError>),
    /// A full VM's screen could not be captured.
    #[error(transparent)]
    Screen(Box<crate::backends::fullvm::screen::ScreenError>),
    /// A broken invariant of the edge's own: a bug, never the caller's
    /// fault.
    #[error("internal invariant broken: {0}")]
    Invariant(&'static str),
    /// A file system call of the edge's own (its state, run and scratch
    /// directories, logs, images of suspended VMs).
    #[error("{action} {}: {source}", .path.display())]
    Io {
        action: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A system call on a descriptor of the edge's own (a pidfd, a
    /// channel socket, a log file).
    #[error("{call}: {source}")]
    Sys {
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A record the edge wrote itself (a stored spec, step or outcome)
    /// that does not read back.
    #[error("{what}: {source}")]
    Stored {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// A cgroup of a sandbox or of the node (created, moved into, removed).
    #[error(transparent)]
    Cgroup(crate::cgroup::CgroupError),
    /// The edge's own database of sandboxes.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The trajectory journal (steps, idempotency keys).
    #[error(transparent)]
    Journal(#[from] crate::trajectory::journal::JournalError),
    /// A task the edge spawned (blocking work, or work that must finish
    /// when its caller goes away) panicked or was cancelled.
    #[error("{what} task failed: {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    /// Boxed (as `Layers`): an error object of QEMU's is a JSON value.
    #[error(transparent)]
    Qmp(Box<crate::backends::qemu::qmp::QmpError>),
    /// Boxed: the image store's errors are large, and every edge call
    /// returns an `EdgeError`.
    #[error(transparent)]
    Layers(Box<crate::images::error::LayerError>),
    #[error("step {step_id:?} (#{seq}) was recorded as a different operation ({recorded}): {detail}; a step id names one operation, use a new one")]
    StepConflict { step_id: String, seq: u64, recorded: String, detail: String },
    #[error("step {step_id:?} (#{seq}) was running when the edge lost it (a restart or a lost agent): whether it took effect is unknown; check the sandbox and continue with a new step id")]
    StepInterrupted { step_id: String, seq: u64 },
    /// A failure recorded in the trajectory log, returned again.
    #[error("{message}")]
    Recorded { code: ErrorCode, message: String },
    #[error("sandbox {0} has no trajectory log (no operation was recorded)")]
    TrajectoryNotFound(String),
    #[error("idempotency key {0:?} was used for a different request")]
    IdempotencyConflict(String),
    #[error("{0}")]
    NetworkRule(String),
    #[error("{0}")]
    UnknownNetworkService(String),
    #[error("{0}")]
    NetworkNotEnabled(String),
    #[error("no snapshot named {0:?} is visible here")]
    SnapshotNotFound(String),
    #[error("{0}")]
    SnapshotInUse(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    NoScreen(String),
    /// Nothing accepts connections on the sandbox's port.
    #[error("{0}")]
    PortClosed(String),
    /// The node's disk of writable layers and volumes.
    #[error(transparent)]
    Disk(#[from] crate::disk::DiskError),
    #[error("{0}")]
    VolumeInUse(String),
    #[error("{0}")]
    VolumesUnavailable(String),
}

impl From<crate::images::error::LayerError> for EdgeError {
    fn from(e: crate::images::error::LayerError) -> Self {
        EdgeError::Layers(Box::new(e))
    }
}

impl EdgeError {
    /// For `map_err` on a file system call: "`action` `path`: why".
    /// The path is copied only when the call failed.
    pub fn io<'a>(action: &'static str, path: &'a std::path::Path) -> impl FnOnce(std::io::Error) -> EdgeError + 'a {
        move |source| EdgeError::Io { action, path: path.to_path_buf(), source }
    }

    /// For `map_err` on a system call on one of the edge's descriptors.
    pub fn sys(call: &'static str) -> impl FnOnce(std::io::Error) -> EdgeError {
        move |source| EdgeError::Sys { call, source }
    }

    /// For `map_err` on a system call about sandbox `id`.
    pub fn sandbox_sys<'a>(id: &'a str, call: &'static str) -> impl FnOnce(std::io::Error) -> EdgeError + 'a {
        move |source| EdgeError::SandboxSys { id: id.to_string(), call, source }
    }

    /// For `map_err` on the join of a spawned task.
    pub fn task(what: &'static str) -> impl FnOnce(tokio::task::JoinError) -> EdgeError {
        move |source| EdgeError::Task { what, source }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            EdgeError::Invalid(_) => ErrorCode::InvalidRequest,
            EdgeError::SnapshotNotFound(_) => ErrorCode::SnapshotNotFound,
            EdgeError::SnapshotInUse(_) => ErrorCode::SnapshotInUse,
            EdgeError::AlreadyExists(_) => ErrorCode::AlreadyExists,
            EdgeError::InvalidLimits(_) => ErrorCode::InvalidLimits,
            EdgeError::UnsupportedBackend(_) => ErrorCode::UnsupportedBackend,
            EdgeError::UnsupportedNetwork(_) => ErrorCode::UnsupportedNetworkPolicy,
            EdgeError::SandboxNotFound(_) => ErrorCode::SandboxNotFound,
            EdgeError::ImageNotFound(_) => ErrorCode::ImageNotFound,
            EdgeError::NotRunning { .. } => ErrorCode::SandboxNotRunning,
            EdgeError::Ended { .. } | EdgeError::StoppedWhileCreating { .. } => ErrorCode::SandboxEnded,
            EdgeError::NoCapacity(_) => ErrorCode::NoCapacity,
            EdgeError::QueueFull(_) => ErrorCode::CreationQueueFull,
            EdgeError::JobNotFound(_) => ErrorCode::JobNotFound,
            EdgeError::Timeout(_) => ErrorCode::Timeout,
            EdgeError::AgentUnavailable(_) => ErrorCode::AgentUnavailable,
            EdgeError::Agent(e) => agent_code(e.kind),
            EdgeError::SetupFailed(_)
            | EdgeError::SandboxSys { .. }
            | EdgeError::Command { .. }
            | EdgeError::UnexpectedReply { .. }
            | EdgeError::ProcessReplaced { .. }
            | EdgeError::NoProcess(_)
            | EdgeError::Migration { .. }
            | EdgeError::StandbyFailed(_)
            | EdgeError::ShuttingDown
            | EdgeError::NodeSetup(_)
            | EdgeError::Net(_)
            | EdgeError::Swap(_)
            | EdgeError::Screen(_)
            | EdgeError::PmemCopy(_)
            | EdgeError::Invariant(_)
            | EdgeError::Io { .. }
            | EdgeError::Sys { .. }
            | EdgeError::Stored { .. }
            | EdgeError::Cgroup(_)
            | EdgeError::Store(_)
            | EdgeError::Journal(_)
            | EdgeError::Task { .. }
            | EdgeError::Layers(_)
            | EdgeError::Qmp(_) => ErrorCode::Internal,
            EdgeError::StepConflict { .. } => ErrorCode::StepConflict,
            EdgeError::StepInterrupted { .. } => ErrorCode::StepInterrupted,
            EdgeError::Recorded { code, .. } => *code,
            EdgeError::TrajectoryNotFound(_) => ErrorCode::TrajectoryNotFound,
            EdgeError::IdempotencyConflict(_) => ErrorCode::IdempotencyConflict,
            EdgeError::NetworkRule(_) => ErrorCode::InvalidNetworkRule,
            EdgeError::UnknownNetworkService(_) => ErrorCode::UnknownNetworkService,
            EdgeError::NetworkNotEnabled(_) => ErrorCode::NetworkNotEnabled,
            EdgeError::NoScreen(_) => ErrorCode::NoScreen,
            EdgeError::PortClosed(_) => ErrorCode::PortClosed,
            EdgeError::Disk(e) => disk_code(e),
            EdgeError::VolumeInUse(_) => ErrorCode::VolumeInUse,
            EdgeError::VolumesUnavailable(_) => ErrorCode::VolumesUnavailable,
        }
    }
}

fn disk_code(e: &crate::disk::DiskError) -> ErrorCode {
    use crate::disk::DiskError;
    match e {
        DiskError::Invalid(_) => ErrorCode::InvalidRequest,
        DiskError::VolumeExists(_) => ErrorCode::AlreadyExists,
        DiskError::VolumeNotFound(_) => ErrorCode::VolumeNotFound,
        DiskError::Io { .. } | DiskError::Mkfs { .. } | DiskError::NotBtrfs(_) => ErrorCode::Internal,
    }
}

fn agent_code(kind: ErrorKind) -> ErrorCode {
    match kind {
        ErrorKind::NotFound => ErrorCode::FileNotFound,
        ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
        ErrorKind::AlreadyExists => ErrorCode::AlreadyExists,
        ErrorKind::NotADirectory => ErrorCode::NotADirectory,
        ErrorKind::IsADirectory => ErrorCode::IsADirectory,
        ErrorKind::DirectoryNotEmpty => ErrorCode::DirectoryNotEmpty,
        ErrorKind::InvalidPath => ErrorCode::InvalidPath,
        ErrorKind::InvalidArgument => ErrorCode::InvalidRequest,
        ErrorKind::NoSpace => ErrorCode::NoSpace,
        ErrorKind::TooLarge => ErrorCode::PayloadTooLarge,
        ErrorKind::UnknownSession => ErrorCode::SessionNotFound,
        ErrorKind::UnknownUser => ErrorCode::UserNotFound,
        ErrorKind::SpawnFailed => ErrorCode::SpawnFailed,
        ErrorKind::Cancelled => ErrorCode::Timeout,
        ErrorKind::Unsupported => ErrorCode::InvalidRequest,
        ErrorKind::SetupFailed | ErrorKind::Protocol | ErrorKind::Io => ErrorCode::Internal,
    }
}

impl From<crate::cgroup::CgroupError> for EdgeError {
    fn from(e: crate::cgroup::CgroupError) -> Self {
        match e {
            crate::cgroup::CgroupError::FreezeTimeout(..) => EdgeError::Timeout(e.to_string()),
            other => EdgeError::Cgroup(other),
        }
    }
}

impl From<ClientError> for EdgeError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Agent(a) => EdgeError::Agent(a),
            // The agent is fine, only too old for this request.
            e @ ClientError::Unsupported { .. } => EdgeError::Agent(AgentError::new(ErrorKind::Unsupported, e.to_string())),
            other => EdgeError::AgentUnavailable(other.to_string()),
        }
    }
}
