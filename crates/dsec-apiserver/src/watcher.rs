//! `dsec watcher`: a process of its own that probes every edge of the node
//! registry each period and serves what it saw (`GET /v1/watcher/view`)
//! to the apiservers, so that N replicas cost each edge one probe per
//! period instead of N.
//!
//! It holds no durable state: the registry is read from the shared store,
//! the load from the edges. Restarted, it has its whole view again after
//! one registry read and one round of probes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::get;
use axum::{Json, Router};
use dsec_api::{self as api, ErrorCode};
use dsec_edge::model::now_ms;
use dsec_store::{AnyStore, Database, Store, StoreError};

use crate::auth::{hash, TokenStore};
use crate::cluster_tls::ClusterTls;
use crate::error::ApiError;
use crate::nodes::Nodes;
use crate::registry;

pub struct Watcher {
    /// The registry's edges (remote nodes only), each with its last probe.
    nodes: Nodes,
    tokens: TokenStore,
    period: Duration,
}

impl Watcher {
    /// Opens the shared store (PostgreSQL: the watcher is a process beside
    /// the apiservers) and reads the registry once.
    pub async fn open(db: &Database, period: Duration, tls: ClusterTls) -> Result<Arc<Watcher>, StoreError> {
        let store = AnyStore::open(db).await?;
        let watcher = Watcher { nodes: Nodes::new(vec![]).with_tls(tls), tokens: TokenStore::from_store(store), period };
        registry::sync_once(&watcher.nodes, watcher.tokens.store()).await?;
        Ok(Arc::new(watcher))
    }

    /// Follows the registry and probes every node each period, forever.
    pub fn spawn(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(registry::REGISTRY_PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = registry::sync_once(&me.nodes, me.tokens.store()).await {
                    tracing::warn!(error = %e, "reading the node registry failed");
                }
            }
        });
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(me.period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.nodes.poll_remotes().await;
            }
        });
    }

    /// What the watcher saw, with counts per backend over reachable nodes.
    pub fn view(&self) -> api::WatcherView {
        let mut backends: BTreeMap<String, api::BackendCounts> = BTreeMap::new();
        let nodes: Vec<api::WatchedNode> = self
            .nodes
            .remotes()
            .iter()
            .map(|r| {
                let last = r.last_view();
                let reachable = r.reachable();
                if let (true, Some((_, s))) = (reachable, &last) {
                    for b in &s.backends {
                        let c = backends.entry(b.clone()).or_default();
                        c.nodes += 1;
                        c.sandboxes += s.sandboxes_by_backend.get(b).copied().unwrap_or(0);
                    }
                }
                api::WatchedNode {
                    name: r.name.clone(),
                    reachable,
                    last_ok_ago_ms: last.as_ref().map(|(age, _)| age.as_millis() as u64),
                    status: last.map(|(_, s)| s),
                }
            })
            .collect();
        api::WatcherView { period_ms: self.period.as_millis() as u64, nodes, backends }
    }

    /// Whether `headers` carry an admin token of the shared store.
    async fn admits(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let bearer = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|h| h.strip_prefix("Bearer "));
        let Some(token) = bearer.map(str::trim) else {
            return Err(ApiError::new(ErrorCode::Unauthorized, "missing 'Authorization: Bearer TOKEN' header"));
        };
        match self.tokens.store().grant(&hash(token), now_ms()).await? {
            Some(g) if g.principal.admin => Ok(()),
            Some(_) => Err(ApiError::new(ErrorCode::Forbidden, "the watcher's view is for apiservers (an admin token)")),
            None => Err(ApiError::new(ErrorCode::Unauthorized, "unknown, revoked or expired token")),
        }
    }

    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/v1/watcher/view", get(serve_view))
            .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such route") })
            .with_state(self)
    }
}

async fn serve_view(State(w): State<Arc<Watcher>>, headers: HeaderMap) -> Result<Json<api::WatcherView>, ApiError> {
    w.admits(&headers).await?;
    Ok(Json(w.view()))
}
