use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// `POST /v1/sandboxes/{id}/exec`, and the first message of a streaming exec.
/// Exactly one of `cmd` (a shell string) and `argv` must be given.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// A shell command line, run with `/bin/sh -c` (bash when present).
    #[serde(default)]
    pub cmd: Option<String>,
    /// A program and its arguments, run without a shell.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    /// Text given on stdin (UTF-8). See `stdin_b64` for bytes.
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    pub stdin_b64: Option<String>,
    /// Seconds before the command is terminated (SIGTERM, then SIGKILL).
    #[serde(default)]
    pub timeout: Option<f64>,
    /// Run in this persistent shell session.
    #[serde(default)]
    pub session: Option<String>,
    /// Bytes kept per stream (default 1 MiB); the rest is discarded.
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
    /// `utf8` (default; invalid sequences replaced) or `base64`.
    #[serde(default)]
    pub encoding: Option<OutputEncoding>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum OutputEncoding {
    #[default]
    Utf8,
    Base64,
}

/// The result of a command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecResponse {
    /// The exit status; 128 + N when killed by signal N.
    pub exit_code: i32,
    /// The signal that killed the process, if one did.
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub encoding: OutputEncoding,
    pub duration_ms: f64,
    /// Some output was discarded because it exceeded `max_output_bytes`.
    pub truncated: bool,
    /// The command hit its timeout and was killed.
    pub timed_out: bool,
}

/// `POST /v1/sandboxes/{id}/sessions`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionInfo {
    pub session_id: String,
}

/// Messages of the streaming exec and PTY WebSockets, as JSON text frames.
/// Output and input bytes travel in binary frames: for exec the first byte
/// names the stream (1 stdout, 2 stderr from the server; 0 stdin from the
/// client) and the rest is data; for a PTY the whole frame is terminal data.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamMessage {
    /// Client: no more stdin.
    Eof,
    /// Client: send a signal to the command's process group.
    Signal { signal: i32 },
    /// Client: resize the PTY.
    Resize { rows: u16, cols: u16 },
    /// Server: the command ended.
    Exit(ExecResponse),
    /// Server: the request failed.
    Error(crate::ErrorDetail),
}

/// Stream tags on binary WebSocket frames of a streaming exec.
pub const STREAM_STDIN: u8 = 0;
pub const STREAM_STDOUT: u8 = 1;
pub const STREAM_STDERR: u8 = 2;
