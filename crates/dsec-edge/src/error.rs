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
    #[error("internal error: {0}")]
    Internal(String),
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
}

impl EdgeError {
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
            EdgeError::SetupFailed(_) | EdgeError::Internal(_) => ErrorCode::Internal,
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
        }
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
            other => EdgeError::Internal(other.to_string()),
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
