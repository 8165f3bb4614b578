//! Audit events: attempts of a sandbox's processes that the policy refused.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One refused attempt.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, ToSchema)]
pub struct AuditEvent {
    /// 1, 2, ... per sandbox; a gap means events were dropped.
    pub seq: u64,
    /// When, in milliseconds since the epoch.
    pub time_ms: u64,
    /// `syscall`: a system call the sandbox's filter refuses.
    pub kind: String,
    /// The process inside the sandbox (its pid there).
    pub pid: u32,
    /// What was refused and how, e.g. `mount refused with EPERM (by sh)`.
    pub detail: String,
}

/// `GET /v1/sandboxes/{id}/audit?after=SEQ`: the events after `after`
/// (oldest first, at most 256; page with the last `seq`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, ToSchema)]
pub struct AuditEvents {
    pub sandbox_id: String,
    pub events: Vec<AuditEvent>,
    /// Events recorded since the sandbox started.
    pub total: u64,
    /// Events no longer kept (each sandbox keeps its last 256).
    pub dropped: u64,
}
