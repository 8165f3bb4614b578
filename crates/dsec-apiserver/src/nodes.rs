//! The nodes this apiserver routes to, and placement across them.
//!
//! The apiserver keeps no per-sandbox state: a sandbox id names its node
//! (`<node>.<random>`), so every request finds its edge from the id alone.
//! A node is either an edge in this process (`dsec up`) or an edge in
//! another process (`dsec edge`), reached over HTTP.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use dsec_api::{self as api, ErrorCode, NodeStatus};
use dsec_edge::histogram::{Histogram, HistogramSnapshot, REQUEST_BOUNDS};
use dsec_edge::{ids, Caller, Edge, JobAction, ListFilter};
use dsec_placement::{Demand, NodeView, Placement};

use crate::convert;
use crate::error::ApiError;
use crate::remote::RemoteNode;

pub enum Node {
    Local(Edge),
    Remote(Arc<RemoteNode>),
}

pub struct Nodes {
    nodes: BTreeMap<String, Node>,
    placement: Placement,
    /// How long each placement decision took (the view read and the
    /// choice; not the creation on the chosen node).
    placement_latency: Histogram,
    /// Nodes that refused a placement (no room, unreachable, queue full),
    /// each a further choice.
    placement_refusals: AtomicU64,
}

/// What identifies a creation request for its idempotency key.
fn request_fingerprint(req: &api::CreateSandboxRequest) -> String {
    dsec_edge::trajectory::journal::sha256_hex(&serde_json::to_vec(req).unwrap_or_default())
}

/// How many nodes placement samples (power of k choices).
const PLACEMENT_K: usize = 2;

/// A local edge's status; `paused` is counted only when asked (it walks
/// the registry, which placement must never do per creation).
fn local_status(e: &Edge, count_paused: bool) -> NodeStatus {
    let s = e.stats();
    NodeStatus {
        name: s.node,
        healthy: true,
        sandboxes: s.running,
        cpu_reserved: s.used.cpu_cores,
        cpu_capacity: s.capacity.cpu_cores,
        memory_reserved_mb: s.used.memory_mb,
        memory_capacity_mb: s.capacity.memory_mb,
        slots_used: s.used.sandboxes,
        slots_capacity: s.capacity.sandboxes,
        cgroup_version: s.cgroup_version,
        backends: vec!["container".into()],
        creating: s.creating,
        queued: s.queued,
        paused: if count_paused { e.paused_count() } else { 0 },
    }
}

impl Nodes {
    pub fn new(nodes: Vec<Node>) -> Self {
        let nodes = nodes
            .into_iter()
            .map(|n| {
                let name = match &n {
                    Node::Local(e) => e.node().to_string(),
                    Node::Remote(r) => r.name.clone(),
                };
                (name, n)
            })
            .collect();
        Self {
            nodes,
            placement: Placement::new(PLACEMENT_K),
            placement_latency: Histogram::new(REQUEST_BOUNDS),
            placement_refusals: AtomicU64::new(0),
        }
    }

    /// Placement decisions' latency and the refusals that sent a creation
    /// to a further choice.
    pub fn placement_metrics(&self) -> (HistogramSnapshot, u64) {
        (self.placement_latency.snapshot(), self.placement_refusals.load(Ordering::Relaxed))
    }

    /// Local edges (for shutdown, metrics and tests).
    pub fn local_edges(&self) -> impl Iterator<Item = &Edge> {
        self.nodes.values().filter_map(|n| match n {
            Node::Local(e) => Some(e),
            Node::Remote(_) => None,
        })
    }

    pub fn remotes(&self) -> impl Iterator<Item = &Arc<RemoteNode>> {
        self.nodes.values().filter_map(|n| match n {
            Node::Remote(r) => Some(r),
            Node::Local(_) => None,
        })
    }

    /// The node that owns sandbox `id`; unknown nodes look like unknown ids.
    pub fn node_of(&self, id: &str) -> Result<&Node, ApiError> {
        ids::node_of(id)
            .and_then(|n| self.nodes.get(n))
            .ok_or_else(|| ApiError::new(ErrorCode::SandboxNotFound, format!("sandbox {id} not found")))
    }

    /// The node named `name`, if this API has it.
    pub fn by_name(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name)
    }

    /// The local edge that owns sandbox `id`. Requests for sandboxes of
    /// remote nodes never reach handlers (the proxy layer forwards them).
    pub fn owner(&self, id: &str) -> Result<&Edge, ApiError> {
        match self.node_of(id)? {
            Node::Local(e) => Ok(e),
            Node::Remote(r) => Err(ApiError::new(ErrorCode::Internal, format!("sandbox {id} lives on remote node {}", r.name))),
        }
    }

    /// Every node's status, for `GET /v1/nodes`.
    pub fn status(&self) -> Vec<NodeStatus> {
        self.status_with(true)
    }

    fn status_with(&self, count_paused: bool) -> Vec<NodeStatus> {
        self.nodes
            .values()
            .map(|n| match n {
                Node::Local(e) => local_status(e, count_paused),
                Node::Remote(r) => r.status(),
            })
            .collect()
    }

    /// The watcher's view, as placement wants it.
    fn views(&self) -> Vec<NodeView> {
        self.status_with(false)
            .into_iter()
            .map(|s| NodeView {
                free_cpu: s.cpu_capacity - s.cpu_reserved,
                free_memory_mb: s.memory_capacity_mb.saturating_sub(s.memory_reserved_mb),
                free_slots: s.slots_capacity.saturating_sub(s.slots_used),
                cpu_capacity: s.cpu_capacity,
                name: s.name,
                healthy: s.healthy,
                backends: s.backends,
            })
            .collect()
    }

    async fn create_on(
        &self,
        node: &str,
        caller: &Caller,
        req: &api::CreateSandboxRequest,
        key: Option<&str>,
    ) -> Result<api::CreatedSandbox, ApiError> {
        match &self.nodes[node] {
            Node::Local(edge) => {
                let rec = match key {
                    Some(key) => {
                        edge.create_idempotent(caller, convert::create_request(req.clone()), key, &request_fingerprint(req)).await?
                    }
                    None => edge.create(caller, convert::create_request(req.clone())).await?,
                };
                // A first command is the caller's to run (see routes::sandboxes::create).
                Ok(api::CreatedSandbox { sandbox: convert::sandbox_out(rec), first_exec: None })
            }
            // The remote node's own create route runs the request's first command.
            Node::Remote(r) => r.create(caller, req, key).await,
        }
    }

    /// The node a keyed creation tries first: the same for every retry of
    /// one key (as long as the set of nodes stays the same), so the retry
    /// meets the node that holds the key.
    fn node_for_key(&self, caller: &Caller, key: &str) -> Option<String> {
        let names: Vec<&String> = self.nodes.keys().collect();
        let digest = dsec_edge::trajectory::journal::sha256_hex(format!("{}\0{key}", caller.tenant).as_bytes());
        let n = u64::from_str_radix(&digest[..15], 16).ok()? as usize;
        names.get(n % names.len().max(1)).map(|s| s.to_string())
    }

    /// Places and creates a sandbox; a node that refuses (no room, or
    /// unreachable) is skipped and the next choice tried.
    pub async fn create(
        &self,
        caller: &Caller,
        req: api::CreateSandboxRequest,
        key: Option<&str>,
    ) -> Result<api::CreatedSandbox, ApiError> {
        let demand = Demand {
            backend: req.backend.as_str().to_string(),
            cpu: req.cpu_cores_limit.unwrap_or(1.0),
            memory_mb: req.memory_limit_mb.unwrap_or(512),
        };
        let mut refused: Vec<String> = Vec::new();
        let mut last_error: Option<ApiError> = None;
        let mut keyed_node = key.and_then(|k| self.node_for_key(caller, k));
        loop {
            let choice = match keyed_node.take() {
                Some(n) => Some(n),
                None => {
                    let t0 = Instant::now();
                    let views = self.views();
                    let choice = self.placement.choose(&views, &demand, &refused);
                    self.placement_latency.observe(t0.elapsed());
                    choice
                }
            };
            let node = match choice {
                Some(node) => node,
                // Nothing seems to fit: let a node that has not refused yet
                // judge the request itself. Its checks are the authority and
                // its error says exactly what is wrong (bad limits, unknown
                // image, no room).
                None => match self.nodes.keys().find(|n| !refused.contains(n)) {
                    Some(n) => n.clone(),
                    None => {
                        return Err(last_error.unwrap_or_else(|| ApiError::new(ErrorCode::NoCapacity, "no node has room for this sandbox")))
                    }
                },
            };
            match self.create_on(&node, caller, &req, key).await {
                Ok(sb) => return Ok(sb),
                Err(e) if matches!(e.code, ErrorCode::NoCapacity | ErrorCode::EdgeUnavailable | ErrorCode::CreationQueueFull) => {
                    tracing::debug!(%node, reason = %e.message, "node refused placement");
                    self.placement.forget(&node);
                    self.placement_refusals.fetch_add(1, Ordering::Relaxed);
                    refused.push(node);
                    last_error = Some(e);
                }
                Err(e) => {
                    self.placement.forget(&node);
                    return Err(e);
                }
            }
        }
    }

    /// Every node's sandboxes visible to `caller`, oldest first. A node that
    /// cannot be reached is left out of the answer (and logged).
    pub async fn list(&self, caller: &Caller, filter: &ListFilter, raw_query: &str) -> Vec<api::Sandbox> {
        let mut all: Vec<api::Sandbox> = Vec::new();
        let mut remote = Vec::new();
        for n in self.nodes.values() {
            match n {
                Node::Local(e) => all.extend(e.list(caller, filter).into_iter().map(convert::sandbox_out)),
                Node::Remote(r) => remote.push(r.clone()),
            }
        }
        let answers = futures_util::future::join_all(remote.iter().map(|r| r.list(caller, raw_query))).await;
        for (r, answer) in remote.iter().zip(answers) {
            match answer {
                Ok(list) => all.extend(list),
                Err(e) => tracing::warn!(node = %r.name, error = %e.message, "listing a node failed"),
            }
        }
        all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then_with(|| a.id.cmp(&b.id)));
        all
    }

    /// Pauses or resumes a job's sandboxes on every node at once, and sums
    /// up. A node that has none of them is not an error; one that cannot be
    /// reached is reported in `failed` as `node:<name>`.
    pub async fn job_action(&self, caller: &Caller, job: &str, action: JobAction) -> api::JobActionResult {
        let mut total = api::JobActionResult {
            job: job.to_string(),
            matched: 0,
            changed: 0,
            unchanged: 0,
            ended: 0,
            memory_freed_bytes: 0,
            failed: vec![],
            duration_ms: 0.0,
        };
        let locals = futures_util::future::join_all(self.local_edges().map(|e| e.job_action(caller, job, action)));
        let remotes: Vec<_> = self.remotes().cloned().collect();
        let remote_answers = futures_util::future::join_all(remotes.iter().map(|r| r.job_action(caller, job, action)));
        let (locals, remote_answers) = tokio::join!(locals, remote_answers);
        for o in locals {
            total.matched += o.matched;
            total.changed += o.changed;
            total.unchanged += o.unchanged;
            total.ended += o.ended;
            total.memory_freed_bytes += o.memory_freed_bytes;
            total.failed.extend(o.failed.into_iter().map(|(id, e)| api::JobFailure { id, code: e.code(), message: e.to_string() }));
        }
        for (r, answer) in remotes.iter().zip(remote_answers) {
            match answer {
                Ok(o) => {
                    total.matched += o.matched;
                    total.changed += o.changed;
                    total.unchanged += o.unchanged;
                    total.ended += o.ended;
                    total.memory_freed_bytes += o.memory_freed_bytes;
                    total.failed.extend(o.failed);
                }
                Err(e) if e.code == ErrorCode::JobNotFound => {}
                Err(e) => total.failed.push(api::JobFailure { id: format!("node:{}", r.name), code: e.code, message: e.message }),
            }
        }
        total
    }

    /// Polls every remote node forever (the watcher). Holds no state beyond
    /// each node's last answer, so a restarted apiserver rebuilds it at once.
    pub fn spawn_watcher(self: &Arc<Self>) {
        for r in self.remotes().cloned().collect::<Vec<_>>() {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(crate::remote::POLL_INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    r.poll().await;
                }
            });
        }
    }
}
