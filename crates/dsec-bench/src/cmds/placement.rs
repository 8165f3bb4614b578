//! Placement decisions per second and their latency over N simulated
//! nodes with a spread of load, for several k, three ways:
//! `Placement::choose` alone; the apiserver's path as it is
//! (`Nodes::decide`: the shared view snapshot, this replica's in-flight
//! placements overlaid, the choice); and, as the peer, the same path with
//! the view rebuilt from every node's status per decision (what each
//! creation did before the snapshot). The node's answer (an HTTP round
//! trip) is not part of it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use dsec_api as api;
use dsec_apiserver::cluster_tls::ClusterTls;
use dsec_apiserver::nodes::{Nodes, PlacementConfig};
use dsec_apiserver::remote::{RemoteNode, POLL_INTERVAL};
use dsec_placement::{Demand, NodeView, Placement};
use serde_json::json;

use super::fake_edges::node_status;
use crate::stats::{f, pct, print_table};

#[derive(Args, Debug)]
pub struct PlacementArgs {
    #[arg(long, value_delimiter = ',', default_value = "40,160,640")]
    pub nodes: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub k: Vec<usize>,
    /// Decisions per (nodes, k, path) row.
    #[arg(long, default_value_t = 100_000)]
    pub decisions: usize,
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Node i: i mod 10 tenths of its CPU in use.
fn status(i: usize) -> api::NodeStatus {
    let labels = BTreeMap::from([("kvm".to_string(), "true".to_string()), ("zone".to_string(), format!("z{}", i % 4))]);
    node_status(&format!("node-{i:04}"), 256.0, 256.0 * (i % 10) as f64 / 10.0, 0, &["container", "microvm"], labels)
}

fn views(n: usize) -> Vec<NodeView> {
    (0..n)
        .map(|i| {
            let s = status(i);
            NodeView {
                free_cpu: s.cpu_capacity - s.cpu_reserved,
                free_memory_mb: s.memory_capacity_mb - s.memory_reserved_mb,
                free_slots: s.slots_capacity - s.slots_used,
                cpu_capacity: s.cpu_capacity,
                name: s.name,
                healthy: true,
                backends: s.backends,
                labels: s.labels,
            }
        })
        .collect()
}

/// An apiserver's node set over `n` remote nodes that are never called:
/// each has a probe answer recorded, as the watcher's view leaves them.
fn apiserver_nodes(n: usize, k: usize) -> anyhow::Result<(Nodes, Vec<Arc<RemoteNode>>)> {
    let nodes = Nodes::with_placement(vec![], PlacementConfig { k, ..PlacementConfig::default() });
    let mut remotes = Vec::with_capacity(n);
    for i in 0..n {
        let r = Arc::new(
            RemoteNode::new(&format!("node-{i:04}"), "http://127.0.0.1:9", "bench", &ClusterTls::plain()).map_err(anyhow::Error::msg)?,
        );
        r.record(status(i), Duration::ZERO);
        nodes.put_remote(r.clone());
        remotes.push(r);
    }
    nodes.refresh_view();
    Ok((nodes, remotes))
}

/// A probe round's answers, as the watcher brings them every period: a
/// row longer than the view's TTL (the slow peer path over 640 nodes)
/// would otherwise see every node go unreachable.
fn answer_probes(remotes: &[Arc<RemoteNode>]) {
    for (i, r) in remotes.iter().enumerate() {
        r.record(status(i), Duration::ZERO);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Path {
    ChooseOnly,
    Apiserver,
    RebuildPerDecision,
}

impl Path {
    fn label(self) -> &'static str {
        match self {
            Path::ChooseOnly => "choose only",
            Path::Apiserver => "apiserver (shared view)",
            Path::RebuildPerDecision => "peer: view rebuilt per creation",
        }
    }
}

pub async fn run(a: PlacementArgs) -> anyhow::Result<()> {
    let demand = Demand { backend: "container".into(), cpu: 0.001, memory_mb: 1, selector: BTreeMap::new() };
    let mut rows = Vec::new();
    let mut results = Vec::new();
    for &n in &a.nodes {
        let bare = views(n);
        for &k in &a.k {
            for path in [Path::ChooseOnly, Path::Apiserver, Path::RebuildPerDecision] {
                let p = Placement::new(k);
                let (nodes, remotes) = apiserver_nodes(n, k)?;
                let mut us = Vec::with_capacity(a.decisions);
                let started = Instant::now();
                let mut probed = Instant::now();
                for _ in 0..a.decisions {
                    if probed.elapsed() >= POLL_INTERVAL {
                        answer_probes(&remotes);
                        probed = Instant::now();
                    }
                    let t = Instant::now();
                    let got = match path {
                        Path::ChooseOnly => p.choose(&bare, &demand, &[]),
                        Path::Apiserver => nodes.decide(&demand, &[]).1,
                        Path::RebuildPerDecision => {
                            nodes.refresh_view();
                            nodes.decide(&demand, &[]).1
                        }
                    };
                    us.push(t.elapsed().as_secs_f64() * 1e6);
                    anyhow::ensure!(got.is_some(), "no node chosen");
                }
                let rate = a.decisions as f64 / started.elapsed().as_secs_f64();
                us.sort_by(|x, y| x.total_cmp(y));
                let (p50, p99) = (pct(&us, 50.0), pct(&us, 99.0));
                rows.push(vec![n.to_string(), k.to_string(), path.label().to_string(), f(rate, 0), f(p50, 1), f(p99, 1)]);
                results.push(json!({"nodes": n, "k": k, "path": path.label(), "decisions_per_s": rate, "p50_us": p50, "p99_us": p99}));
            }
        }
    }
    print_table("placement decisions (one thread)", &["nodes", "k", "path", "decisions/s", "p50 us", "p99 us"], &rows);
    if let Some(out) = a.out {
        std::fs::write(out, serde_json::to_vec_pretty(&json!({"decisions": a.decisions, "results": results}))?)?;
    }
    Ok(())
}
