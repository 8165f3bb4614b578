//! The one table of error codes. The HTTP API answers every failure with
//! `{"error": {"code": CODE, "message": TEXT}}` and the status below; the
//! Python SDK raises the exception class named for the code. The SDK ships
//! the same table as `sdk/python/dsec/error_codes.json`; a test keeps the two
//! equal (regenerate with `DSEC_WRITE_ERROR_CODES=1 cargo test -p dsec-api`).

use serde::{Deserialize, Serialize};

macro_rules! error_codes {
    ($( $variant:ident = ($code:literal, $status:literal, $doc:literal), )*) => {
        /// A stable, machine-readable reason for a failed request.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum ErrorCode {
            $( #[doc = $doc] $variant, )*
        }

        impl ErrorCode {
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as it appears on the wire.
            pub fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $code,)* }
            }

            /// The HTTP status that carries this code.
            pub fn http_status(self) -> u16 {
                match self { $(ErrorCode::$variant => $status,)* }
            }

            pub fn description(self) -> &'static str {
                match self { $(ErrorCode::$variant => $doc,)* }
            }
        }
    };
}

error_codes! {
    InvalidRequest = ("invalid_request", 400, "The request is malformed: bad JSON, an unknown field, a missing or ill-typed value."),
    InvalidLimits = ("invalid_limits", 400, "A resource limit is impossible (zero, negative, or above the node's maximum)."),
    InvalidPath = ("invalid_path", 400, "A file path is not absolute, contains '..', or is otherwise unusable."),
    UnsupportedBackend = ("unsupported_backend", 400, "The requested backend is not available on this platform."),
    UnsupportedNetworkPolicy = ("unsupported_network_policy", 400, "The requested network rules cannot be enforced by this platform."),
    UserNotFound = ("user_not_found", 400, "The named user does not exist in the sandbox's image."),
    UnsupportedLanguage = ("unsupported_language", 400, "No FnCall runner pool serves this language on this platform."),
    SpawnFailed = ("spawn_failed", 400, "The program could not be started (not found or not executable)."),
    NotADirectory = ("not_a_directory", 400, "A path component that must be a directory is not one."),
    IsADirectory = ("is_a_directory", 400, "The path is a directory where a file was expected."),
    Unauthorized = ("unauthorized", 401, "The bearer token is missing or wrong."),
    Forbidden = ("forbidden", 403, "The token is valid but may not do this (e.g. an admin-only call)."),
    PermissionDenied = ("permission_denied", 403, "The sandbox's filesystem refused the operation."),
    NotFound = ("not_found", 404, "No such route or resource."),
    SandboxNotFound = ("sandbox_not_found", 404, "No sandbox with this id is visible to this tenant."),
    ImageNotFound = ("image_not_found", 404, "No image or layer with this name exists."),
    FileNotFound = ("file_not_found", 404, "No file or directory at this path in the sandbox."),
    SessionNotFound = ("session_not_found", 404, "No terminal session with this id in the sandbox."),
    JobNotFound = ("job_not_found", 404, "No sandbox of this job is visible to this tenant."),
    SnapshotNotFound = ("snapshot_not_found", 404, "No microVM snapshot with this name is visible to this tenant on the node."),
    TrajectoryNotFound = ("trajectory_not_found", 404, "The sandbox has no trajectory log (no operation was recorded in it)."),
    MethodNotAllowed = ("method_not_allowed", 405, "The route exists but not for this HTTP method."),
    SandboxNotRunning = ("sandbox_not_running", 409, "The sandbox is not running (stopped, failed or still starting)."),
    JobAlreadyPaused = ("job_already_paused", 409, "Every live sandbox of this job is already paused: nothing was done (a retried pause can take this as success)."),
    SandboxEnded = ("sandbox_ended", 409, "The sandbox has stopped or failed, or was stopped before it started: its processes are gone, so it cannot be paused, resumed or waited for."),
    AlreadyExists = ("already_exists", 409, "Something already exists at this path or with this name."),
    DirectoryNotEmpty = ("directory_not_empty", 409, "The directory is not empty (use recursive removal)."),
    StepConflict = ("step_conflict", 409, "The step id is already in the sandbox's trajectory log for a different operation; a step id names one operation."),
    StepInterrupted = ("step_interrupted", 409, "The step with this id was running when the edge lost it; whether it took effect is unknown. Check the sandbox and continue with a new step id."),
    IdempotencyConflict = ("idempotency_conflict", 409, "The idempotency key was already used by this tenant for a different request."),
    NoScreen = ("no_screen", 409, "The sandbox has no screen: screenshots and keyboard and mouse input need a full VM (backend \"vm\")."),
    SnapshotInUse = ("snapshot_in_use", 409, "The snapshot still backs other disks (a snapshot chained onto it, or a live sandbox started from it): delete those first."),
    ProjectNotEmpty = ("project_not_empty", 409, "The project still has sub-projects or live sandboxes: delete those first."),
    BuildFailed = ("build_failed", 422, "A step of an image build failed (a RUN command exited with an error, a COPY source is missing); the message names the step's line and ends with the command's output."),
    PayloadTooLarge = ("payload_too_large", 413, "The upload is larger than the allowed maximum."),
    UnsupportedMediaType = ("unsupported_media_type", 415, "The request body must be JSON (Content-Type: application/json)."),
    QuotaExceeded = ("quota_exceeded", 429, "A quota of the sandbox's project or of a project above it is used up (sandboxes, cpu, memory, disk, creations_per_s or fncall_per_s); the message names the project and the limit."),
    RateLimited = ("rate_limited", 429, "Too many requests; retry after the time in the Retry-After header."),
    QueueFull = ("queue_full", 429, "Every runner is busy and the wait queue is full; retry after the time in the Retry-After header."),
    CreationQueueFull = ("creation_queue_full", 429, "The node's creation queue is full; retry after the time in the Retry-After header."),
    Internal = ("internal", 500, "An unexpected fault in the platform; it was logged."),
    AgentUnavailable = ("agent_unavailable", 502, "The sandbox's guest agent stopped answering; the sandbox is being marked failed."),
    PortClosed = ("port_closed", 502, "Nothing accepts connections on this port of the sandbox (no server listens on its loopback there)."),
    NoCapacity = ("no_capacity", 503, "No node has room for this sandbox now (admission refused)."),
    EdgeUnavailable = ("edge_unavailable", 503, "The node that owns this sandbox cannot be reached."),
    StoreUnavailable = ("store_unavailable", 503, "The apiserver's database cannot be reached now; retry after the time in the Retry-After header."),
    RunnerFailed = ("runner_failed", 503, "The FnCall runner serving the call failed (not the call's program); it is being replaced, retry."),
    Timeout = ("timeout", 504, "The operation did not finish within its deadline."),
    NoSpace = ("no_space", 507, "The sandbox's disk is full."),
    InvalidNetworkRule = ("invalid_network_rule", 400, "A network rule is not a service name, an IPv4 prefix (with protocol and ports) or a domain, or it names the sandboxes' own subnet."),
    UnknownNetworkService = ("unknown_network_service", 400, "A network rule names a service this node's network configuration does not define."),
    NodeNotFound = ("node_not_found", 404, "No node with this name is in the node registry."),
    JoinRefused = ("join_refused", 401, "The join token is unknown, revoked or expired: the edge was not registered."),
    NetworkNotEnabled = ("network_not_enabled", 409, "The sandbox was created without network rules, so it has loopback only and its rules cannot change; create it with rules (even all false)."),
    VolumeNotFound = ("volume_not_found", 404, "No named volume with this name is visible to this tenant on the node."),
    VolumeInUse = ("volume_in_use", 409, "The volume is mounted in sandboxes that are not yet stopped: stop or delete them first."),
    VolumesUnavailable = ("volumes_unavailable", 400, "This node keeps writable layers in memory (started with --writable-layer tmpfs), so it has no disk for named volumes."),
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { error: ErrorDetail { code, message: message.into() } }
    }
}

/// The table as JSON: `[{"code", "http_status", "description"}, ...]`.
pub fn error_table_json() -> String {
    let rows: Vec<serde_json::Value> = ErrorCode::ALL
        .iter()
        .map(|c| {
            serde_json::json!({
                "code": c.as_str(),
                "http_status": c.http_status(),
                "description": c.description(),
            })
        })
        .collect();
    let mut s = serde_json::to_string_pretty(&rows).expect("a table of strings serializes");
    s.push('\n');
    s
}

/// An error and each of its causes, as a message for people ("client error
/// (Connect): invalid peer certificate: UnknownIssuer"): an HTTP client's
/// own message names only the stage that failed, the reason is further down
/// its chain. A cause whose text its parent already ends with is not
/// repeated.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let msg = c.to_string();
        if !text.ends_with(&msg) {
            text.push_str(": ");
            text.push_str(&msg);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_is_worded_with_its_causes_once_each() {
        let inner = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        let outer = std::io::Error::new(std::io::ErrorKind::InvalidData, inner);
        // io::Error shows its inner error's text: not repeated.
        assert_eq!(super::with_causes(&outer), "invalid peer certificate: UnknownIssuer");
        #[derive(Debug)]
        struct Stage(std::io::Error);
        impl std::fmt::Display for Stage {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("client error (Connect)")
            }
        }
        impl std::error::Error for Stage {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Stage(std::io::Error::other("connection refused"));
        assert_eq!(super::with_causes(&e), "client error (Connect): connection refused");
    }

    use super::*;

    #[test]
    fn serde_name_matches_table_code() {
        for c in ErrorCode::ALL {
            let wire = serde_json::to_value(c).unwrap();
            assert_eq!(wire, serde_json::Value::String(c.as_str().to_string()));
        }
    }

    #[test]
    fn codes_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c.as_str()), "duplicate code {c}");
            assert!((400..600).contains(&c.http_status()));
        }
    }

    /// The SDK's copy of the table must equal this one.
    #[test]
    fn sdk_table_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../sdk/python/dsec/error_codes.json");
        let want = error_table_json();
        if std::env::var_os("DSEC_WRITE_ERROR_CODES").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert_eq!(have, want, "sdk/python/dsec/error_codes.json is stale: run DSEC_WRITE_ERROR_CODES=1 cargo test -p dsec-api");
    }
}
