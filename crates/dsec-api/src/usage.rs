//! Resource use over time: a sandbox's (`GET /v1/sandboxes/{id}/metrics`)
//! and a node's (`GET /v1/nodes/{node}/metrics`), one sample a second.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Limits, SandboxState};

/// One second of a sandbox's use.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, ToSchema)]
pub struct MetricsSample {
    /// The end of the second, in milliseconds since the epoch.
    pub time_ms: u64,
    /// CPU time used over that second, in cores (1.0: one core busy).
    pub cpu_cores: f64,
    /// Memory charged to the sandbox (its cgroup's usage).
    pub memory_bytes: u64,
    /// Processes and threads.
    pub pids: u64,
    /// What its writable layer holds; null where the backend cannot say.
    pub disk_bytes: Option<u64>,
    /// Bytes per second received over its network interfaces (loopback
    /// left out); null where it has no network namespace of its own (VMs).
    pub net_rx_bytes_per_s: Option<u64>,
    /// Bytes per second sent, as `net_rx_bytes_per_s`.
    pub net_tx_bytes_per_s: Option<u64>,
}

/// A sandbox's recent use, oldest sample first. A paused sandbox is not
/// sampled (its series has a gap); a new one has its first sample after
/// two seconds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, ToSchema)]
pub struct SandboxMetrics {
    pub sandbox_id: String,
    pub state: SandboxState,
    pub limits: Limits,
    /// Milliseconds between samples.
    pub interval_ms: u64,
    /// Bytes received and sent since its network namespace was made
    /// (null as for the samples).
    pub net_rx_bytes: Option<u64>,
    pub net_tx_bytes: Option<u64>,
    pub samples: Vec<MetricsSample>,
}

/// One second of a node's use.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, ToSchema)]
pub struct NodeMetricsSample {
    pub time_ms: u64,
    /// CPU busy over that second, in cores, for the whole host.
    pub cpu_cores: f64,
    /// Memory in use on the host (total less available).
    pub memory_bytes: u64,
    /// Swap in use on the host.
    pub swap_bytes: u64,
    /// Sandboxes running on the node at that moment.
    pub sandboxes: u64,
}

/// A node's recent use, oldest sample first.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, ToSchema)]
pub struct NodeMetrics {
    pub node: String,
    pub interval_ms: u64,
    pub cpus: u32,
    pub memory_total_bytes: u64,
    pub samples: Vec<NodeMetricsSample>,
}
