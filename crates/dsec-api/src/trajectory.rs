use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The header that names a client step on every operation that changes a
/// sandbox (exec, sessions, file and archive uploads, mkdir, remove).
/// Re-issuing a step id that is already in the sandbox's trajectory log
/// returns the recorded result without running the operation again.
pub const STEP_ID_HEADER: &str = "x-dsec-step-id";

/// The header of a creation's idempotency key: a retry with the same key
/// (same tenant, same body) returns the same sandbox.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// A file an operation wrote, made or removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChangedFile {
    pub path: String,
    /// `deleted`, or `changed` (written, made, renamed, its metadata set).
    pub change: String,
}

/// One operation of a sandbox's trajectory log.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TrajectoryStep {
    /// Position in the log, from 1.
    pub seq: u64,
    pub step_id: Option<String>,
    /// `exec`, `open_session`, `close_session`, `write_file`, `mkdir`,
    /// `remove`, `extract_archive`.
    pub kind: String,
    /// `running`, `done`, or `interrupted` (it was running when the edge
    /// lost it: whether it took effect is unknown).
    pub status: String,
    /// The operation as recorded (kind-specific fields; uploads by their
    /// content's SHA-256 and size).
    #[schema(value_type = Object)]
    pub operation: serde_json::Value,
    /// What the operation's endpoint answered (an `ExecResponse` for exec,
    /// `SessionInfo`, `WriteResult`), when it succeeded.
    #[schema(value_type = Object)]
    pub result: Option<serde_json::Value>,
    /// The error it answered, when it failed inside the sandbox.
    pub error: Option<crate::ErrorDetail>,
    /// Files changed while it ran; null when unknown.
    pub changed_files: Option<Vec<ChangedFile>>,
    /// More files changed than are listed.
    pub changed_truncated: bool,
    pub started_at: String,
    pub finished_at: Option<String>,
}

/// `GET /v1/sandboxes/{id}/trajectory`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Trajectory {
    pub sandbox_id: String,
    pub steps: Vec<TrajectoryStep>,
}

/// Where a replayed step's outcome differs from the recorded one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Divergence {
    pub seq: u64,
    pub step_id: Option<String>,
    pub kind: String,
    /// `exit_code`, `signal`, `stdout`, `stderr`, `error`, or `skipped`
    /// (the step could not be replayed: it has no recorded outcome, or its
    /// upload was too large to keep).
    pub field: String,
    pub recorded: String,
    pub replayed: String,
}

/// `POST /v1/sandboxes/{id}/replay`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReplayReport {
    pub source_id: String,
    /// The fresh sandbox that re-ran the log.
    pub replay_id: String,
    /// The replay sandbox was kept running (`keep=true`); otherwise removed.
    pub kept: bool,
    pub steps: usize,
    pub replayed: usize,
    /// No divergence at all.
    pub identical: bool,
    pub divergences: Vec<Divergence>,
}
