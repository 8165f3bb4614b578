//! A small async client of the dsec HTTP API, over one pooled keep-alive
//! HTTP/1.1 connection set. The CLI and the compiled load generators use it;
//! Python users have the SDK in sdk/python.
//!
//! It may know several endpoints (apiserver replicas, any of which serves
//! any request, given as `http://a,http://b`): a request that cannot reach
//! one goes to the next when sending it again is safe (idempotent methods,
//! creations, which carry an idempotency key, trajectory steps) or it was
//! refused at connect (never sent); the replica that answered stays current.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use dsec_api as api;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
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
    #[error("invalid endpoint {0:?} (http://HOST:PORT or https://HOST:PORT)")]
    Endpoint(String),
    #[error(transparent)]
    Tls(#[from] dsec_tls::TlsError),
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
    http: HyperClient<Connector, Full<Bytes>>,
    /// For request bodies sent as they are produced (`transfer`).
    streaming: HyperClient<Connector, transfer::StreamedBody>,
    /// What https:// endpoints are checked against (also for WebSockets).
    tls: Arc<dsec_tls::ClientConfig>,
    /// Every endpoint, in order of preference.
    endpoints: Arc<[String]>,
    /// The index of the endpoint requests go to now (shared by clones).
    current: Arc<AtomicUsize>,
    auth: Option<String>,
}

/// Headers that make a request safe to send again, to any replica: the
/// server answers a repeat with the first request's result.
const REPLAY_HEADERS: [&str; 2] = [api::IDEMPOTENCY_KEY_HEADER, "x-dsec-step-id"];

type Connector = HttpsConnector<HttpConnector>;

impl Client {
    /// `endpoint` like `http://127.0.0.1:8080`, or several separated by
    /// commas (replicas of one cluster); an `https://` one is checked
    /// against the public web's roots.
    pub fn new(endpoint: &str, token: Option<&str>) -> Result<Client, ClientError> {
        Self::with_ca(endpoint, token, None)
    }

    /// [`Client::new`], `https://` endpoints checked against the CA in
    /// `ca` (PEM: a cluster's CA, `dsec cluster init`) instead.
    pub fn with_ca(endpoint: &str, token: Option<&str>, ca: Option<&Path>) -> Result<Client, ClientError> {
        let endpoints: Vec<String> =
            endpoint.split(',').map(|e| e.trim().trim_end_matches('/').to_string()).filter(|e| !e.is_empty()).collect();
        if endpoints.is_empty() {
            return Err(ClientError::Endpoint(endpoint.to_string()));
        }
        let has_host = |e: &str| {
            let rest = e.strip_prefix("http://").or_else(|| e.strip_prefix("https://"));
            rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/'))
        };
        if let Some(bad) = endpoints.iter().find(|e| !has_host(e)) {
            return Err(ClientError::Endpoint(bad.clone()));
        }
        // Loading the roots costs nothing worth avoiding for http://, and
        // keeps one connector type.
        let tls = dsec_tls::client_config(ca)?;
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new().with_tls_config((*tls).clone()).https_or_http().enable_http1().wrap_connector(http);
        let http = HyperClient::builder(TokioExecutor::new()).pool_max_idle_per_host(1024).build(connector.clone());
        let streaming = HyperClient::builder(TokioExecutor::new()).build(connector);
        Ok(Client {
            http,
            streaming,
            tls,
            endpoints: endpoints.into(),
            current: Arc::new(AtomicUsize::new(0)),
            auth: token.map(|t| format!("Bearer {t}")),
        })
    }

    /// The endpoint requests go to now.
    pub fn endpoint(&self) -> &str {
        &self.endpoints[self.current.load(Ordering::Relaxed) % self.endpoints.len()]
    }

    /// Every endpoint, in order of preference.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
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
        let safe = matches!(method, Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS)
            || headers.iter().any(|(k, _)| REPLAY_HEADERS.iter().any(|r| k.eq_ignore_ascii_case(r)));
        let has_body = body.is_some();
        let body = Bytes::from(body.unwrap_or_default());
        let first = self.current.load(Ordering::Relaxed);
        let n = self.endpoints.len();
        for attempt in 0..n {
            let i = (first + attempt) % n;
            let endpoint = &self.endpoints[i];
            let mut req = Request::builder().method(method.clone()).uri(format!("{endpoint}{path}"));
            if let Some(a) = &self.auth {
                req = req.header(header::AUTHORIZATION, a);
            }
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            if has_body {
                req = req.header(header::CONTENT_TYPE, content_type);
            }
            let req = req.body(Full::new(body.clone())).map_err(|e| ClientError::Endpoint(e.to_string()))?;
            let resp = match self.http.request(req).await {
                Ok(resp) => resp,
                // Refused at connect, the request never left; otherwise the
                // replica may have acted on it.
                Err(e) if attempt + 1 < n && (safe || e.is_connect()) => continue,
                Err(e) => return Err(connect_error(endpoint, e)),
            };
            let status = resp.status();
            let bytes = match resp.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) if attempt + 1 < n && safe => continue,
                Err(e) => return Err(connect_error(endpoint, e)),
            };
            self.current.store(i, Ordering::Relaxed);
            if !status.is_success() {
                return Err(api_error(status, &bytes));
            }
            return Ok((status, bytes));
        }
        unreachable!("the last endpoint's failure returns")
    }

    async fn read_body(&self, body: hyper::body::Incoming) -> Result<Bytes, ClientError> {
        Ok(body.collect().await.map_err(|e| self.connect_error(e))?.to_bytes())
    }

    fn connect_error(&self, e: impl std::error::Error) -> ClientError {
        connect_error(self.endpoint(), e)
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

    /// Creates a sandbox under a fresh idempotency key (none with a first
    /// command, which a retry would run again), so a retry through another
    /// replica makes one sandbox.
    pub async fn create(&self, req: &api::CreateSandboxRequest) -> Result<api::Sandbox, ClientError> {
        let key = fresh_key();
        let headers: Vec<(&str, &str)> = if req.first_exec.is_none() { vec![(api::IDEMPOTENCY_KEY_HEADER, key.as_str())] } else { vec![] };
        self.json_with(Method::POST, "/v1/sandboxes", Some(req), &headers).await
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

    pub async fn forward_tcp(&self, id: &str, req: &api::CreateForwardRequest) -> Result<api::TcpForward, ClientError> {
        self.json(Method::POST, &format!("/v1/sandboxes/{id}/forwards"), Some(req)).await
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

    /// The WebSocket URL of a streaming route (`ws://` or `wss://`).
    pub fn ws_url(&self, path: &str) -> String {
        let e = self.endpoint();
        match e.strip_prefix("https://") {
            Some(rest) => format!("wss://{rest}{path}"),
            None => format!("ws://{}{path}", e.trim_start_matches("http://")),
        }
    }

    /// What a `wss://` connection checks the server's certificate against.
    pub fn tls_config(&self) -> Arc<dsec_tls::ClientConfig> {
        self.tls.clone()
    }

    pub fn auth_header(&self) -> Option<&str> {
        self.auth.as_deref()
    }
}

fn connect_error(endpoint: &str, e: impl std::error::Error) -> ClientError {
    ClientError::Connect { endpoint: endpoint.to_string(), detail: api::with_causes(&e) }
}

/// A creation's idempotency key, unique across calls and processes: std's
/// randomly keyed hasher over the time, the process id and a counter.
fn fresh_key() -> String {
    use std::hash::{BuildHasher, Hasher};
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let half = |i: u8| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(t);
        h.write_u32(std::process::id());
        h.write_u64(n);
        h.write_u8(i);
        h.finish()
    };
    format!("{:016x}{:016x}", half(0), half(1))
}

/// The error an unsuccessful answer carries (the API's error body, or the
/// raw text if it is not one).
fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<api::ErrorBody>(body) {
        Ok(e) => ClientError::Api { status: status.as_u16(), code: e.error.code, message: e.error.message },
        Err(_) => ClientError::Protocol { status: status.as_u16(), body: String::from_utf8_lossy(body).into_owned() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn endpoints_are_a_comma_separated_list() {
        let c = Client::new("http://10.0.0.1:8080/, http://10.0.0.2:8080", None).unwrap();
        assert_eq!(c.endpoints(), ["http://10.0.0.1:8080", "http://10.0.0.2:8080"]);
        assert_eq!(c.endpoint(), "http://10.0.0.1:8080");
        assert!(matches!(Client::new(" , ", None), Err(ClientError::Endpoint(_))));
        assert!(matches!(Client::new("http://a:1,ftp://b:2", None), Err(ClientError::Endpoint(e)) if e == "ftp://b:2"));
        assert!(matches!(Client::new("https://", None), Err(ClientError::Endpoint(_))));
        let c = Client::new("https://10.0.0.1:8443", None).unwrap();
        assert_eq!(c.ws_url("/v1/x"), "wss://10.0.0.1:8443/v1/x");
        assert!(matches!(Client::with_ca("https://a:1", None, Some(Path::new("/nonexistent/ca.pem"))), Err(ClientError::Tls(_))));
    }

    #[test]
    fn creation_keys_differ() {
        let keys: std::collections::HashSet<String> = (0..1000).map(|_| fresh_key()).collect();
        assert_eq!(keys.len(), 1000);
        assert!(keys.iter().all(|k| k.len() == 32));
    }

    /// A loopback port nothing listens on.
    fn closed_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn a_replica_that_refuses_connections_is_passed_over_and_keys_are_sent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 65536];
            let n = conn.read(&mut buf).await.unwrap();
            let body = br#"{"status":"ok","version":"t","nodes":[]}"#;
            let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
            conn.write_all(head.as_bytes()).await.unwrap();
            conn.write_all(body).await.unwrap();
            String::from_utf8_lossy(&buf[..n]).to_string()
        });
        let dead = format!("http://127.0.0.1:{}", closed_port());
        let c = Client::new(&format!("{dead},{live}"), None).unwrap();
        // A POST without a key: safe only because the connection was refused.
        let (status, _) = c.raw(Method::POST, "/healthz", None, "").await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(c.endpoint(), live, "the replica that answered is current");
        assert!(server.await.unwrap().starts_with("POST /healthz"));
    }
}
