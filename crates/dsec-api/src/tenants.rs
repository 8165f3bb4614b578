use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/tenants` (admin only).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenantRequest {
    pub name: String,
}

/// A tenant; `token` is only present in the answer that created it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantInfo {
    pub name: String,
    pub admin: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantList {
    pub tenants: Vec<TenantInfo>,
}

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
    pub version: String,
    pub nodes: Vec<NodeStatus>,
}

/// A node (edge) as the apiserver sees it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeStatus {
    pub name: String,
    pub healthy: bool,
    pub sandboxes: u64,
    pub cpu_reserved: f64,
    pub cpu_capacity: f64,
    pub memory_reserved_mb: u64,
    pub memory_capacity_mb: u64,
    /// Sandboxes admitted (running or starting) and the node's maximum.
    pub slots_used: u64,
    pub slots_capacity: u64,
    pub cgroup_version: u8,
    /// Backends this node can run.
    pub backends: Vec<String>,
    /// Sandboxes being created now, and waiting in the creation queue.
    #[serde(default)]
    pub creating: u64,
    #[serde(default)]
    pub queued: u64,
    /// Paused sandboxes (they hold no slot: not in `slots_used`).
    #[serde(default)]
    pub paused: u64,
    /// `ready`, `draining` (no new placements) or `unreachable`.
    #[serde(default = "ready")]
    pub state: String,
    /// Hardware and operator labels placement can select on.
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Sandboxes per backend (counted for status pages; empty in views
    /// made for placement).
    #[serde(default)]
    pub sandboxes_by_backend: std::collections::BTreeMap<String, u64>,
}

fn ready() -> String {
    "ready".into()
}
