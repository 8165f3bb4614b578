//! Simulated edges for the cluster benchmarks: each answers admission at
//! once (a creation is counted and acknowledged, a full node refuses with
//! `no_capacity`) and reports its counts to probes, over real HTTP on
//! loopback. Many nodes share one listener under `/e/{node}`; a node can
//! have a listener of its own, to be killed (its listener and connections
//! closed: connections refused, as after a crash) or partitioned (nothing
//! it gets is ever answered).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use dsec_api as api;

pub struct FakeNode {
    pub name: String,
    cpu_capacity: f64,
    /// CPU admitted, in thousandths of a core.
    cpu_millis: AtomicU64,
    pub admitted: AtomicU64,
    ids: Mutex<Vec<String>>,
    /// Partitioned: requests are read and never answered.
    pub silent: AtomicBool,
}

/// A ready node's status as its edge reports it: `used` sandboxes of 64 MB
/// each holding `cpu_reserved` cores of `cpu_capacity`.
pub(crate) fn node_status(
    name: &str,
    cpu_capacity: f64,
    cpu_reserved: f64,
    used: u64,
    backends: &[&str],
    labels: BTreeMap<String, String>,
) -> api::NodeStatus {
    api::NodeStatus {
        name: name.to_string(),
        healthy: true,
        sandboxes: used,
        cpu_reserved,
        cpu_capacity,
        memory_reserved_mb: used * 64,
        memory_capacity_mb: 1 << 30,
        slots_used: used,
        slots_capacity: 1 << 20,
        cgroup_version: 2,
        backends: backends.iter().map(|b| b.to_string()).collect(),
        creating: 0,
        queued: 0,
        paused: 0,
        state: "ready".into(),
        labels,
        sandboxes_by_backend: BTreeMap::new(),
    }
}

impl FakeNode {
    fn status(&self) -> api::NodeStatus {
        let used = self.admitted.load(Ordering::Relaxed);
        let cpu = self.cpu_millis.load(Ordering::Relaxed) as f64 / 1000.0;
        node_status(&self.name, self.cpu_capacity, cpu, used, &["container"], BTreeMap::new())
    }

    fn sandbox(&self, id: &str, cpu: f64) -> api::Sandbox {
        api::Sandbox {
            id: id.to_string(),
            project: String::new(),
            backend: api::Backend::Container,
            image: "busybox".into(),
            workspace: None,
            toolkits: vec![],
            state: api::SandboxState::Running,
            state_reason: None,
            node: self.name.clone(),
            limits: api::Limits { memory_limit_mb: 64, cpu_cores_limit: cpu, disk_limit_mb: 1024, pids_limit: 256 },
            qos_class: api::QosClass::default(),
            init_user: "root".into(),
            ttl_running_stop: 600,
            max_lifetime_s: 0,
            labels: BTreeMap::new(),
            job: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            last_active_at: "2026-01-01T00:00:00Z".into(),
            stopped_at: None,
            create_ms: Some(0.0),
            queue_position: None,
            paused_at: None,
            memory_freed_bytes: None,
            suspended: false,
        }
    }
}

/// Every simulated node, by name.
#[derive(Clone)]
pub struct FakeEdges {
    pub nodes: Arc<BTreeMap<String, Arc<FakeNode>>>,
}

impl FakeEdges {
    pub fn new(count: usize, cpu_capacity: f64) -> FakeEdges {
        let nodes = (0..count)
            .map(|i| {
                let name = format!("edge-{i:04}");
                let node = FakeNode {
                    name: name.clone(),
                    cpu_capacity,
                    cpu_millis: AtomicU64::new(0),
                    admitted: AtomicU64::new(0),
                    ids: Mutex::new(Vec::new()),
                    silent: AtomicBool::new(false),
                };
                (name, Arc::new(node))
            })
            .collect();
        FakeEdges { nodes: Arc::new(nodes) }
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route("/e/{node}/v1/nodes", get(nodes))
            .route("/e/{node}/v1/sandboxes", get(list).post(create))
            .with_state(self.clone())
    }

    /// Serves the routes on a new loopback listener; `http://ADDR`.
    pub async fn serve(&self, stop: tokio::sync::oneshot::Receiver<()>) -> anyhow::Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let app = self.router();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.await;
                })
                .await;
        });
        Ok(url)
    }
}

fn node(edges: &FakeEdges, name: &str) -> Result<Arc<FakeNode>, StatusCode> {
    edges.nodes.get(name).cloned().ok_or(StatusCode::NOT_FOUND)
}

async fn hang_if_silent(n: &FakeNode) {
    if n.silent.load(Ordering::Relaxed) {
        std::future::pending::<()>().await;
    }
}

async fn nodes(State(edges): State<FakeEdges>, Path(name): Path<String>) -> Result<Json<Vec<api::NodeStatus>>, Response> {
    let n = node(&edges, &name).map_err(IntoResponse::into_response)?;
    hang_if_silent(&n).await;
    Ok(Json(vec![n.status()]))
}

async fn list(State(edges): State<FakeEdges>, Path(name): Path<String>) -> Result<Json<api::SandboxList>, Response> {
    let n = node(&edges, &name).map_err(IntoResponse::into_response)?;
    hang_if_silent(&n).await;
    let ids = n.ids.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let sandboxes = ids.iter().map(|id| n.sandbox(id, 1.0)).collect();
    Ok(Json(api::SandboxList { sandboxes, unreachable_nodes: vec![] }))
}

async fn create(
    State(edges): State<FakeEdges>,
    Path(name): Path<String>,
    Json(req): Json<api::CreateSandboxRequest>,
) -> Result<(StatusCode, Json<api::CreatedSandbox>), Response> {
    let n = node(&edges, &name).map_err(IntoResponse::into_response)?;
    hang_if_silent(&n).await;
    let cpu = req.cpu_cores_limit.unwrap_or(1.0);
    let millis = (cpu * 1000.0) as u64;
    // Admission: the node's own check has the final say.
    let before = n.cpu_millis.fetch_add(millis, Ordering::Relaxed);
    if (before + millis) as f64 > n.cpu_capacity * 1000.0 {
        n.cpu_millis.fetch_sub(millis, Ordering::Relaxed);
        let body = api::ErrorBody::new(api::ErrorCode::NoCapacity, format!("node {name} is full"));
        return Err((StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response());
    }
    let seq = n.admitted.fetch_add(1, Ordering::Relaxed);
    let id = format!("{name}.{seq:012}");
    n.ids.lock().unwrap_or_else(|p| p.into_inner()).push(id.clone());
    Ok((StatusCode::CREATED, Json(api::CreatedSandbox { sandbox: n.sandbox(&id, cpu), first_exec: None })))
}
