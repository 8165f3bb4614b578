//! Cluster membership: join tokens, an edge's join request, drain, and the
//! watcher's view of the nodes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::NodeStatus;

/// `POST /v1/cluster/join-tokens` (admin only): a token edges present to
/// join; shown only in this answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JoinTokenInfo {
    pub token: String,
    /// RFC 3339; `None`: it never expires (until revoked).
    pub expires_at: Option<String>,
}

/// `POST /v1/cluster/join-tokens`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateJoinTokenRequest {
    /// Seconds until the token stops admitting edges; default: never.
    #[serde(default)]
    pub ttl_s: Option<u64>,
}

/// What an edge declares of itself when it joins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    /// The node's name, the prefix of its sandbox ids.
    pub name: String,
    /// Where apiservers reach the edge (`http://HOST:PORT`).
    pub url: String,
    /// The secret apiservers present to the edge (the edge's own).
    pub secret: String,
    /// The backends it can run (`container`, `microvm`, `vm`).
    pub backends: Vec<String>,
    /// Hardware labels (`kvm=true`, `arch=x86_64`) and the operator's own.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Its placement pool (`primary` unless told otherwise).
    #[serde(default = "primary_pool")]
    pub pool: String,
    pub capacity: NodeCapacity,
}

fn primary_pool() -> String {
    "primary".into()
}

/// What a node can hold in total.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, ToSchema)]
pub struct NodeCapacity {
    pub cpu_cores: f64,
    pub memory_mb: u64,
    pub max_sandboxes: u64,
}

/// The answer to a join: the node as the registry now holds it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JoinAnswer {
    pub node: String,
    /// True if the node was registered before (a restarted edge).
    pub rejoined: bool,
}

/// One node as the watcher last probed it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WatchedNode {
    pub name: String,
    /// Whether the last probe was answered.
    pub reachable: bool,
    /// Milliseconds since the last answered probe; `None`: never answered
    /// since the watcher started.
    pub last_ok_ago_ms: Option<u64>,
    /// The node's own status at the last answered probe.
    pub status: Option<NodeStatus>,
}

/// `GET /v1/watcher/view`: every registered node, with counts per backend.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WatcherView {
    /// How often the watcher probes each node, in milliseconds.
    pub period_ms: u64,
    pub nodes: Vec<WatchedNode>,
    /// Per backend: nodes offering it (reachable), and their sandboxes.
    pub backends: BTreeMap<String, BackendCounts>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BackendCounts {
    pub nodes: u64,
    pub sandboxes: u64,
}
