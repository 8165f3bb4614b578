//! An edge in another process (`dsec edge`), reached over HTTP.
//!
//! The apiserver authenticates the user, then forwards the request as is to
//! the edge that owns the sandbox, adding the cluster secret and the caller's
//! name. Bodies stream through in both directions and WebSocket upgrades are
//! spliced, so exec streams, PTYs and file transfers work unchanged.

use std::sync::RwLock;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use bytes::Bytes;
use dsec_api::{self as api, ErrorCode};
use dsec_edge::Caller;
use http_body_util::BodyExt;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::auth::{ADMIN_HEADER, TENANT_HEADER};
use crate::error::ApiError;

/// How long a node's last poll stays trustworthy.
const VIEW_TTL: Duration = Duration::from_secs(5);
/// How often the watcher polls each remote node.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

pub struct RemoteNode {
    pub name: String,
    url: String,
    bearer: HeaderValue,
    http: Client<HttpConnector, Body>,
    /// The watcher's last view of the node and when it was taken.
    view: RwLock<Option<(std::time::Instant, api::NodeStatus)>>,
}

impl RemoteNode {
    pub fn new(name: &str, url: &str, cluster_secret: &str) -> Result<Self, String> {
        let url = url.trim_end_matches('/').to_string();
        if !url.starts_with("http://") {
            return Err(format!("edge URL {url:?} must start with http://"));
        }
        let bearer = HeaderValue::from_str(&format!("Bearer {cluster_secret}")).map_err(|e| e.to_string())?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(3)));
        let http = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(256).build(connector);
        Ok(Self { name: name.to_string(), url, bearer, http, view: RwLock::new(None) })
    }

    fn unreachable(&self, e: impl std::fmt::Display) -> ApiError {
        ApiError::new(ErrorCode::EdgeUnavailable, format!("node {} ({}) cannot be reached: {e}", self.name, self.url))
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
        let body = serde_json::to_vec(req).map_err(|e| ApiError::invalid(e.to_string()))?;
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
        Ok(list.sandboxes)
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

    /// One watcher poll: the node's own status.
    pub async fn poll(&self) {
        let admin = Caller::admin();
        let got: Result<Vec<api::NodeStatus>, ApiError> = self.json(&admin, axum::http::Method::GET, "/v1/nodes", None).await;
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        match got.map(|v| v.into_iter().find(|n| n.name == self.name)) {
            Ok(Some(status)) => *view = Some((std::time::Instant::now(), status)),
            Ok(None) => tracing::warn!(node = %self.name, "edge at {} serves another node", self.url),
            Err(e) => tracing::debug!(node = %self.name, error = %e.message, "poll failed"),
        }
    }

    /// The last view if fresh; `healthy: false` otherwise.
    pub fn status(&self) -> api::NodeStatus {
        let view = self.view.read().unwrap_or_else(|p| p.into_inner());
        match &*view {
            Some((at, s)) if at.elapsed() < VIEW_TTL => s.clone(),
            Some((_, s)) => api::NodeStatus { healthy: false, ..s.clone() },
            None => api::NodeStatus {
                name: self.name.clone(),
                healthy: false,
                sandboxes: 0,
                cpu_reserved: 0.0,
                cpu_capacity: 0.0,
                memory_reserved_mb: 0,
                memory_capacity_mb: 0,
                slots_used: 0,
                slots_capacity: 0,
                cgroup_version: 0,
                backends: vec![],
                creating: 0,
                queued: 0,
                paused: 0,
            },
        }
    }
}
