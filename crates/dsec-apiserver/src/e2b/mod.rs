//! E2B compatibility: the control-plane REST API of E2B's cloud and the
//! in-sandbox API of its `envd`, as the unmodified `e2b` Python SDK calls
//! them, translated onto the same edge operations as the native API.
//!
//! A user points the SDK at this listener (`E2B_API_URL` and
//! `E2B_SANDBOX_URL`) with a dsec token as `E2B_API_KEY`. Control-plane
//! calls carry the token in `X-API-Key`; envd calls name their sandbox in
//! `E2b-Sandbox-Id` and prove access with the sandbox's `X-Access-Token`
//! (`envd`). Which parts of E2B are covered: docs/e2b.md.

mod connect;
mod envd;
mod error;
mod files;
mod filesystem;
mod process;
mod processes;
mod sandboxes;
mod view;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use crate::state::AppState;

/// What the E2B routes share: the API's state and the table of processes
/// started through envd's process service.
#[derive(Clone)]
pub struct E2bState {
    pub app: AppState,
    pub processes: Arc<processes::ProcessTable>,
}

/// Where a sandbox named by an E2B call lives.
pub enum Owner<'a> {
    Local(&'a dsec_edge::Edge),
    /// On another node: the E2B routes serve the edges of their own process.
    Remote(String),
    /// No node of this name.
    Unknown,
}

impl E2bState {
    pub fn owner(&self, id: &str) -> Owner<'_> {
        match self.app.nodes.node_of(id) {
            Ok(crate::nodes::NodeRef::Local(e)) => Owner::Local(e),
            Ok(crate::nodes::NodeRef::Remote(r)) => Owner::Remote(r.name.clone()),
            Err(_) => Owner::Unknown,
        }
    }
}

/// Why a sandbox of a remote node is not served.
pub fn remote_message(id: &str, node: &str) -> String {
    format!("sandbox {id} lives on node {node}: the E2B routes serve the sandboxes of the edges in their own process")
}

/// The largest envd call message (stdin sent in one `SendInput` included).
const MAX_RPC_BODY: usize = 16 << 20;

/// The E2B routes, with their own state, to merge into the API's router.
pub fn router(app: AppState) -> Router {
    let st = E2bState { app, processes: Arc::new(processes::ProcessTable::default()) };
    Router::new()
        .route("/sandboxes", post(sandboxes::create).get(sandboxes::list_v1))
        .route("/v2/sandboxes", post(sandboxes::create).get(sandboxes::list_v2))
        .route("/sandboxes/{id}", get(sandboxes::get).delete(sandboxes::kill))
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/sandboxes/{id}/resume", post(sandboxes::resume))
        .route("/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/v2/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/health", get(envd::health))
        .route("/files", get(files::download).post(files::upload))
        .route("/process.Process/{method}", post(process::dispatch).layer(DefaultBodyLimit::max(MAX_RPC_BODY)))
        .route("/filesystem.Filesystem/{method}", post(filesystem::dispatch).layer(DefaultBodyLimit::max(MAX_RPC_BODY)))
        // Uploads (`/files`) are streamed and bounded by ApiLimits.
        .layer(DefaultBodyLimit::disable())
        .with_state(st)
}
