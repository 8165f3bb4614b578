//! A keyed creation retried through another replica goes to the node the
//! first try chose, even where the second replica would place elsewhere:
//! two `Nodes` (two replicas) on one store, two edges simulated over
//! loopback HTTP that, like a real edge's journal, answer a key they know
//! with the sandbox it made. Both engines (PostgreSQL with
//! `DSEC_TEST_POSTGRES`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use dsec_api as api;
use dsec_apiserver::nodes::Nodes;
use dsec_apiserver::remote::RemoteNode;
use dsec_edge::Caller;
use dsec_store::{AnyStore, Database};
use serde_json::json;

/// Per node: the sandboxes it made, by idempotency key.
type Made = Arc<Mutex<HashMap<String, Vec<String>>>>;

fn sandbox(node: &str, id: &str) -> serde_json::Value {
    json!({
        "id": id, "backend": "container", "image": "busybox", "workspace": null, "toolkits": [],
        "state": "running", "state_reason": null, "node": node,
        "limits": {"memory_limit_mb": 64, "cpu_cores_limit": 1.0, "disk_limit_mb": 1024, "pids_limit": 256},
        "qos_class": "latency_sensitive", "init_user": "root", "ttl_running_stop": 600, "max_lifetime_s": 0,
        "labels": {}, "job": null, "created_at": "2026-01-01T00:00:00Z", "last_active_at": "2026-01-01T00:00:00Z",
        "stopped_at": null, "create_ms": 1.0
    })
}

async fn create(State(made): State<Made>, Path(node): Path<String>, headers: HeaderMap) -> (StatusCode, Json<serde_json::Value>) {
    let key = headers.get(api::IDEMPOTENCY_KEY_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let mut made = made.lock().unwrap();
    let ids = made.entry(node.clone()).or_default();
    let id = format!("{node}.{:012}", ids.len());
    // A key this node made a sandbox for: that one again (the journal).
    if let Some(pos) = ids.iter().position(|k| *k == key) {
        return (StatusCode::CREATED, Json(sandbox(&node, &format!("{node}.{pos:012}"))));
    }
    ids.push(key);
    (StatusCode::CREATED, Json(sandbox(&node, &id)))
}

async fn status(Path(node): Path<String>) -> Json<serde_json::Value> {
    Json(json!([{
        "name": node, "healthy": true, "sandboxes": 0, "cpu_reserved": 0.0, "cpu_capacity": 64.0,
        "memory_reserved_mb": 0, "memory_capacity_mb": 65536, "slots_used": 0, "slots_capacity": 1000,
        "cgroup_version": 2, "backends": ["container"], "creating": 0, "queued": 0, "paused": 0,
        "state": "ready", "labels": {}, "sandboxes_by_backend": {}
    }]))
}

async fn edges() -> (String, Made) {
    let made: Made = Arc::default();
    let app = Router::new().route("/e/{node}/v1/sandboxes", post(create)).route("/e/{node}/v1/nodes", get(status)).with_state(made.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, made)
}

/// A replica that sees both nodes, with `full` looking full to it.
async fn replica(url: &str, full: &str) -> Nodes {
    let nodes = Nodes::new(vec![]);
    for name in ["n1", "n2"] {
        let r = RemoteNode::new(name, &format!("{url}/e/{name}"), "s", &dsec_apiserver::cluster_tls::ClusterTls::plain()).unwrap();
        let mut s: api::NodeStatus = serde_json::from_value(status(Path(name.to_string())).await.0[0].clone()).unwrap();
        if name == full {
            s.cpu_reserved = s.cpu_capacity;
        }
        r.record(s, Duration::ZERO);
        nodes.put_remote(Arc::new(r));
    }
    nodes
}

fn request() -> api::CreateSandboxRequest {
    serde_json::from_value(json!({"image": "busybox", "cpu_cores_limit": 1.0, "memory_limit_mb": 64})).unwrap()
}

async fn retried_through_another_replica(store: &AnyStore) {
    let (url, made) = edges().await;
    let caller = Caller::tenant("team-a");
    // A places only on n1, B only on n2 (each sees the other node full).
    let (a, b) = (replica(&url, "n2").await, replica(&url, "n1").await);
    let first = a.create(&caller, request(), Some("k1"), Some(store)).await.unwrap();
    assert_eq!(first.sandbox.node, "n1");
    let retry = b.create(&caller, request(), Some("k1"), Some(store)).await.unwrap();
    assert_eq!(retry.sandbox.id, first.sandbox.id, "the retry met the first try's node and its sandbox");
    let other = b.create(&caller, request(), Some("k2"), Some(store)).await.unwrap();
    assert_eq!(other.sandbox.node, "n2", "a new key is placed afresh");
    let made = made.lock().unwrap();
    assert_eq!(made.get("n1").map(Vec::len), Some(1), "one sandbox for k1");
    assert_eq!(made.get("n2").map(Vec::len), Some(1), "one sandbox for k2");
}

#[tokio::test]
async fn sqlite_a_keyed_creation_retried_through_another_replica_makes_one_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&Database::Sqlite(dir.path().join("api.db"))).await.unwrap();
    retried_through_another_replica(&store).await;
}

#[tokio::test]
async fn postgres_a_keyed_creation_retried_through_another_replica_makes_one_sandbox() {
    let Some(url) = dsec_store::testing::fresh_schema("keyed creations").await else { return };
    let store = AnyStore::open(&Database::Postgres(url)).await.unwrap();
    retried_through_another_replica(&store).await;
}
