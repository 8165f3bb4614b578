//! The node registry as an apiserver (or the watcher) follows it: which
//! edges joined, where they are, whether they are draining; and where it
//! learns their load (the watcher's view, or its own probes).
//!
//! Nothing here is durable: the registry lives in the shared store, the
//! load in the edges. A restarted apiserver or watcher rebuilds all of it
//! within one period.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};
use dsec_api as api;
use dsec_store::{AnyStore, ClusterStore, CreationKeys, Member, NodeState, StoreError};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::auth::Authenticator;
use crate::cluster_tls::{ClusterTls, PeerConnector};
use crate::nodes::Nodes;
use crate::remote::{Membership, RemoteNode, POLL_INTERVAL};

/// How often the registry is read again (joins, drains and departures made
/// through another replica show up within this).
pub const REGISTRY_PERIOD: Duration = Duration::from_secs(1);
/// Registry rounds between two prunings of old creation keys (each
/// replica prunes; deleting what another already deleted is harmless).
const KEY_PRUNE_ROUNDS: u64 = 600;

/// What the remote side of a registry row looks like to `Nodes`.
fn membership(m: &Member) -> Membership {
    let capacity = m.membership.as_ref().map(|c| api::NodeCapacity {
        cpu_cores: c.cpu_millis as f64 / 1000.0,
        memory_mb: c.memory_mb,
        max_sandboxes: c.max_sandboxes,
    });
    Membership {
        labels: m.node.labels.clone(),
        backends: m.node.backends.clone(),
        capacity,
        draining: m.node.state == NodeState::Draining,
        joined: true,
    }
}

/// Brings `nodes`' joined remotes in line with the registry: new members
/// added, moved ones (new URL or secret) replaced, others updated in
/// place (labels, drain), departed ones removed. Nodes named by `--edge`
/// are left alone.
pub async fn sync_once(nodes: &Nodes, store: &AnyStore) -> Result<(), StoreError> {
    let members = store.members().await?;
    let mut present = HashSet::new();
    let mut joined_now = Vec::new();
    for m in &members {
        let Some(joined) = &m.membership else { continue };
        if m.node.state == NodeState::Down {
            continue;
        }
        present.insert(m.node.name.clone());
        let info = membership(m);
        match nodes.remote_named(&m.node.name) {
            Some(r) if r.reaches(&m.node.url, &joined.secret) => r.set_membership(info),
            Some(r) if !r.membership().joined => {
                tracing::warn!(node = %r.name, "a joined node has the name of an --edge node; keeping the --edge one")
            }
            _ => match RemoteNode::joined(&m.node.name, &m.node.url, &joined.secret, info, nodes.tls()) {
                Ok(r) => {
                    tracing::info!(node = %r.name, url = %r.url(), "node joined");
                    let r = Arc::new(r);
                    nodes.put_remote(r.clone());
                    joined_now.push(r);
                }
                Err(e) => tracing::warn!(node = %m.node.name, error = %e, "registry row skipped"),
            },
        }
    }
    for r in nodes.remotes() {
        if r.membership().joined && !present.contains(&r.name) {
            tracing::info!(node = %r.name, "node left");
            nodes.remove_remote(&r.name);
        }
    }
    // A node this replica has just learned of is probed at once rather
    // than at the next load round (or the watcher's next view of it):
    // until a probe answers it counts as unreachable, and a creation that
    // asks for its labels would be refused meanwhile. In the background:
    // when the node joined through this replica, it answers the probe only
    // once its join is answered.
    for r in joined_now {
        tokio::spawn(async move { r.poll().await });
    }
    // Labels and drains changed in place.
    nodes.refresh_view();
    Ok(())
}

/// Where an apiserver reads the nodes' load.
pub struct WatcherClient {
    url: String,
    bearer: String,
    http: Client<PeerConnector, Body>,
}

impl WatcherClient {
    /// `url` like `http://10.0.0.2:8090` (`https://` in a cluster with a
    /// CA); `token` an admin token of the shared store (the watcher checks
    /// it there).
    pub fn new(url: &str, token: &str, tls: &ClusterTls) -> Result<Self, String> {
        let url = url.trim_end_matches('/').to_string();
        tls.check_url("watcher", &url)?;
        let http = Client::builder(TokioExecutor::new()).build(tls.connector(Duration::from_secs(1)));
        Ok(WatcherClient { url, bearer: format!("Bearer {token}"), http })
    }

    pub async fn view(&self) -> Result<api::WatcherView, String> {
        let req = Request::get(format!("{}/v1/watcher/view", self.url))
            .header(header::AUTHORIZATION, &self.bearer)
            .body(Body::empty())
            .map_err(|e| e.to_string())?;
        let ask = async {
            let resp = self.http.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
            if !status.is_success() {
                return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes)));
            }
            serde_json::from_slice(&bytes).map_err(|e| e.to_string())
        };
        tokio::time::timeout(Duration::from_secs(2), ask).await.map_err(|_| "no answer within 2 s".to_string())?
    }
}

/// Records the watcher's view in `nodes`: each node it reached, with the
/// age of that answer; a node it cannot reach is down here too.
pub fn apply_view(nodes: &Nodes, view: api::WatcherView) {
    for w in view.nodes {
        let Some(r) = nodes.remote_named(&w.name) else { continue };
        match (w.reachable, w.status, w.last_ok_ago_ms) {
            (true, Some(status), Some(ago)) => r.record(status, Duration::from_millis(ago)),
            (false, _, _) => r.mark_down(),
            _ => {}
        }
    }
    nodes.refresh_view();
}

/// Keeps `nodes` current for as long as the process runs: the registry
/// every [`REGISTRY_PERIOD`] (when `auth` holds a store), the load every
/// [`POLL_INTERVAL`] from the watcher, or by probing each node itself when
/// there is no watcher or it does not answer.
pub fn follow(nodes: Arc<Nodes>, auth: Arc<Authenticator>, watcher: Option<WatcherClient>) {
    nodes.set_follows_registry();
    let registry_nodes = nodes.clone();
    tokio::spawn(async move {
        let Some(tokens) = auth.tokens() else { return };
        let mut tick = tokio::time::interval(REGISTRY_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut rounds: u64 = 0;
        loop {
            tick.tick().await;
            if let Err(e) = sync_once(&registry_nodes, tokens.store()).await {
                tracing::warn!(error = %e, "reading the node registry failed");
            }
            rounds += 1;
            if rounds % KEY_PRUNE_ROUNDS == 0 {
                let before = dsec_edge::model::now_ms().saturating_sub(dsec_store::CREATION_KEY_TTL_MS);
                if let Err(e) = tokens.store().forget_creations(before).await {
                    tracing::warn!(error = %e, "forgetting old creation keys failed");
                }
            }
        }
    });
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut warned = false;
        loop {
            tick.tick().await;
            let Some(w) = &watcher else {
                nodes.poll_remotes().await;
                continue;
            };
            match w.view().await {
                Ok(view) => {
                    warned = false;
                    apply_view(&nodes, view);
                }
                Err(e) => {
                    if !warned {
                        tracing::warn!(watcher = %w.url, error = %e, "the watcher does not answer; probing the nodes directly");
                        warned = true;
                    }
                    nodes.poll_remotes().await;
                }
            }
        }
    });
}
