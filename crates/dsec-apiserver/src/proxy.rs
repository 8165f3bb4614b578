//! Forwarding of sandbox requests to edges in other processes.
//!
//! Sits in front of the routes: a request under `/v1/sandboxes/{id}/...`
//! whose id names a remote node is authenticated here and forwarded whole
//! (method, path, query, streaming body, WebSocket upgrade) to that node.
//! Everything else falls through to the local handlers.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::nodes::Node;
use crate::state::AppState;

pub async fn forward_remote(State(st): State<AppState>, req: Request<Body>, next: Next) -> Response {
    let id = req.uri().path().strip_prefix("/v1/sandboxes/").and_then(|rest| rest.split('/').next()).filter(|s| !s.is_empty());
    let Some(id) = id else { return next.run(req).await };
    let remote = match st.nodes.node_of(id) {
        Ok(Node::Remote(r)) => r.clone(),
        _ => return next.run(req).await,
    };
    let caller = match st.auth.authenticate(req.headers()) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    match remote.forward(&caller, req).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}
