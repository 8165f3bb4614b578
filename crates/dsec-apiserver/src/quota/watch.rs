//! Keeps the ledger true to the nodes: a local edge's state events give
//! back what an ended sandbox held at once (a TTL, a crash, a delete from
//! anywhere); a full listing of every node reconciles it at start, when
//! events were lost, and periodically when remote nodes exist (their ends
//! reach this apiserver only through listings).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dsec_api::SandboxState;
use dsec_edge::model::Caller;
use dsec_edge::ListFilter;
use tokio::sync::broadcast::error::RecvError;

use super::{Held, Ledger};
use crate::nodes::Nodes;

/// How often a cluster's listings reconcile the ledger.
const RECONCILE_INTERVAL: Duration = Duration::from_secs(10);

/// Lists every live sandbox of every node that answers into the ledger
/// (a node that does not answer keeps what the ledger holds for it).
pub async fn reconcile(nodes: &Nodes, ledger: &Ledger) {
    let listed_at = Instant::now();
    let admin = Caller::admin();
    let mut answered: HashSet<String> = HashSet::new();
    let mut all: Vec<dsec_api::Sandbox> = Vec::new();
    for e in nodes.local_edges() {
        answered.insert(e.node().to_string());
        all.extend(e.list(&admin, &ListFilter::default()).into_iter().map(crate::convert::sandbox_out));
    }
    for r in nodes.remotes() {
        match r.list(&admin, "").await {
            Ok(list) => {
                answered.insert(r.name.clone());
                all.extend(list);
            }
            Err(e) => tracing::debug!(node = %r.name, error = %e.message, "quota reconcile: node did not answer"),
        }
    }
    let live: Vec<(String, String, Held)> = all
        .into_iter()
        .filter(|s| !s.state.is_terminal() && s.state != SandboxState::Unknown)
        // A build's step sandboxes are held by the build (quota::build).
        .filter(|s| !s.labels.contains_key(dsec_build::BUILD_LABEL))
        .map(|s| {
            let held = Held::sandbox(s.limits.cpu_cores_limit, s.limits.memory_limit_mb, s.limits.disk_limit_mb);
            (s.id, s.project, held)
        })
        .collect();
    ledger.reconcile(&live, &answered, listed_at);
}

/// Starts the watch: one task per local edge, one for the listings.
pub fn watch_nodes(nodes: Arc<Nodes>, ledger: Arc<Ledger>) {
    for edge in nodes.local_edges() {
        let mut events = edge.subscribe();
        let (nodes, ledger) = (nodes.clone(), ledger.clone());
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(e) if e.state.is_terminal() => ledger.ended(&e.id, Instant::now()),
                    Ok(_) => {}
                    Err(RecvError::Lagged(n)) => {
                        tracing::debug!(lost = n, "quota watch fell behind the edge's events; reconciling");
                        reconcile(&nodes, &ledger).await;
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
    }
    // Remote nodes now, or joining later through the registry.
    let has_remotes = !nodes.remotes().is_empty() || nodes.follows_registry();
    tokio::spawn(async move {
        reconcile(&nodes, &ledger).await;
        if !has_remotes {
            return;
        }
        let mut tick = tokio::time::interval(RECONCILE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            reconcile(&nodes, &ledger).await;
        }
    });
}
