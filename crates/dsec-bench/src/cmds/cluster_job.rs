//! The paper's largest job (32,000 sandboxes) against simulated edges
//! (`fake_edges`: admission answered at once, over loopback HTTP), through
//! the apiserver's own creation path (`Nodes::create`: the shared view,
//! power of k with this replica's in-flight placements overlaid, the
//! node's answer, a refusal sent on), with one replica and with two
//! placing at once without coordination. Each replica probes the nodes
//! itself every `POLL_INTERVAL`, as without a watcher.
//!
//! Reported: time until every creation is acknowledged, creation p50/p99,
//! and the spread (most loaded node over the mean; the target is 1.1).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use dsec_api as api;
use dsec_apiserver::cluster_tls::ClusterTls;
use dsec_apiserver::nodes::{Nodes, PlacementConfig};
use dsec_apiserver::remote::{RemoteNode, POLL_INTERVAL};
use dsec_edge::Caller;
use serde_json::json;

use super::fake_edges::FakeEdges;
use crate::stats::{f, pct, print_table};

#[derive(Args, Debug)]
pub struct ClusterJobArgs {
    #[arg(long, default_value_t = 160)]
    pub nodes: usize,
    #[arg(long, default_value_t = 32_000)]
    pub sandboxes: usize,
    /// Replica counts to run (each run on fresh nodes).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub replicas: Vec<usize>,
    /// Creations in flight at once, over all replicas.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 2)]
    pub k: usize,
    /// CPU cores per node (each sandbox asks for one).
    #[arg(long, default_value_t = 256.0)]
    pub node_cpu: f64,
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// An apiserver replica's node set over the simulated edges at `base`,
/// probed once so it starts with a view.
pub(crate) async fn replica(edges: &FakeEdges, base: &BTreeMap<String, String>, k: usize) -> anyhow::Result<Arc<Nodes>> {
    let nodes = Arc::new(Nodes::with_placement(vec![], PlacementConfig { k, ..PlacementConfig::default() }));
    for name in edges.nodes.keys() {
        let url = format!("{}/e/{name}", base[name]);
        nodes.put_remote(Arc::new(RemoteNode::new(name, &url, "bench", &ClusterTls::plain()).map_err(anyhow::Error::msg)?));
    }
    nodes.poll_remotes().await;
    Ok(nodes)
}

/// Probes every node each `POLL_INTERVAL` until the returned handle is aborted.
pub(crate) fn keep_probing(nodes: Arc<Nodes>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        loop {
            tick.tick().await;
            nodes.poll_remotes().await;
        }
    })
}

pub(crate) fn request() -> anyhow::Result<api::CreateSandboxRequest> {
    Ok(serde_json::from_value(json!({"image": "busybox", "cpu_cores_limit": 1.0, "memory_limit_mb": 64}))?)
}

pub async fn run(a: ClusterJobArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let mut results = Vec::new();
    for &replicas in &a.replicas {
        let edges = FakeEdges::new(a.nodes, a.node_cpu);
        let (_stop, rx) = tokio::sync::oneshot::channel();
        let url = edges.serve(rx).await?;
        let base: BTreeMap<String, String> = edges.nodes.keys().map(|n| (n.clone(), url.clone())).collect();
        let mut set = Vec::new();
        for _ in 0..replicas.max(1) {
            set.push(replica(&edges, &base, a.k).await?);
        }
        let probes: Vec<_> = set.iter().map(|n| keep_probing(n.clone())).collect();
        let req = Arc::new(request()?);
        let caller = Caller::tenant("bench");
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let started = Instant::now();
        let workers: Vec<_> = (0..a.concurrency)
            .map(|w| {
                let (nodes, req, caller, next) = (set[w % set.len()].clone(), req.clone(), caller.clone(), next.clone());
                let total = a.sandboxes;
                tokio::spawn(async move {
                    let mut us = Vec::new();
                    let mut failed = 0u64;
                    while next.fetch_add(1, Ordering::Relaxed) < total {
                        let t = Instant::now();
                        match nodes.create(&caller, (*req).clone(), None, None).await {
                            Ok(_) => us.push(t.elapsed().as_secs_f64() * 1e6),
                            Err(_) => failed += 1,
                        }
                    }
                    (us, failed)
                })
            })
            .collect();
        let mut us = Vec::with_capacity(a.sandboxes);
        let mut failed = 0;
        for w in workers {
            let (u, fl) = w.await?;
            us.extend(u);
            failed += fl;
        }
        let elapsed = started.elapsed().as_secs_f64();
        for p in probes {
            p.abort();
        }
        us.sort_by(|x, y| x.total_cmp(y));
        let counts: Vec<u64> = edges.nodes.values().map(|n| n.admitted.load(Ordering::Relaxed)).collect();
        let acked: u64 = counts.iter().sum();
        let mean = acked as f64 / counts.len() as f64;
        let spread = counts.iter().copied().max().unwrap_or(0) as f64 / mean.max(1e-9);
        let refusals: u64 = set.iter().map(|n| n.placement_metrics().1).sum();
        anyhow::ensure!(acked as usize == us.len(), "{acked} admitted, {} acknowledged", us.len());
        let (p50, p99) = (pct(&us, 50.0), pct(&us, 99.0));
        rows.push(vec![
            replicas.to_string(),
            us.len().to_string(),
            failed.to_string(),
            f(elapsed, 2),
            f(us.len() as f64 / elapsed, 0),
            f(p50, 0),
            f(p99, 0),
            f(spread, 3),
            refusals.to_string(),
        ]);
        results.push(json!({
            "replicas": replicas, "nodes": a.nodes, "k": a.k, "acknowledged": us.len(), "failed": failed,
            "seconds": elapsed, "creations_per_s": us.len() as f64 / elapsed, "p50_us": p50, "p99_us": p99,
            "spread": spread, "refusals": refusals, "per_node": counts,
        }));
    }
    print_table(
        &format!("{} sandboxes over {} simulated nodes, k={}, {} in flight", a.sandboxes, a.nodes, a.k, a.concurrency),
        &["replicas", "acknowledged", "failed", "seconds", "creations/s", "p50 us", "p99 us", "spread max/mean", "refusals"],
        &rows,
    );
    if let Some(out) = a.out {
        std::fs::write(out, serde_json::to_vec_pretty(&json!({"results": results}))?)?;
    }
    Ok(())
}
