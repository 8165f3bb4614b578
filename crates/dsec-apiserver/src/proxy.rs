//! Forwarding of sandbox requests to edges in other processes.
//!
//! Sits in front of the routes: a request under `/v1/sandboxes/{id}/...`
//! whose id names a remote node, or under `/v1/nodes/{node}/...` for a
//! remote node, is authenticated here and forwarded whole (method, path,
//! query, streaming body, WebSocket upgrade) to that node. Everything else
//! falls through to the local handlers.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::nodes::NodeRef;
use crate::state::AppState;

pub async fn forward_remote(State(st): State<AppState>, req: Request<Body>, next: Next) -> Response {
    let path = req.uri().path();
    let target = match first_segment(path, "/v1/sandboxes/") {
        Some(id) => st.nodes.node_of(id).ok().map(|n| (n, id)),
        // A node's own pages (its metrics); drain, undrain and removal are
        // the registry's, answered here.
        None => first_segment(path, "/v1/nodes/")
            .filter(|name| path.starts_with(&format!("/v1/nodes/{name}/metrics")))
            .and_then(|name| st.nodes.by_name(name).map(|n| (n, name))),
    };
    let Some((NodeRef::Remote(remote), id)) = target else { return next.run(req).await };
    // Port URLs are signed here, with this apiserver's key; port requests
    // may carry such a signature instead of a token (`ports::serve`
    // checks it, then forwards).
    if path.strip_prefix("/v1/sandboxes/").and_then(|r| r.split_once('/')).is_some_and(|(_, rest)| rest == "expose") {
        return next.run(req).await;
    }
    if let Some((id, port, rest)) = crate::ports::parse_path(path) {
        let Ok(port) = port.parse::<u16>() else { return next.run(req).await };
        let (id, rest) = (id.to_string(), rest.to_string());
        return crate::ports::serve(&st, &id, port, &rest, req).await.unwrap_or_else(IntoResponse::into_response);
    }
    let (remote, id) = (remote.clone(), id.to_string());
    let caller = match st.auth.authenticate(req.headers()).await {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    // `GET /v1/sandboxes/{id}` of a node that cannot be reached answers
    // what is known: the sandbox is in state `unknown`.
    let is_get = req.method() == axum::http::Method::GET && req.uri().path().trim_end_matches('/') == format!("/v1/sandboxes/{id}");
    match remote.forward(&caller, req).await {
        Ok(resp) => resp,
        Err(e) if is_get && e.code == dsec_api::ErrorCode::EdgeUnavailable => {
            axum::Json(unknown(&id, &remote.name, e.message)).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// The path segment right after `prefix`, if any.
fn first_segment<'p>(path: &'p str, prefix: &str) -> Option<&'p str> {
    path.strip_prefix(prefix).and_then(|rest| rest.split('/').next()).filter(|s| !s.is_empty())
}

/// A sandbox whose node cannot be reached: only its id, node and state are
/// known (and why); every other field is empty.
fn unknown(id: &str, node: &str, reason: String) -> dsec_api::Sandbox {
    dsec_api::Sandbox {
        id: id.to_string(),
        project: String::new(),
        backend: Default::default(),
        image: String::new(),
        workspace: None,
        toolkits: vec![],
        state: dsec_api::SandboxState::Unknown,
        state_reason: Some(reason),
        node: node.to_string(),
        limits: dsec_api::Limits { memory_limit_mb: 0, cpu_cores_limit: 0.0, disk_limit_mb: 0, pids_limit: 0 },
        qos_class: Default::default(),
        init_user: String::new(),
        ttl_running_stop: 0,
        max_lifetime_s: 0,
        labels: Default::default(),
        job: None,
        created_at: String::new(),
        last_active_at: String::new(),
        stopped_at: None,
        create_ms: None,
        queue_position: None,
        paused_at: None,
        memory_freed_bytes: None,
        suspended: false,
    }
}
