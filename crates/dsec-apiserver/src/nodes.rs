//! The nodes this apiserver routes to, and placement across them.
//!
//! The apiserver keeps no per-sandbox state: a sandbox id names its node
//! (`<node>.<random>`), so every request finds its edge from the id alone.

use std::collections::BTreeMap;

use dsec_api::{ErrorCode, NodeStatus};
use dsec_edge::{ids, Caller, Edge, EdgeError, ListFilter, SandboxRecord, SandboxRequest};
use dsec_placement::{Demand, NodeView, Placement};

use crate::error::ApiError;

pub struct Nodes {
    edges: BTreeMap<String, Edge>,
    placement: Placement,
}

/// How many nodes placement samples (power of k choices).
const PLACEMENT_K: usize = 2;

impl Nodes {
    pub fn new(edges: Vec<Edge>) -> Self {
        let edges = edges.into_iter().map(|e| (e.node().to_string(), e)).collect();
        Self { edges, placement: Placement::new(PLACEMENT_K) }
    }

    pub fn edges(&self) -> impl Iterator<Item = &Edge> {
        self.edges.values()
    }

    /// The edge that owns sandbox `id`; unknown nodes look like unknown ids.
    pub fn owner(&self, id: &str) -> Result<&Edge, ApiError> {
        ids::node_of(id)
            .and_then(|n| self.edges.get(n))
            .ok_or_else(|| ApiError::new(ErrorCode::SandboxNotFound, format!("sandbox {id} not found")))
    }

    /// The watcher's view: in one process it reads each edge's counters.
    fn views(&self) -> Vec<NodeView> {
        self.edges
            .values()
            .map(|e| {
                let s = e.stats();
                NodeView {
                    name: s.node,
                    healthy: true,
                    backends: vec!["container".into()],
                    free_cpu: s.capacity.cpu_cores - s.used.cpu_cores,
                    free_memory_mb: s.capacity.memory_mb.saturating_sub(s.used.memory_mb),
                    free_slots: s.capacity.sandboxes.saturating_sub(s.used.sandboxes),
                    cpu_capacity: s.capacity.cpu_cores,
                }
            })
            .collect()
    }

    /// Places and creates a sandbox; a node that refuses is skipped and the
    /// next choice tried.
    pub async fn create(&self, caller: &Caller, req: SandboxRequest) -> Result<SandboxRecord, ApiError> {
        let (cpus, _) = dsec_edge::host_resources();
        let demand = Demand {
            backend: "container".into(),
            cpu: req.cpu_cores.unwrap_or(1.0_f64.min(cpus)),
            memory_mb: req.memory_mb.unwrap_or(512),
        };
        let mut refused: Vec<String> = Vec::new();
        loop {
            let views = self.views();
            let node = match self.placement.choose(&views, &demand, &refused) {
                Some(node) => node,
                // Nothing seems to fit: let a node that has not refused yet
                // judge the request itself. Its checks are the authority and
                // its error says exactly what is wrong (bad limits, unknown
                // image, no room).
                None => match self.edges.keys().find(|n| !refused.contains(n)) {
                    Some(n) => n.clone(),
                    None => return Err(ApiError::new(ErrorCode::NoCapacity, "every node refused this sandbox: no room")),
                },
            };
            match self.edges[&node].create(caller, req.clone()).await {
                Ok(r) => return Ok(r),
                Err(EdgeError::NoCapacity(why)) if refused.len() + 1 < self.edges.len() => {
                    tracing::debug!(%node, %why, "node refused placement");
                    self.placement.forget(&node);
                    refused.push(node);
                }
                Err(e) => {
                    self.placement.forget(&node);
                    return Err(e.into());
                }
            }
        }
    }

    pub fn list(&self, caller: &Caller, filter: &ListFilter) -> Vec<SandboxRecord> {
        let mut all: Vec<SandboxRecord> = self.edges.values().flat_map(|e| e.list(caller, filter)).collect();
        all.sort_by(|a, b| a.created_at_ms.cmp(&b.created_at_ms).then_with(|| a.id.cmp(&b.id)));
        all
    }

    pub fn status(&self) -> Vec<NodeStatus> {
        self.edges
            .values()
            .map(|e| {
                let s = e.stats();
                NodeStatus {
                    name: s.node,
                    healthy: true,
                    sandboxes: s.running,
                    cpu_reserved: s.used.cpu_cores,
                    cpu_capacity: s.capacity.cpu_cores,
                    memory_reserved_mb: s.used.memory_mb,
                    memory_capacity_mb: s.capacity.memory_mb,
                    cgroup_version: s.cgroup_version,
                }
            })
            .collect()
    }
}
