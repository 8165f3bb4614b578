//! The edge: one per node. Admission, storage preparation, cgroups,
//! namespaces, the guest agent's channel, lifecycle and cleanup of every
//! sandbox on the node.
//!
//! API boundary: [`Edge`] (create / get / list / stop / delete / pause /
//! resume / pack_diff / exec / call / open / subscribe) in core types ([`model`], [`spec::SandboxRequest`],
//! `dsec_agent_proto` ops). No HTTP or public wire types in here; the
//! apiserver and the edge's RPC server convert at their boundaries.
//!
//! Invariants: every host resource of a sandbox (cgroup, processes,
//! namespaces, mounts) is released by exactly one path, the exit watcher in
//! [`lifecycle`]; whatever that path misses (a crash of the edge itself), the
//! reaper in [`background`] finds by listing this node's cgroups.

pub mod admission;
mod agent_ops;
mod audit_forward;
pub mod backend;
mod background;
pub mod cgroup;
pub mod container;
mod create_queue;
mod edge;
pub mod error;
pub mod events;
pub mod fullvm;
mod idempotency;
pub mod ids;
pub mod images;
mod instance;
mod jobs;
pub mod journal;
pub mod layers;
mod lease;
mod lifecycle;
pub mod lost_layers;
pub mod metrics;
pub mod microvm;
pub mod model;
mod network;
mod node_lock;
mod pack;
mod pause;
mod prefetch;
mod prewarm;
mod recover;
mod replay;
mod screen_ops;
pub mod spec;
mod store;
mod suspend;
pub mod swap;
pub mod trajectory;
mod vm_snapshot;

pub use background::ReapReport;
pub use edge::{host_resources, ActivityGuard, Edge, EdgeConfig, NodeStats};
pub use error::EdgeError;
pub use events::SandboxEvent;
pub use images::{PackOutput, RootfsPlan, RootfsProvider};
pub use jobs::{JobAction, JobOutcome};
pub use layers::{ImageLayers, LayerFetch};
pub use lease::Lease;
pub use microvm::snapshot::SnapshotMeta;
pub use model::{Caller, ListFilter, SandboxRecord, SandboxSpec, State};
pub use pack::{PackRequest, PackSummary};
pub use pause::{PauseOutcome, ResumeOutcome};
pub use replay::{Divergence, ReplayReport};
pub use screen_ops::ScreenInput;
pub use spec::{SandboxRequest, SpecPolicy};
pub use suspend::PauseMode;
pub use trajectory::{StepOp, StepTicket, StreamStart, TrajectoryStep, UploadStart};
pub use vm_snapshot::SnapshotOutcome;

pub use dsec_net::NetConfig;
