//! Failure detection: from an edge's death to its sandboxes showing
//! `unknown` in a list, and to placement avoiding it, through one
//! apiserver replica's own probing (every `POLL_INTERVAL`) of simulated
//! edges (`fake_edges`). Two deaths: a crash (the edge's listener and
//! connections closed, so connections are refused) and a partition (the
//! edge answers nothing, so only timeouts tell).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::Args;
use dsec_api as api;
use dsec_edge::{Caller, ListFilter};
use dsec_placement::Demand;
use serde_json::json;

use super::cluster_job::{keep_probing, replica, request};
use super::fake_edges::FakeEdges;
use crate::stats::{f, pct, print_table};

#[derive(Args, Debug)]
pub struct ClusterFailureArgs {
    #[arg(long, default_value_t = 160)]
    pub nodes: usize,
    /// Sandboxes created before the death.
    #[arg(long, default_value_t = 1600)]
    pub sandboxes: usize,
    /// Deaths measured per kind.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug)]
enum Death {
    Crash,
    Partition,
}

/// One death: (seconds to `unknown` in a list, seconds to placement
/// avoiding the node).
async fn one(a: &ClusterFailureArgs, death: Death) -> anyhow::Result<(f64, f64)> {
    let edges = FakeEdges::new(a.nodes, 1024.0);
    let (_stop_all, rx) = tokio::sync::oneshot::channel();
    let shared = edges.serve(rx).await?;
    let (stop_victim, rx) = tokio::sync::oneshot::channel();
    let own = edges.serve(rx).await?;
    let victim = edges.nodes.keys().next().cloned().unwrap_or_default();
    let base: BTreeMap<String, String> =
        edges.nodes.keys().map(|n| (n.clone(), if *n == victim { own.clone() } else { shared.clone() })).collect();
    let nodes = replica(&edges, &base, 2).await?;
    let probing = keep_probing(nodes.clone());
    let caller = Caller::tenant("bench");
    let req = request()?;
    for _ in 0..a.sandboxes {
        nodes.create(&caller, req.clone(), None, None).await.map_err(|e| anyhow::anyhow!("{}", e.message))?;
    }
    let on_victim = edges.nodes[&victim].admitted.load(Ordering::Relaxed) as usize;
    anyhow::ensure!(on_victim > 0, "no sandbox landed on {victim}");
    // A list the apiserver remembers, as a client's earlier list would be.
    nodes.list(&caller, &ListFilter::default(), "").await;

    let t0 = Instant::now();
    match death {
        Death::Crash => {
            let _ = stop_victim.send(());
        }
        Death::Partition => edges.nodes[&victim].silent.store(true, Ordering::Relaxed),
    }
    let demand = Demand { backend: "container".into(), cpu: 1.0, memory_mb: 64, selector: BTreeMap::new() };
    let avoid = {
        let nodes = nodes.clone();
        let victim = victim.clone();
        tokio::spawn(async move {
            loop {
                let view = nodes.view();
                if view.nodes.iter().any(|v| v.name == victim && !v.healthy) {
                    return t0.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let unknown = loop {
        let (list, _) = nodes.list(&caller, &ListFilter::default(), "").await;
        let gone = list.iter().filter(|s| s.node == victim && s.state == api::SandboxState::Unknown).count();
        if gone == on_victim {
            break t0.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let avoid = avoid.await?;
    // Once avoided, no decision picks it.
    for _ in 0..1000 {
        let (_, choice) = nodes.decide(&demand, &[]);
        anyhow::ensure!(choice.as_deref() != Some(victim.as_str()), "placed on {victim} after it was marked away");
    }
    probing.abort();
    Ok((unknown.as_secs_f64(), avoid.as_secs_f64()))
}

pub async fn run(a: ClusterFailureArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let mut results = Vec::new();
    for death in [Death::Crash, Death::Partition] {
        let (mut unknown, mut avoid) = (Vec::new(), Vec::new());
        for _ in 0..a.rounds {
            let (u, v) = one(&a, death).await?;
            unknown.push(u * 1e3);
            avoid.push(v * 1e3);
        }
        unknown.sort_by(|x, y| x.total_cmp(y));
        avoid.sort_by(|x, y| x.total_cmp(y));
        let max = |v: &[f64]| v.last().copied().unwrap_or(0.0);
        rows.push(vec![
            format!("{death:?}").to_lowercase(),
            f(pct(&unknown, 50.0), 0),
            f(max(&unknown), 0),
            f(pct(&avoid, 50.0), 0),
            f(max(&avoid), 0),
        ]);
        results.push(json!({"death": format!("{death:?}").to_lowercase(), "unknown_ms": unknown, "avoided_ms": avoid}));
    }
    print_table(
        &format!("an edge's death among {} simulated nodes ({} rounds each)", a.nodes, a.rounds),
        &["death", "to unknown p50 ms", "max ms", "to avoided p50 ms", "max ms"],
        &rows,
    );
    if let Some(out) = a.out {
        std::fs::write(out, serde_json::to_vec_pretty(&json!({"results": results}))?)?;
    }
    Ok(())
}
