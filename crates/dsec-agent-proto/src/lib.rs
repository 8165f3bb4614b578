//! The wire protocol between the edge and the guest agent (the paper's aether
//! + chronus) that runs inside every sandbox.
//!
//! One protocol for every backend: the bytes travel over a socketpair for
//! containers and FnCall runners and over virtio-serial for VMs. The channel
//! carries length-prefixed frames (see [`codec`]); each frame is one
//! [`ToAgent`] or [`FromAgent`] message encoded with postcard.
//!
//! # Shape of a conversation
//! 1. Both sides say `Hello` before anything else, each with the range of
//!    versions it speaks and its features, and the connection speaks the
//!    highest version of both ranges ([`negotiation`]: the Hello's frozen
//!    wire form, and which feature gates what). An agent that is already set
//!    up (the edge restarted and re-attached) says so in
//!    [`AgentHello::state`].
//! 2. The edge sends `Request { id, op }`. Ids are chosen by the edge and are
//!    unique per connection. Every request ends with exactly one
//!    `FromAgent::Reply { id, .. }`.
//! 3. Between request and reply, either side may send `Data { id, .. }`
//!    (process output, file content, stdin, PTY bytes) and `Eof { id }`.
//!    Data is flow-controlled per request in both directions: a sender may
//!    have at most [`INITIAL_WINDOW`] bytes unacknowledged plus whatever the
//!    receiver has granted with `Credit`. So one slow consumer never blocks
//!    the shared channel and memory stays bounded on both sides.
//!
//! Everything a sandboxed process writes travels only inside `Data` payloads:
//! no byte of process output is ever parsed as a control message.

#[cfg(feature = "async")]
pub mod client;
pub mod codec;
pub mod fncall;
pub mod negotiation;
mod ops;

pub use negotiation::{AgentHello, EdgeHello, Feature, Features, Negotiated, Offer};
pub use ops::*;

use serde::{Deserialize, Serialize};

/// The newest version this build speaks. Bumped when a message's layout
/// changes in a way older decoders would misread; what an older agent can
/// decode but not honour is a [`Feature`] instead ([`negotiation`]).
pub const PROTOCOL_VERSION: u32 = 5;

/// The oldest version this build still speaks, as an edge and as an agent.
/// Below 4 a version no longer says what an agent can do: ops were added
/// within protocol 3 without a bump, and a container agent parks the
/// descriptors of its masked paths for the edge only since 4.
pub const MIN_PROTOCOL_VERSION: u32 = 4;

/// Largest frame either side accepts (a guard against a corrupt length).
pub const MAX_FRAME_BYTES: usize = 8 << 20;

/// Largest `Data` payload a sender puts in one frame.
pub const MAX_CHUNK_BYTES: usize = 64 << 10;

/// Milliseconds since the Unix epoch: the clock that audit events
/// (`AuditEvent::time_ms`) and the edge's records are stamped with, on the
/// host and in the guest alike.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Bytes of `Data` a sender may have in flight per request before it needs
/// `Credit` from the receiver.
pub const INITIAL_WINDOW: u32 = 256 << 10;

/// Request id, chosen by the edge, unique per connection.
pub type ReqId = u64;

/// Messages from the edge to the agent.
// A request's op is large beside the other variants; a box per request would
// cost an allocation on the hot path for nothing (frames are short-lived).
#[allow(clippy::large_enum_variant)]
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum ToAgent {
    Hello(EdgeHello),
    Request {
        id: ReqId,
        op: Op,
    },
    /// Input for a running request: stdin of an exec, keystrokes of a PTY,
    /// content of a file or tar being written.
    Data {
        id: ReqId,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// No more `Data` for this request (closes stdin / ends an upload).
    Eof {
        id: ReqId,
    },
    /// Deliver a signal to the request's process group (exec, PTY).
    Signal {
        id: ReqId,
        signal: i32,
    },
    /// Resize the PTY of a request.
    Resize {
        id: ReqId,
        rows: u16,
        cols: u16,
    },
    /// The edge consumed `bytes` of this request's output: send more.
    Credit {
        id: ReqId,
        bytes: u32,
    },
    /// The caller went away: kill the request's processes / abort the
    /// transfer. The agent still answers with a `Reply`.
    Cancel {
        id: ReqId,
    },
}

/// Messages from the agent to the edge.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum FromAgent {
    Hello(AgentHello),
    /// Output of a running request (process output, PTY output, file or tar
    /// content being read).
    Data {
        id: ReqId,
        stream: Stream,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// The agent consumed `bytes` of this request's input: send more.
    Credit {
        id: ReqId,
        bytes: u32,
    },
    /// The single final answer to a request.
    Reply {
        id: ReqId,
        result: Result<Reply, AgentError>,
    },
    /// Unsolicited: the audit ring grew. Cumulative counts since the
    /// sandbox started, by kind (sent at most a few times a second, however
    /// many events happen, so a flood of refused attempts costs the channel
    /// almost nothing). The edge counts them in its metrics.
    Audited(AuditTally),
}

/// Frozen: part of the Hello's prefix ([`negotiation`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum AgentState {
    /// Just started; waits for a setup request.
    Fresh,
    /// Set up earlier for this sandbox; the edge is re-attaching.
    Ready { sandbox_id: String },
}

/// Which output a `Data` frame belongs to.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
    /// Output of a PTY (stdout and stderr are one stream on a terminal).
    Pty,
    /// File or tar content being read.
    Content,
}

/// A failure the agent reports for one request.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct AgentError {
    pub kind: ErrorKind,
    pub message: String,
}

impl AgentError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    NotFound,
    PermissionDenied,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    /// A path that is not absolute, contains `..`, or crosses a magic link.
    InvalidPath,
    InvalidArgument,
    /// The sandbox's disk is full (ENOSPC / EDQUOT).
    NoSpace,
    TooLarge,
    UnknownSession,
    UnknownUser,
    /// The program could not be started (missing binary, not executable).
    SpawnFailed,
    /// Setting up the sandbox failed; the agent exits after saying so.
    SetupFailed,
    /// The request was cancelled by the edge.
    Cancelled,
    Unsupported,
    /// The peer broke the protocol (unknown id, data without a request...).
    Protocol,
    Io,
}
