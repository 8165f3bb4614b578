//! The edge: one per node. Admission, storage preparation, cgroups,
//! namespaces, the guest agent's channel, lifecycle and cleanup of every
//! sandbox on the node.
//!
//! API boundary: [`Edge`] (create / get / list / stop / delete / pause /
//! resume / pack_diff / exec / call / open / subscribe) in core types
//! ([`model`], [`spec::SandboxRequest`], [`AgentRequest`], [`StreamOp`],
//! [`StepOp`], and the agent's data types as [`agent`]). No HTTP or public
//! wire types in here, and no agent operation in or out: the apiserver
//! and the edge's RPC server convert at their boundaries.
//!
//! Invariants: every host resource of a sandbox (cgroup, processes,
//! namespaces, mounts) is released by exactly one path, the exit watcher in
//! [`lifecycle`]; nothing outside [`backends`] names a concrete backend;
//! whatever that path misses (a crash of the edge itself), the
//! reaper in [`lifecycle::background`] finds by listing this node's cgroups.

pub mod backends;
/// The per-sandbox cgroups, a crate of their own (`dsec-cgroup`); the edge
/// names them by this path.
pub use dsec_cgroup as cgroup;
pub mod disk;
mod edge;
pub mod error;
pub mod events;
pub mod histogram;
pub mod ids;
pub mod images;
pub mod lifecycle;
pub mod metrics;
pub mod model;
mod ops;
pub mod pause;
pub mod spec;
mod store;
pub mod trajectory;
pub mod usage;

pub use backends::{ScreenInput, SnapshotMeta};
pub use edge::{host_resources, ActivityGuard, Edge, EdgeConfig, NodeStats};
pub use error::EdgeError;
pub use events::SandboxEvent;
pub use images::layers::{ImageLayers, LayerFetch};
pub use images::pack::{PackRequest, PackSummary};
pub use images::vm_snapshot::SnapshotOutcome;
pub use images::{PackOutput, RootfsPlan, RootfsProvider};
pub use lifecycle::background::ReapReport;
pub use lifecycle::lease::Lease;
pub use model::{Caller, ListFilter, QosClass, SandboxRecord, SandboxSpec, State};
pub use ops::agent::AgentRequest;
pub use ops::ports::{PortConnection, PortIo, SandboxEnded};
pub use ops::tcp_forward::{SourcePrefix, TcpForward, DEFAULT_FORWARD_TTL_S, MAX_FORWARD_TTL_S};
pub use pause::jobs::{JobAction, JobOutcome};
pub use pause::suspend::PauseMode;
pub use pause::{PauseOutcome, ResumeOutcome};
pub use spec::{SandboxRequest, SpecPolicy};
pub use trajectory::replay::{Divergence, ReplayReport};
pub use trajectory::{StepOp, StepTicket, StreamOp, StreamStart, TrajectoryStep, UploadStart};
pub use usage::{NodeUsage, NodeUsageSample, SandboxUsage, UsageSample};

pub use dsec_net::NetConfig;

/// The guest agent's data types that the edge's API speaks in: command and
/// file specs, their results, and the events of a streamed call. The
/// agent's operations themselves (`Op`) stay inside the edge: callers name
/// what they want with [`AgentRequest`], [`StreamOp`] and [`StepOp`].
pub mod agent {
    pub use dsec_agent_proto::client::{Call, CallEvent, CallReceiver, CallSender, ClientError};
    pub use dsec_agent_proto::{
        AgentError, AuditEvent, Command, ErrorKind, ExecResult, ExecSpec, FileKind, FileStat, PtySpec, Reply, SessionSpec, Stdin, Stream,
        WriteFileSpec, MAX_CHUNK_BYTES,
    };
}
