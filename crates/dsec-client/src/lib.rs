//! A small async client of the dsec HTTP API, over one pooled keep-alive
//! HTTP/1.1 connection set. The CLI and the compiled load generators use it;
//! Python users have the SDK in sdk/python.

use bytes::Bytes;
use dsec_api as api;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client as HyperClient};
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::Serialize;

mod projects;
mod transfer;
pub use transfer::Chunks;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an API error.
    #[error("{code}: {message} (HTTP {status})")]
    Api { status: u16, code: api::ErrorCode, message: String },
    #[error("cannot reach {endpoint}: {detail}")]
    Connect { endpoint: String, detail: String },
    #[error("unexpected answer (HTTP {status}): {body}")]
    Protocol { status: u16, body: String },
    #[error("invalid endpoint {0:?}")]
    Endpoint(String),
}

impl ClientError {
    pub fn code(&self) -> Option<api::ErrorCode> {
        match self {
            ClientError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }
}

#[derive(Clone)]
pub struct Client {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    /// For request bodies sent as they are produced (`transfer`).
    streaming: HyperClient<HttpConnector, transfer::StreamedBody>,
    endpoint: String,
    auth: Option<String>,
}

impl Client {
    /// `endpoint` like `http://127.0.0.1:8080`.
    pub fn new(endpoint: &str, token: Option<&str>) -> Result<Client, ClientError> {
        let endpoint = endpoint.trim_end_matches('/').to_string();
        if !endpoint.starts_with("http://") {
            return Err(ClientError::Endpoint(endpoint));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http = HyperClient::builder(TokioExecutor::new()).pool_max_idle_per_host(1024).build(connector.clone());
        let streaming = HyperClient::builder(TokioExecutor::new()).build(connector);
        Ok(Client { http, streaming, endpoint, auth: token.map(|t| format!("Bearer {t}")) })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn token(&self) -> Option<&str> {
        self.auth.as_deref().and_then(|a| a.strip_prefix("Bearer "))
    }

    /// One request; JSON in, raw bytes out.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        content_type: &str,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        self.raw_with(method, path, body, content_type, &[]).await
    }

    /// [`Client::raw`] with extra request headers.
    pub async fn raw_with(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        content_type: &str,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let mut req = Request::builder().method(method).uri(format!("{}{path}", self.endpoint));
        if let Some(a) = &self.auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, content_type);
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|e| ClientError::Endpoint(e.to_string()))?;
        let resp = self.http.request(req).await.map_err(|e| self.connect_error(e))?;
        let status = resp.status();
        let body = self.read_body(resp.into_body()).await?;
        if !status.is_success() {
            return Err(api_error(status, &body));
        }
        Ok((status, body))
    }

    async fn read_body(&self, body: hyper::body::Incoming) -> Result<Bytes, ClientError> {
        Ok(body.collect().await.map_err(|e| self.connect_error(e))?.to_bytes())
    }

    fn connect_error(&self, e: impl std::fmt::Debug) -> ClientError {
        ClientError::Connect { endpoint: self.endpoint.clone(), detail: format!("{e:?}") }
    }

    async fn json<B: Serialize, T: DeserializeOwned>(&self, method: Method, path: &str, body: Option<&B>) -> Result<T, ClientError> {
        self.json_with(method, path, body, &[]).await
    }

    async fn json_with<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        headers: &[(&str, &str)],
    ) -> Result<T, ClientError> {
        let body = body.map(|b| serde_json::to_vec(b).expect("API types serialize"));
        let (status, bytes) = self.raw_with(method, path, body, "application/json", headers).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol { status: status.as_u16(), body: format!("{e}: {}", String::from_utf8_lossy(&bytes)) })
    }

    pub async fn health(&self) -> Result<api::Health, ClientError> {
        self.json::<(), _>(Method::GET, "/healthz", None).await
    }

    pub async fn create(&self, req: &api::CreateSandboxRequest) -> Result<api::Sandbox, ClientError> {
        self.json(Method::POST, "/v1/sandboxes", Some(req)).await
    }

    pub async fn get(&self, id: &str) -> Result<api::Sandbox, ClientError> {
        self.json::<(), _>(Method::GET, &format!("/v1/sandboxes/{id}"), None).await
    }

    pub async fn list(&self, query: &[(&str, &str)]) -> Result<api::SandboxList, ClientError> {
        let q: String = form_urlencoded::Serializer::new(String::new()).extend_pairs(query).finish();
        let path = if q.is_empty() { "/v1/sandboxes".to_string() } else { format!("/v1/sandboxes?{q}") };
        self.json::<(), _>(Method::GET, &path, None).await
    }

    /// What is at `path` in the sandbox (not following a final symlink).
    pub async fn stat(&self, id: &str, path: &str) -> Result<api::FileInfo, ClientError> {
        let q: String = form_urlencoded::Serializer::new(String::new()).append_pair("path", path).finish();
        self.json::<(), _>(Method::GET, &format!("/v1/sandboxes/{id}/files/stat?{q}"), None).await
    }

    pub async fn audit(&self, id: &str, after: u64) -> Result<api::AuditEvents, ClientError> {
        self.json::<(), _>(Method::GET, &format!("/v1/sandboxes/{id}/audit?after={after}"), None).await
    }

    pub async fn stop(&self, id: &str) -> Result<api::Sandbox, ClientError> {
        self.json::<(), _>(Method::POST, &format!("/v1/sandboxes/{id}/stop"), None).await
    }

    pub async fn pause(&self, id: &str) -> Result<api::PauseResult, ClientError> {
        self.json::<(), _>(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None).await
    }

    /// Pauses in `mode` (`auto`, `freeze` or `suspend`).
    pub async fn pause_mode(&self, id: &str, mode: &str) -> Result<api::PauseResult, ClientError> {
        let mode: String = form_urlencoded::byte_serialize(mode.as_bytes()).collect();
        self.json::<(), _>(Method::POST, &format!("/v1/sandboxes/{id}/pause?mode={mode}"), None).await
    }

    /// Snapshots a microVM's disk as `name`.
    pub async fn snapshot(&self, id: &str, name: &str, idempotency_key: Option<&str>) -> Result<api::Snapshot, ClientError> {
        let req = api::SnapshotRequest { name: name.to_string(), memory: false };
        let headers: Vec<(&str, &str)> = idempotency_key.map(|k| ("idempotency-key", k)).into_iter().collect();
        self.json_with(Method::POST, &format!("/v1/sandboxes/{id}/snapshot"), Some(&req), &headers).await
    }

    /// The caller's microVM snapshots.
    pub async fn snapshots(&self) -> Result<api::SnapshotList, ClientError> {
        self.json::<(), _>(Method::GET, "/v1/snapshots", None).await
    }

    /// Deletes snapshot `name` (409 `snapshot_in_use` while something
    /// backs onto it).
    pub async fn delete_snapshot(&self, name: &str) -> Result<(), ClientError> {
        let name: String = form_urlencoded::byte_serialize(name.as_bytes()).collect();
        self.raw(Method::DELETE, &format!("/v1/snapshots/{name}"), None, "").await.map(|_| ())
    }

    /// Makes named volume `name` of `size_mb` (the node's default: None).
    pub async fn create_volume(&self, name: &str, size_mb: Option<u64>) -> Result<api::Volume, ClientError> {
        let req = api::CreateVolumeRequest { name: name.to_string(), size_mb };
        self.json(Method::POST, "/v1/volumes", Some(&req)).await
    }

    /// The caller's named volumes, with the sandboxes using each.
    pub async fn volumes(&self) -> Result<api::VolumeList, ClientError> {
        self.json::<(), _>(Method::GET, "/v1/volumes", None).await
    }

    /// Removes volume `name` and its files (409 `volume_in_use` while a
    /// sandbox mounts it).
    pub async fn delete_volume(&self, name: &str) -> Result<(), ClientError> {
        let name: String = form_urlencoded::byte_serialize(name.as_bytes()).collect();
        self.raw(Method::DELETE, &format!("/v1/volumes/{name}"), None, "").await.map(|_| ())
    }

    pub async fn resume(&self, id: &str) -> Result<api::ResumeResult, ClientError> {
        self.json::<(), _>(Method::POST, &format!("/v1/sandboxes/{id}/resume"), None).await
    }

    pub async fn pack(&self, id: &str, req: &api::PackRequest) -> Result<api::PackResult, ClientError> {
        self.json(Method::POST, &format!("/v1/sandboxes/{id}/pack"), Some(req)).await
    }

    pub async fn set_timeout(&self, id: &str, req: &api::SetTimeoutRequest) -> Result<api::Sandbox, ClientError> {
        self.json(Method::POST, &format!("/v1/sandboxes/{id}/timeout"), Some(req)).await
    }

    /// `PATCH /v1/sandboxes/{id}`: e.g. a new QoS class.
    pub async fn update(&self, id: &str, req: &api::UpdateSandboxRequest) -> Result<api::Sandbox, ClientError> {
        self.json(Method::PATCH, &format!("/v1/sandboxes/{id}"), Some(req)).await
    }

    /// A signed URL for a TCP port inside a sandbox.
    pub async fn expose(&self, id: &str, req: &api::ExposeRequest) -> Result<api::ExposedPort, ClientError> {
        self.json(Method::POST, &format!("/v1/sandboxes/{id}/expose"), Some(req)).await
    }

    pub async fn set_network_rules(&self, id: &str, req: &api::NetworkRules) -> Result<api::NetworkRules, ClientError> {
        self.json(Method::PUT, &format!("/v1/sandboxes/{id}/network"), Some(req)).await
    }

    /// Pauses (`verb = "pause"`) or resumes (`"resume"`) every sandbox of a job.
    pub async fn job_action(&self, job: &str, verb: &str) -> Result<api::JobActionResult, ClientError> {
        let job: String = form_urlencoded::byte_serialize(job.as_bytes()).collect();
        self.json::<(), _>(Method::POST, &format!("/v1/jobs/{job}/{verb}"), None).await
    }

    pub async fn delete(&self, id: &str) -> Result<(), ClientError> {
        self.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None, "").await.map(|_| ())
    }

    pub async fn exec(&self, id: &str, req: &api::ExecRequest) -> Result<api::ExecResponse, ClientError> {
        self.json(Method::POST, &format!("/v1/sandboxes/{id}/exec"), Some(req)).await
    }

    /// An exec logged under a client step id (a logged one is not re-run).
    pub async fn exec_step(&self, id: &str, req: &api::ExecRequest, step_id: &str) -> Result<api::ExecResponse, ClientError> {
        self.json_with(Method::POST, &format!("/v1/sandboxes/{id}/exec"), Some(req), &[(api::STEP_ID_HEADER, step_id)]).await
    }

    pub async fn trajectory(&self, id: &str) -> Result<api::Trajectory, ClientError> {
        self.json::<(), _>(Method::GET, &format!("/v1/sandboxes/{id}/trajectory"), None).await
    }

    pub async fn replay(&self, id: &str, keep: bool) -> Result<api::ReplayReport, ClientError> {
        self.json::<(), _>(Method::POST, &format!("/v1/sandboxes/{id}/replay?keep={keep}"), None).await
    }

    pub async fn fncall(&self, req: &api::FnCallRequest) -> Result<api::FnCallResponse, ClientError> {
        self.json(Method::POST, "/v1/fncall", Some(req)).await
    }

    pub async fn images(&self) -> Result<api::ImageList, ClientError> {
        self.json::<(), _>(Method::GET, "/v1/images", None).await
    }

    pub async fn create_tenant(&self, name: &str) -> Result<api::TenantInfo, ClientError> {
        self.json(Method::POST, "/v1/tenants", Some(&api::CreateTenantRequest { name: name.into() })).await
    }

    /// The WebSocket URL of a streaming route, and the auth header value.
    pub fn ws_url(&self, path: &str) -> String {
        format!("ws://{}{path}", self.endpoint.trim_start_matches("http://"))
    }

    pub fn auth_header(&self) -> Option<&str> {
        self.auth.as_deref()
    }
}

/// The error an unsuccessful answer carries (the API's error body, or the
/// raw text if it is not one).
fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<api::ErrorBody>(body) {
        Ok(e) => ClientError::Api { status: status.as_u16(), code: e.error.code, message: e.error.message },
        Err(_) => ClientError::Protocol { status: status.as_u16(), body: String::from_utf8_lossy(body).into_owned() },
    }
}
