//! What every handler can reach.

use std::sync::Arc;

use dsec_api::ImageInfo;

use crate::auth::Authenticator;
use crate::http_metrics::HttpMetrics;
use crate::nodes::Nodes;
use crate::routes::fncall::FnCallBackend;

/// The node's image store as the API sees it (implemented by the binary over
/// dsec-image, so this crate stays free of storage code).
pub trait ImageCatalog: Send + Sync + 'static {
    fn list(&self) -> Result<Vec<ImageInfo>, String>;
    /// `Ok(false)` if no such image.
    fn remove(&self, reference: &str) -> Result<bool, String>;
}

#[derive(Clone)]
pub struct AppState {
    pub auth: Arc<Authenticator>,
    pub nodes: Arc<Nodes>,
    pub images: Option<Arc<dyn ImageCatalog>>,
    pub limits: Arc<ApiLimits>,
    /// Where FnCall calls run; `None`: FnCall is off.
    pub fncall: Option<Arc<FnCallBackend>>,
    /// Serve SandboxFusion's `/run_code` without credentials.
    pub sandboxfusion_open: bool,
    /// Serve sandbox ports at the hosts `PORT-ID.DOMAIN` of this domain.
    pub sandbox_domain: Option<String>,
    /// Dockerfile builds on this process's edge; `None`: an apiserver in
    /// front of edges in other processes.
    pub builder: Option<Arc<dsec_build::Builder>>,
    /// Request durations for `/metrics` (filled by the router's layer).
    pub http_metrics: Arc<HttpMetrics>,
}

impl AppState {
    /// A state with no image store, no FnCall and default limits (what a
    /// test of the HTTP layer needs).
    pub fn new(auth: Arc<Authenticator>, nodes: Arc<Nodes>) -> Self {
        Self {
            auth,
            nodes,
            images: None,
            limits: Arc::new(ApiLimits::default()),
            fncall: None,
            sandboxfusion_open: false,
            http_metrics: Default::default(),
            sandbox_domain: None,
            builder: None,
        }
    }
}

impl AppState {
    /// Keeps the quota ledger true to the nodes (their state events and
    /// listings); nothing to do on an edge serving apiservers.
    pub fn start_quota_watch(&self) {
        if let Some(tokens) = self.auth.tokens() {
            crate::quota::watch_nodes(self.nodes.clone(), tokens.ledger().clone());
        }
    }
}

/// Bounds on what one request may carry.
#[derive(Debug, Clone)]
pub struct ApiLimits {
    /// Largest file or archive upload, in bytes.
    pub max_upload_bytes: u64,
}

impl Default for ApiLimits {
    fn default() -> Self {
        Self { max_upload_bytes: 4 << 30 }
    }
}
