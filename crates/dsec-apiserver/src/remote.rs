//! An edge in another process (`dsec edge`), reached over HTTP.
//!
//! The apiserver authenticates the user, then forwards the request as is to
//! the edge that owns the sandbox, adding the cluster secret and the caller's
//! name. Bodies stream through in both directions and WebSocket upgrades are
//! spliced, so exec streams, PTYs and file transfers work unchanged.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use bytes::Bytes;
use dsec_api::{self as api, ErrorCode};
use dsec_edge::Caller;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::auth::{ADMIN_HEADER, TENANT_HEADER};
use crate::cluster_tls::{ClusterTls, PeerConnector};
use crate::error::ApiError;

/// How long a node's last answered probe stays trustworthy: older, the
/// node is `unreachable` (what a watcher's stale view comes to); a node
/// whose probe fails (refused, reset) or goes unanswered for
/// [`PROBE_TIMEOUT`] is unreachable at once.
pub const VIEW_TTL: Duration = Duration::from_secs(10);
/// How often the node is probed (by the watcher, or by the apiserver's own
/// polling when it has no watcher).
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// How long one probe may take: a node that does not answer (its link
/// down) must not hold up the round, and is unreachable until it answers.
/// Also how long a listing waits for one node.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Lists remembered per node for answering while it is unreachable.
const MAX_ROSTERS: usize = 256;

/// What the node registry says of a node that joined; a node named by
/// `--edge` has the default (no labels, backends as probed, not draining).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Membership {
    pub labels: BTreeMap<String, String>,
    /// The backends it declared when it joined (used until a probe answers).
    pub backends: Vec<String>,
    pub capacity: Option<api::NodeCapacity>,
    pub draining: bool,
    /// Whether it came from the registry (and leaves with it).
    pub joined: bool,
}

pub struct RemoteNode {
    pub name: String,
    url: String,
    bearer: HeaderValue,
    http: Client<PeerConnector, Body>,
    /// The last answered probe of the node and when it was answered.
    view: RwLock<Option<(Instant, api::NodeStatus)>>,
    /// Whether the last probe failed outright (not merely slow).
    down: std::sync::atomic::AtomicBool,
    member: RwLock<Membership>,
    /// The last answer of each list (by tenant and query) this apiserver
    /// got from the node: while the node cannot be reached, the same list
    /// shows these sandboxes as `unknown` rather than dropping them.
    rosters: Mutex<HashMap<(String, String), Vec<api::Sandbox>>>,
}

impl RemoteNode {
    /// The edge at `url` (`http://` or, in a cluster with a CA, `https://`).
    pub fn new(name: &str, url: &str, cluster_secret: &str, tls: &ClusterTls) -> Result<Self, String> {
        let url = url.trim_end_matches('/').to_string();
        tls.check_url("edge", &url)?;
        let bearer = HeaderValue::from_str(&format!("Bearer {cluster_secret}")).map_err(|e| e.to_string())?;
        let connector = tls.connector(Duration::from_secs(3));
        let http = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(256).build(connector);
        Ok(Self {
            name: name.to_string(),
            url,
            bearer,
            http,
            view: RwLock::new(None),
            down: std::sync::atomic::AtomicBool::new(false),
            member: RwLock::new(Membership::default()),
            rosters: Mutex::new(HashMap::new()),
        })
    }

    /// A node of the registry.
    pub fn joined(name: &str, url: &str, secret: &str, member: Membership, tls: &ClusterTls) -> Result<Self, String> {
        let node = Self::new(name, url, secret, tls)?;
        *node.member.write().unwrap_or_else(|p| p.into_inner()) = Membership { joined: true, ..member };
        Ok(node)
    }

    /// Whether requests to this node go where `url` with `secret` would.
    pub fn reaches(&self, url: &str, secret: &str) -> bool {
        self.url == url.trim_end_matches('/') && self.bearer.as_bytes() == format!("Bearer {secret}").as_bytes()
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn membership(&self) -> Membership {
        self.member.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_membership(&self, m: Membership) {
        *self.member.write().unwrap_or_else(|p| p.into_inner()) = m;
    }

    fn unreachable(&self, e: impl std::error::Error) -> ApiError {
        ApiError::new(ErrorCode::EdgeUnavailable, format!("node {} ({}) cannot be reached: {}", self.name, self.url, api::with_causes(&e)))
    }

    fn sign(&self, h: &mut axum::http::HeaderMap, caller: &Caller) -> Result<(), ApiError> {
        h.insert(header::AUTHORIZATION, self.bearer.clone());
        let tenant = HeaderValue::from_str(&caller.tenant).map_err(|_| ApiError::invalid("tenant name is not a header value"))?;
        h.insert(TENANT_HEADER, tenant);
        h.insert(ADMIN_HEADER, HeaderValue::from_static(if caller.admin { "true" } else { "false" }));
        h.remove(header::HOST);
        Ok(())
    }

    /// Forwards a request for one of this node's sandboxes.
    pub async fn forward(&self, caller: &Caller, mut req: Request<Body>) -> Result<Response<Body>, ApiError> {
        let client_upgrade = req.headers().contains_key(header::UPGRADE).then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        parts.uri = format!("{}{pq}", self.url).parse().map_err(|e| ApiError::invalid(format!("bad URI: {e}")))?;
        self.sign(&mut parts.headers, caller)?;
        let mut resp = self.http.request(Request::from_parts(parts, body)).await.map_err(|e| self.unreachable(e))?;
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            let Some(client_upgrade) = client_upgrade else {
                return Err(ApiError::new(ErrorCode::Internal, "edge switched protocols on a plain request"));
            };
            let edge_upgrade = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                if let (Ok(a), Ok(b)) = tokio::join!(client_upgrade, edge_upgrade) {
                    let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b)).await;
                }
            });
            let (parts, _) = resp.into_parts();
            return Ok(Response::from_parts(parts, Body::empty()));
        }
        let (parts, body) = resp.into_parts();
        Ok(Response::from_parts(parts, Body::new(body)))
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        caller: &Caller,
        method: axum::http::Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ApiError> {
        self.json_with(caller, method, path_and_query, body, &[]).await
    }

    async fn json_with<T: serde::de::DeserializeOwned>(
        &self,
        caller: &Caller,
        method: axum::http::Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> Result<T, ApiError> {
        let mut builder =
            Request::builder().method(method).uri(format!("{}{path_and_query}", self.url)).header(header::CONTENT_TYPE, "application/json");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let mut req = builder.body(body.map(Body::from).unwrap_or_else(Body::empty)).map_err(|e| ApiError::invalid(e.to_string()))?;
        self.sign(req.headers_mut(), caller)?;
        let resp = self.http.request(req).await.map_err(|e| self.unreachable(e))?;
        let status = resp.status();
        let bytes: Bytes = resp.into_body().collect().await.map_err(|e| self.unreachable(e))?.to_bytes();
        if !status.is_success() {
            return Err(match serde_json::from_slice::<api::ErrorBody>(&bytes) {
                Ok(e) => ApiError::new(e.error.code, e.error.message),
                Err(_) => ApiError::new(ErrorCode::Internal, format!("node {} answered HTTP {status}", self.name)),
            });
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::new(ErrorCode::Internal, format!("node {} sent an unreadable answer: {e}", self.name)))
    }

    pub async fn create(
        &self,
        caller: &Caller,
        req: &api::CreateSandboxRequest,
        key: Option<&str>,
    ) -> Result<api::CreatedSandbox, ApiError> {
        // Placed already: the edge must not judge the selector against its
        // own (unlabelled) view of itself.
        let placed = api::CreateSandboxRequest { node_selector: Default::default(), ..req.clone() };
        let body = serde_json::to_vec(&placed).map_err(|e| ApiError::invalid(e.to_string()))?;
        let extra: Vec<(&str, &str)> = key.map(|k| (api::IDEMPOTENCY_KEY_HEADER, k)).into_iter().collect();
        self.json_with(caller, axum::http::Method::POST, "/v1/sandboxes", Some(body), &extra).await
    }

    /// Stops a sandbox of this node.
    pub async fn stop(&self, caller: &Caller, id: &str) -> Result<api::Sandbox, ApiError> {
        self.json(caller, axum::http::Method::POST, &format!("/v1/sandboxes/{id}/stop"), None).await
    }

    pub async fn list(&self, caller: &Caller, query: &str) -> Result<Vec<api::Sandbox>, ApiError> {
        let pq = if query.is_empty() { "/v1/sandboxes".to_string() } else { format!("/v1/sandboxes?{query}") };
        let list: api::SandboxList = self.json(caller, axum::http::Method::GET, &pq, None).await?;
        let mut rosters = self.rosters.lock().unwrap_or_else(|p| p.into_inner());
        let key = (caller.tenant.clone(), query.to_string());
        if rosters.len() >= MAX_ROSTERS && !rosters.contains_key(&key) {
            rosters.clear();
        }
        // Only what may still be alive is worth remembering.
        let live = list.sandboxes.iter().filter(|s| !matches!(s.state, api::SandboxState::Stopped | api::SandboxState::Failed));
        rosters.insert(key, live.cloned().collect());
        Ok(list.sandboxes)
    }

    /// The sandboxes the last answered `list(caller, query)` showed that
    /// could still be alive, in state `unknown` (the node cannot be reached).
    pub fn last_known(&self, caller: &Caller, query: &str, reason: &str) -> Vec<api::Sandbox> {
        let rosters = self.rosters.lock().unwrap_or_else(|p| p.into_inner());
        let Some(list) = rosters.get(&(caller.tenant.clone(), query.to_string())) else { return vec![] };
        list.iter()
            .map(|s| api::Sandbox { state: api::SandboxState::Unknown, state_reason: Some(reason.to_string()), ..s.clone() })
            .collect()
    }

    pub async fn fncall(&self, caller: &Caller, req: &api::FnCallRequest) -> Result<api::FnCallResponse, ApiError> {
        let body = serde_json::to_vec(req).map_err(|e| ApiError::invalid(e.to_string()))?;
        self.json(caller, axum::http::Method::POST, "/v1/fncall", Some(body)).await
    }

    pub async fn fncall_batch(&self, caller: &Caller, req: &api::FnCallBatchRequest) -> Result<api::FnCallBatchResponse, ApiError> {
        let body = serde_json::to_vec(req).map_err(|e| ApiError::invalid(e.to_string()))?;
        self.json(caller, axum::http::Method::POST, "/v1/fncall/batch", Some(body)).await
    }

    pub async fn fncall_pools(&self, caller: &Caller) -> Result<api::FnCallPools, ApiError> {
        self.json(caller, axum::http::Method::GET, "/v1/fncall/pools", None).await
    }

    pub async fn job_action(&self, caller: &Caller, job: &str, action: dsec_edge::JobAction) -> Result<api::JobActionResult, ApiError> {
        let verb = match action {
            dsec_edge::JobAction::Pause => "pause",
            dsec_edge::JobAction::Resume => "resume",
        };
        // Counts, not a 409, from each node: "already paused" is decided
        // on the merged answer of all of them.
        let path = format!("/v1/jobs/{}/{verb}?idempotent=true", crate::extract::path_segment(job));
        self.json(caller, axum::http::Method::POST, &path, None).await
    }

    /// Opens a streaming GET (event streams) and returns its body.
    pub async fn stream(&self, caller: &Caller, path_and_query: &str) -> Result<hyper::body::Incoming, ApiError> {
        let mut req = Request::builder()
            .method(axum::http::Method::GET)
            .uri(format!("{}{path_and_query}", self.url))
            .body(Body::empty())
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        self.sign(req.headers_mut(), caller)?;
        let resp = self.http.request(req).await.map_err(|e| self.unreachable(e))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let bytes: Bytes = resp.into_body().collect().await.map_err(|e| self.unreachable(e))?.to_bytes();
            return Err(match serde_json::from_slice::<api::ErrorBody>(&bytes) {
                Ok(e) => ApiError::new(e.error.code, e.error.message),
                Err(_) => ApiError::new(ErrorCode::Internal, format!("node {} answered HTTP {status}", self.name)),
            });
        }
        Ok(resp.into_body())
    }

    pub async fn images(&self, caller: &Caller) -> Result<api::ImageList, ApiError> {
        self.json(caller, axum::http::Method::GET, "/v1/images", None).await
    }

    /// Asks the node for its own status (one probe).
    pub async fn probe(&self) -> Result<api::NodeStatus, ApiError> {
        let admin = Caller::admin();
        let all: Vec<api::NodeStatus> = self.json(&admin, axum::http::Method::GET, "/v1/nodes", None).await?;
        all.into_iter()
            .find(|n| n.name == self.name)
            .ok_or_else(|| ApiError::new(ErrorCode::EdgeUnavailable, format!("the edge at {} serves another node", self.url)))
    }

    /// One probe, its answer recorded (the apiserver's own polling) as of
    /// when it was sent: the node's counts include whatever it had admitted
    /// by then (placement relies on that, see `Placement::observed`).
    pub async fn poll(&self) {
        let sent = Instant::now();
        match tokio::time::timeout(PROBE_TIMEOUT, self.probe()).await {
            Ok(Ok(status)) => self.record(status, sent.elapsed()),
            Ok(Err(e)) => {
                tracing::debug!(node = %self.name, error = %e.message, "probe failed");
                self.mark_down();
            }
            // No answer at all (its link down): as good as a refusal for
            // placement; the next answered probe brings it back.
            Err(_) => {
                tracing::debug!(node = %self.name, "probe not answered in time");
                self.mark_down();
            }
        }
    }

    /// Records a status the node answered `age` ago (by a probe of ours, or
    /// of the watcher).
    pub fn record(&self, status: api::NodeStatus, age: Duration) {
        let at = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        if view.as_ref().is_none_or(|(old, _)| *old <= at) {
            *view = Some((at, status));
            self.down.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The node failed a probe outright: `unreachable` until one succeeds.
    pub fn mark_down(&self) {
        self.down.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// When the status of the last answered probe was current.
    pub fn probed_at(&self) -> Option<Instant> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).as_ref().map(|(at, _)| *at)
    }

    /// The last answered probe and how long ago it was answered.
    pub fn last_view(&self) -> Option<(Duration, api::NodeStatus)> {
        let view = self.view.read().unwrap_or_else(|p| p.into_inner());
        view.as_ref().map(|(at, s)| (at.elapsed(), s.clone()))
    }

    /// Whether a probe was answered within [`VIEW_TTL`] and none failed
    /// since.
    pub fn reachable(&self) -> bool {
        let view = self.view.read().unwrap_or_else(|p| p.into_inner());
        !self.down.load(std::sync::atomic::Ordering::Relaxed) && view.as_ref().is_some_and(|(at, _)| at.elapsed() < VIEW_TTL)
    }

    /// The node as placement and `GET /v1/nodes` see it: its last answered
    /// probe, the registry's labels and drain, and its state (`ready`,
    /// `draining`, `unreachable`; `healthy` only when ready).
    pub fn status(&self) -> api::NodeStatus {
        let member = self.membership();
        let fresh = self.reachable();
        let view = self.view.read().unwrap_or_else(|p| p.into_inner());
        let mut s = match &*view {
            Some((_, s)) => s.clone(),
            None => {
                let cap = member.capacity.unwrap_or_default();
                api::NodeStatus {
                    name: self.name.clone(),
                    healthy: false,
                    sandboxes: 0,
                    cpu_reserved: 0.0,
                    cpu_capacity: cap.cpu_cores,
                    memory_reserved_mb: 0,
                    memory_capacity_mb: cap.memory_mb,
                    slots_used: 0,
                    slots_capacity: cap.max_sandboxes,
                    cgroup_version: 0,
                    backends: member.backends.clone(),
                    creating: 0,
                    queued: 0,
                    paused: 0,
                    state: String::new(),
                    labels: BTreeMap::new(),
                    sandboxes_by_backend: BTreeMap::new(),
                }
            }
        };
        s.name = self.name.clone();
        if s.backends.is_empty() {
            s.backends = member.backends.clone();
        }
        s.labels.extend(member.labels);
        s.state = if !fresh {
            "unreachable"
        } else if member.draining {
            "draining"
        } else {
            "ready"
        }
        .to_string();
        s.healthy = s.state == "ready";
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(name: &str) -> api::NodeStatus {
        api::NodeStatus {
            name: name.into(),
            healthy: true,
            sandboxes: 1,
            cpu_reserved: 1.0,
            cpu_capacity: 8.0,
            memory_reserved_mb: 100,
            memory_capacity_mb: 1000,
            slots_used: 1,
            slots_capacity: 10,
            cgroup_version: 2,
            backends: vec!["container".into(), "microvm".into()],
            creating: 0,
            queued: 0,
            paused: 0,
            state: "ready".into(),
            labels: BTreeMap::new(),
            sandboxes_by_backend: BTreeMap::new(),
        }
    }

    fn joined() -> RemoteNode {
        let member = Membership {
            labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
            backends: vec!["container".into()],
            capacity: Some(api::NodeCapacity { cpu_cores: 8.0, memory_mb: 1000, max_sandboxes: 10 }),
            draining: false,
            joined: false,
        };
        RemoteNode::joined("n1", "http://10.0.0.1:8081/", "s", member, &ClusterTls::plain()).unwrap()
    }

    #[test]
    fn a_node_never_probed_is_unreachable_with_what_it_declared() {
        let r = joined();
        let s = r.status();
        assert_eq!((s.state.as_str(), s.healthy), ("unreachable", false));
        assert_eq!(s.backends, vec!["container".to_string()]);
        assert_eq!((s.cpu_capacity, s.slots_capacity), (8.0, 10));
        assert_eq!(s.labels["zone"], "a");
        assert!(r.membership().joined, "a registry node is marked joined whatever it was given");
        assert!(r.reaches("http://10.0.0.1:8081", "s") && !r.reaches("http://10.0.0.1:8081", "other"));
    }

    #[test]
    fn probes_drain_and_failures_make_the_state() {
        let r = joined();
        r.record(status("n1"), Duration::ZERO);
        let s = r.status();
        assert_eq!((s.state.as_str(), s.healthy), ("ready", true));
        assert_eq!(s.backends.len(), 2, "what the node answered wins over what it declared");
        assert_eq!(s.labels["zone"], "a", "labels come from the registry");

        r.set_membership(Membership { draining: true, ..r.membership() });
        assert_eq!((r.status().state.as_str(), r.status().healthy), ("draining", false));

        r.set_membership(Membership { draining: false, ..r.membership() });
        r.mark_down();
        assert_eq!(r.status().state, "unreachable");
        assert_eq!(r.status().sandboxes, 1, "the last known counts stay");
        r.record(status("n1"), Duration::ZERO);
        assert_eq!(r.status().state, "ready");

        // An answer older than the TTL (the watcher's last success long ago)
        // is not fresh.
        let old = joined();
        old.record(status("n1"), VIEW_TTL + Duration::from_secs(1));
        assert_eq!(old.status().state, "unreachable");
    }
}
