//! The nodes this apiserver routes to, and placement across them.
//!
//! The apiserver keeps no per-sandbox state: a sandbox id names its node
//! (`<node>.<random>`), so every request finds its edge from the id alone.
//! A node is either an edge in this process (`dsec up`) or an edge in
//! another process (`dsec edge`), reached over HTTP.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use dsec_api::{self as api, ErrorCode, NodeStatus};
use dsec_edge::histogram::{Histogram, HistogramSnapshot, REQUEST_BOUNDS};
use dsec_edge::{ids, Caller, Edge, JobAction, ListFilter};
use dsec_placement::{Demand, NodeView, Placement};
use dsec_store::{AnyStore, CreationKeys};

use crate::cluster_tls::ClusterTls;
use crate::convert;
use crate::error::ApiError;
use crate::remote::RemoteNode;

pub enum Node {
    Local(Edge),
    Remote(Arc<RemoteNode>),
}

/// A node found by name or sandbox id: remote nodes come and go while the
/// apiserver runs, so a remote one is handed out as its own reference.
pub enum NodeRef<'a> {
    Local(&'a Edge),
    Remote(Arc<RemoteNode>),
}

/// How creations are placed.
#[derive(Debug, Clone, Copy)]
pub struct PlacementConfig {
    /// Nodes sampled per decision (power of k choices).
    pub k: usize,
    /// Nodes tried per creation before giving up (each refusal, for lack of
    /// room or because the node cannot be reached, moves to the next).
    pub max_attempts: usize,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        PlacementConfig { k: 2, max_attempts: 3 }
    }
}

pub struct Nodes {
    /// Edges in this process (`dsec up`, `dsec edge`): fixed at start.
    local: BTreeMap<String, Edge>,
    /// Edges reached over HTTP: named by `--edge` at start, or joined
    /// (the node registry, which `registry::sync` follows).
    remote: RwLock<BTreeMap<String, Arc<RemoteNode>>>,
    placement: Placement,
    /// How long each placement decision took (the view read and the
    /// choice; not the creation on the chosen node).
    placement_latency: Histogram,
    /// Nodes that refused a placement (no room, unreachable, queue full),
    /// each a further choice.
    placement_refusals: AtomicU64,
    config: PlacementConfig,
    /// Whether something keeps the remotes in line with the node registry
    /// (`registry::follow`): only then may edges join through this server.
    follows_registry: AtomicBool,
    /// The node view placement reads, shared by every decision until the
    /// next probe round (or a change of membership) rebuilds it: a
    /// creation takes a reference, never a copy. What this replica placed
    /// since is overlaid by `placement` itself.
    view: RwLock<Arc<ViewSnapshot>>,
    /// How remotes that join are reached (plain HTTP or the cluster CA's
    /// HTTPS).
    tls: ClusterTls,
}

/// One build of the node view.
pub struct ViewSnapshot {
    pub nodes: Vec<NodeView>,
    /// `None`: never built (an empty placeholder).
    built: Option<Instant>,
}

/// A view older than this is rebuilt on read: it covers what no probe
/// round announces (local edges' own counters, a node's last answer
/// aging past `VIEW_TTL`).
const VIEW_MAX_AGE: Duration = crate::remote::POLL_INTERVAL;
/// A refusal for lack of a node rebuilds a view older than this first
/// (so a full cluster does not rebuild per creation).
const VIEW_RECHECK_AGE: Duration = Duration::from_millis(20);

/// What identifies a creation request for its idempotency key.
fn request_fingerprint(req: &api::CreateSandboxRequest) -> String {
    dsec_edge::trajectory::journal::sha256_hex(&serde_json::to_vec(req).unwrap_or_default())
}

/// A local edge's status; `paused` and the counts per backend are taken
/// only when asked (they walk the registry, which placement must never do
/// per creation).
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
        backends: e.backends(),
        creating: s.creating,
        queued: s.queued,
        paused: if count_paused { e.paused_count() } else { 0 },
        state: "ready".into(),
        labels: BTreeMap::new(),
        sandboxes_by_backend: if count_paused { e.sandboxes_by_backend() } else { BTreeMap::new() },
    }
}

fn view_of(s: NodeStatus) -> NodeView {
    NodeView {
        free_cpu: s.cpu_capacity - s.cpu_reserved,
        free_memory_mb: s.memory_capacity_mb.saturating_sub(s.memory_reserved_mb),
        free_slots: s.slots_capacity.saturating_sub(s.slots_used),
        cpu_capacity: s.cpu_capacity,
        name: s.name,
        healthy: s.healthy,
        backends: s.backends,
        labels: s.labels,
    }
}

impl Nodes {
    pub fn new(nodes: Vec<Node>) -> Self {
        Self::with_placement(nodes, PlacementConfig::default())
    }

    pub fn with_placement(nodes: Vec<Node>, config: PlacementConfig) -> Self {
        let mut local = BTreeMap::new();
        let mut remote = BTreeMap::new();
        for n in nodes {
            match n {
                Node::Local(e) => {
                    local.insert(e.node().to_string(), e);
                }
                Node::Remote(r) => {
                    remote.insert(r.name.clone(), r);
                }
            }
        }
        Self {
            local,
            remote: RwLock::new(remote),
            placement: Placement::new(config.k),
            config,
            follows_registry: AtomicBool::new(false),
            placement_latency: Histogram::new(REQUEST_BOUNDS),
            placement_refusals: AtomicU64::new(0),
            view: RwLock::new(Arc::new(ViewSnapshot { nodes: Vec::new(), built: None })),
            tls: ClusterTls::plain(),
        }
    }

    /// Reaches the nodes that join with `tls`.
    pub fn with_tls(mut self, tls: ClusterTls) -> Self {
        self.tls = tls;
        self
    }

    /// How this server reaches remote nodes.
    pub fn tls(&self) -> &ClusterTls {
        &self.tls
    }

    /// The node view as placement reads it: the current snapshot, rebuilt
    /// first if it is older than [`VIEW_MAX_AGE`].
    pub fn view(&self) -> Arc<ViewSnapshot> {
        {
            let v = self.view.read().unwrap_or_else(|p| p.into_inner());
            if v.built.is_some_and(|b| b.elapsed() < VIEW_MAX_AGE) {
                return v.clone();
            }
        }
        self.refresh_view()
    }

    /// Rebuilds the node view from every node's last known status (after a
    /// probe round, a watcher view, a registry change).
    pub fn refresh_view(&self) -> Arc<ViewSnapshot> {
        // Placements each node's view shows by now stop counting as in
        // flight: a local edge's counts are live; a remote's are as of its
        // last answered probe.
        let now = Instant::now();
        for name in self.local.keys() {
            self.placement.observed(name, now);
        }
        for r in self.remotes() {
            if let Some(at) = r.probed_at() {
                self.placement.observed(&r.name, at);
            }
        }
        let fresh =
            Arc::new(ViewSnapshot { nodes: self.status_with(false).into_iter().map(view_of).collect(), built: Some(Instant::now()) });
        *self.view.write().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        fresh
    }

    pub(crate) fn set_follows_registry(&self) {
        self.follows_registry.store(true, Ordering::Relaxed);
    }

    pub fn follows_registry(&self) -> bool {
        self.follows_registry.load(Ordering::Relaxed)
    }

    /// Placement decisions' latency and the refusals that sent a creation
    /// to a further choice.
    pub fn placement_metrics(&self) -> (HistogramSnapshot, u64) {
        (self.placement_latency.snapshot(), self.placement_refusals.load(Ordering::Relaxed))
    }

    /// Local edges (for shutdown, metrics and tests).
    pub fn local_edges(&self) -> impl Iterator<Item = &Edge> {
        self.local.values()
    }

    /// The remote nodes now, by name.
    pub fn remotes(&self) -> Vec<Arc<RemoteNode>> {
        self.remote.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// Adds a remote node, or replaces the one of the same name.
    pub fn put_remote(&self, node: Arc<RemoteNode>) {
        self.remote.write().unwrap_or_else(|p| p.into_inner()).insert(node.name.clone(), node);
        self.refresh_view();
    }

    /// Removes a remote node; `false` if there was none of that name.
    pub fn remove_remote(&self, name: &str) -> bool {
        let removed = self.remote.write().unwrap_or_else(|p| p.into_inner()).remove(name).is_some();
        self.refresh_view();
        removed
    }

    pub(crate) fn remote_named(&self, name: &str) -> Option<Arc<RemoteNode>> {
        self.remote.read().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }

    /// The node that owns sandbox `id`; unknown nodes look like unknown ids.
    pub fn node_of(&self, id: &str) -> Result<NodeRef<'_>, ApiError> {
        ids::node_of(id)
            .and_then(|n| self.by_name(n))
            .ok_or_else(|| ApiError::new(ErrorCode::SandboxNotFound, format!("sandbox {id} not found")))
    }

    /// The node named `name`, if this API has it.
    pub fn by_name(&self, name: &str) -> Option<NodeRef<'_>> {
        match self.local.get(name) {
            Some(e) => Some(NodeRef::Local(e)),
            None => self.remote_named(name).map(NodeRef::Remote),
        }
    }

    /// The local edge that owns sandbox `id`. Requests for sandboxes of
    /// remote nodes never reach handlers (the proxy layer forwards them).
    pub fn owner(&self, id: &str) -> Result<&Edge, ApiError> {
        match self.node_of(id)? {
            NodeRef::Local(e) => Ok(e),
            NodeRef::Remote(r) => Err(ApiError::new(ErrorCode::Internal, format!("sandbox {id} lives on remote node {}", r.name))),
        }
    }

    /// Every node's status, for `GET /v1/nodes`.
    pub fn status(&self) -> Vec<NodeStatus> {
        self.status_with(true)
    }

    fn status_with(&self, count_paused: bool) -> Vec<NodeStatus> {
        let mut all: Vec<NodeStatus> = self.local.values().map(|e| local_status(e, count_paused)).collect();
        all.extend(self.remotes().iter().map(|r| r.status()));
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    async fn create_on(
        &self,
        node: &str,
        caller: &Caller,
        req: &api::CreateSandboxRequest,
        key: Option<&str>,
    ) -> Result<api::CreatedSandbox, ApiError> {
        let Some(target) = self.by_name(node) else {
            return Err(ApiError::new(ErrorCode::EdgeUnavailable, format!("node {node} left the cluster")));
        };
        match target {
            NodeRef::Local(edge) => {
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
            NodeRef::Remote(r) => r.create(caller, req, key).await,
        }
    }

    /// The node a keyed creation tries first: the same for every retry of
    /// one key (as long as the set of eligible nodes stays the same), so the
    /// retry meets the node that holds the key.
    fn node_for_key(views: &[NodeView], demand: &Demand, caller: &Caller, key: &str) -> Option<String> {
        let names: Vec<&String> = views.iter().filter(|v| demand.eligible(v)).map(|v| &v.name).collect();
        let digest = dsec_edge::trajectory::journal::sha256_hex(format!("{}\0{key}", caller.tenant).as_bytes());
        let n = u64::from_str_radix(&digest[..15], 16).ok()? as usize;
        names.get(n % names.len().max(1)).map(|s| s.to_string())
    }

    /// Places and creates a sandbox. Placement keeps to ready nodes that
    /// run the backend and carry the selector's labels; a node that
    /// refuses (no room, or unreachable) is skipped and the next choice
    /// tried, up to `max_attempts` nodes.
    ///
    /// A keyed creation on remote nodes with a shared store (`keys`)
    /// records its node there before asking it, and a retry through any
    /// replica goes to the node recorded (see `docs/design.md`, "Keyed
    /// creations across replicas"). Without a store, the key picks the
    /// first node itself.
    pub async fn create(
        &self,
        caller: &Caller,
        req: api::CreateSandboxRequest,
        key: Option<&str>,
        keys: Option<&AnyStore>,
    ) -> Result<api::CreatedSandbox, ApiError> {
        let demand = Demand {
            backend: req.backend.as_str().to_string(),
            cpu: req.cpu_cores_limit.unwrap_or(1.0),
            memory_mb: req.memory_limit_mb.unwrap_or(512),
            selector: req.node_selector.clone(),
        };
        let mut refused: Vec<String> = Vec::new();
        let mut last_error: Option<ApiError> = None;
        let recorded_key = match (key, keys) {
            (Some(k), Some(store)) if !self.remote_is_empty() => Some((k, store)),
            _ => None,
        };
        let mut keyed_node = match recorded_key {
            // Also a placement decision: timed into the same histogram.
            None => key.and_then(|k| {
                let t = Instant::now();
                let node = Self::node_for_key(&self.view().nodes, &demand, caller, k);
                self.placement_latency.observe(t.elapsed());
                node
            }),
            Some(_) => None,
        };
        // The node the store holds this key for, once recorded.
        let mut recorded: Option<String> = None;
        let mut view = self.view();
        for _ in 0..self.config.max_attempts.max(1) {
            let choice = match keyed_node.take() {
                Some(n) => Some(n),
                None => {
                    let (v, choice) = self.decide(&demand, &refused);
                    view = v;
                    choice
                }
            };
            let mut node = match choice.or_else(|| Self::fallback(&view.nodes, &demand, &refused)) {
                Some(node) => node,
                // Before refusing, make sure the refusal rests on what this
                // replica knows now: a probe answered since the snapshot
                // (a node that has just joined) may have opened a place.
                None if view.built.is_none_or(|b| b.elapsed() >= VIEW_RECHECK_AGE) => {
                    view = self.refresh_view();
                    match self.placement.choose(&view.nodes, &demand, &refused).or_else(|| Self::fallback(&view.nodes, &demand, &refused)) {
                        Some(node) => node,
                        None => break,
                    }
                }
                None => break,
            };
            if let Some((k, store)) = recorded_key {
                let held = self.record_key(store, caller, k, &node, recorded.take()).await;
                let held = match held {
                    Ok(held) => held,
                    Err(e) => {
                        self.placement.forget(&node);
                        return Err(e);
                    }
                };
                if held != node {
                    // An earlier try of this key (through any replica) went there.
                    self.placement.forget(&node);
                    node = held;
                }
                recorded = Some(node.clone());
            }
            match self.create_on(&node, caller, &req, key).await {
                Ok(sb) => {
                    self.placement.settle(&node);
                    return Ok(sb);
                }
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
        Err(last_error.unwrap_or_else(|| Self::nothing_fits(&view.nodes, &demand)))
    }

    /// One placement decision, timed into the placement histogram: the
    /// current view (a shared snapshot) and power of k over it, with this
    /// replica's in-flight placements overlaid. What each creation attempt
    /// costs before a node is asked.
    pub fn decide(&self, demand: &Demand, refused: &[String]) -> (Arc<ViewSnapshot>, Option<String>) {
        let t = Instant::now();
        let view = self.view();
        let choice = self.placement.choose(&view.nodes, demand, refused);
        self.placement_latency.observe(t.elapsed());
        (view, choice)
    }

    /// Records that `caller`'s creation `key` goes to `node` and returns
    /// the node it is recorded for: `node`, or the one an earlier try chose.
    /// After a refusal by `previous`, the key moves from there to `node`,
    /// unless another replica moved it first (then its choice is followed).
    async fn record_key(
        &self,
        store: &AnyStore,
        caller: &Caller,
        key: &str,
        node: &str,
        previous: Option<String>,
    ) -> Result<String, ApiError> {
        if let Some(prev) = previous {
            if store.move_creation(&caller.tenant, key, &prev, node).await? {
                return Ok(node.to_string());
            }
        }
        Ok(store.place_creation(&caller.tenant, key, node, dsec_edge::model::now_ms()).await?)
    }

    fn remote_is_empty(&self) -> bool {
        self.remote.read().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// Nothing seems to fit: let a node that has not refused yet judge the
    /// request itself. Its checks are the authority and its error says
    /// exactly what is wrong (bad limits, unknown image, no room, a backend
    /// it lacks). Draining and unreachable nodes are never asked; with a
    /// selector only nodes carrying its labels are.
    fn fallback(views: &[NodeView], demand: &Demand, refused: &[String]) -> Option<String> {
        let open = |v: &&NodeView| v.healthy && !refused.contains(&v.name);
        let labelled = |v: &&NodeView| demand.selector.iter().all(|(k, val)| v.labels.get(k) == Some(val));
        views.iter().filter(open).find(|v| demand.eligible(v)).or_else(|| views.iter().filter(open).find(labelled)).map(|v| v.name.clone())
    }

    /// Labels no node carries, in any state, are the request's fault (400);
    /// labelled nodes that are full, draining or away are a wait (503).
    fn nothing_fits(views: &[NodeView], demand: &Demand) -> ApiError {
        let labels: Vec<String> = demand.selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let labelled = |v: &NodeView| demand.selector.iter().all(|(k, val)| v.labels.get(k) == Some(val));
        if !labels.is_empty() && !views.iter().any(labelled) {
            return ApiError::new(ErrorCode::InvalidRequest, format!("no node carries the labels {}", labels.join(",")));
        }
        let with = if labels.is_empty() { String::new() } else { format!(" with labels {}", labels.join(",")) };
        ApiError::new(ErrorCode::NoCapacity, format!("no ready node{with} has room for a {} sandbox", demand.backend))
    }

    /// Every node's sandboxes visible to `caller`, oldest first, and the
    /// nodes that could not be asked. Of those, the sandboxes the same list
    /// last showed are in the answer in state `unknown`.
    pub async fn list(&self, caller: &Caller, filter: &ListFilter, raw_query: &str) -> (Vec<api::Sandbox>, Vec<String>) {
        let mut all: Vec<api::Sandbox> = Vec::new();
        for e in self.local.values() {
            all.extend(e.list(caller, filter).into_iter().map(convert::sandbox_out));
        }
        let remote = self.remotes();
        // A node that does not answer (its link down) holds the list up
        // for one probe's time at most, then counts as unreachable.
        let answers = futures_util::future::join_all(remote.iter().map(|r| async move {
            match tokio::time::timeout(crate::remote::PROBE_TIMEOUT, r.list(caller, raw_query)).await {
                Ok(answer) => answer,
                Err(_) => Err(ApiError::new(ErrorCode::EdgeUnavailable, format!("node {} did not answer in time", r.name))),
            }
        }))
        .await;
        let mut unreachable = Vec::new();
        for (r, answer) in remote.iter().zip(answers) {
            match answer {
                Ok(list) => all.extend(list),
                Err(e) => {
                    tracing::warn!(node = %r.name, error = %e.message, "listing a node failed");
                    all.extend(r.last_known(caller, raw_query, &e.message));
                    unreachable.push(r.name.clone());
                }
            }
        }
        all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then_with(|| a.id.cmp(&b.id)));
        (all, unreachable)
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
        let remotes = self.remotes();
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

    /// Probes every remote node once, at once (the apiserver's own polling
    /// when no watcher is configured, or the watcher cannot be reached).
    pub async fn poll_remotes(&self) {
        let remotes = self.remotes();
        futures_util::future::join_all(remotes.iter().map(|r| r.poll())).await;
        self.refresh_view();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str, healthy: bool, labels: &[(&str, &str)]) -> NodeView {
        NodeView {
            name: name.into(),
            healthy,
            backends: vec!["container".into()],
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            free_cpu: 0.0,
            free_memory_mb: 0,
            free_slots: 0,
            cpu_capacity: 8.0,
        }
    }

    fn demand(backend: &str, selector: &[(&str, &str)]) -> Demand {
        Demand {
            backend: backend.into(),
            cpu: 1.0,
            memory_mb: 64,
            selector: selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    #[test]
    fn a_full_cluster_asks_a_ready_eligible_node_for_its_own_error() {
        let views = vec![view("draining", false, &[("zone", "a")]), view("full-a", true, &[("zone", "a")]), view("full-b", true, &[])];
        let zone_a = demand("container", &[("zone", "a")]);
        assert_eq!(Nodes::fallback(&views, &zone_a, &[]).as_deref(), Some("full-a"), "never the draining node");
        assert_eq!(Nodes::fallback(&views, &zone_a, &["full-a".into()]), None, "nothing else carries zone=a");
        // A backend no node runs: a ready node answers (unsupported_backend).
        assert_eq!(Nodes::fallback(&views, &demand("microvm", &[]), &[]).as_deref(), Some("full-a"));
        assert_eq!(Nodes::fallback(&views, &demand("microvm", &[("zone", "c")]), &[]), None);
        let e = Nodes::nothing_fits(&views, &demand("microvm", &[("zone", "a")]));
        assert_eq!(e.code, ErrorCode::NoCapacity, "zone=a nodes exist, but are full or draining");
        assert!(e.message.contains("zone=a") && e.message.contains("microvm"), "{}", e.message);
        let e = Nodes::nothing_fits(&views, &demand("microvm", &[("zone", "c")]));
        assert_eq!(e.code, ErrorCode::InvalidRequest, "no node carries zone=c");
        assert!(e.message.contains("zone=c"), "{}", e.message);
    }

    #[test]
    fn creations_share_one_view_until_a_round_rebuilds_it() {
        let nodes = Nodes::new(vec![]);
        let r = Arc::new(RemoteNode::new("n1", "http://127.0.0.1:9", "s", &crate::cluster_tls::ClusterTls::plain()).unwrap());
        nodes.put_remote(r.clone());
        let first = nodes.view();
        assert!(Arc::ptr_eq(&first, &nodes.view()), "a second creation takes the same snapshot");
        assert!(!first.nodes[0].healthy, "never probed: unreachable");
        let mut status = r.status();
        status.backends = vec!["container".into()];
        (status.cpu_capacity, status.memory_capacity_mb, status.slots_capacity) = (8.0, 1000, 10);
        r.record(status, Duration::ZERO);
        assert!(!nodes.view().nodes[0].healthy, "a probe's answer waits for the round's rebuild");
        nodes.refresh_view();
        assert!(nodes.view().nodes[0].healthy && !Arc::ptr_eq(&first, &nodes.view()));
        let demand = demand("container", &[]);
        assert_eq!(nodes.decide(&demand, &[]).1.as_deref(), Some("n1"));
        assert_eq!(nodes.decide(&demand, &["n1".into()]).1, None, "a node that refused is not chosen again");
        nodes.remove_remote("n1");
        assert!(nodes.view().nodes.is_empty(), "a departure rebuilds at once");
    }

    #[test]
    fn remote_nodes_come_and_go() {
        let nodes = Nodes::new(vec![]);
        let r = Arc::new(RemoteNode::new("n1", "http://127.0.0.1:9", "s", &crate::cluster_tls::ClusterTls::plain()).unwrap());
        nodes.put_remote(r);
        assert!(matches!(nodes.node_of("n1.abcdefabcdef"), Ok(NodeRef::Remote(_))));
        assert_eq!(nodes.status()[0].state, "unreachable");
        assert!(nodes.remove_remote("n1") && !nodes.remove_remote("n1"));
        assert_eq!(nodes.node_of("n1.abcdefabcdef").err().map(|e| e.code), Some(ErrorCode::SandboxNotFound));
    }
}
