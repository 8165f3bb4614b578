//! Placement decisions per second and their latency: `Placement::choose`
//! (what `Nodes::create` runs per creation) over N simulated nodes with
//! a spread of load, for several k; with and without a copy of the node
//! view per decision (the apiserver builds its view afresh per creation).
//! The node's answer (an HTTP round trip) is not part of it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use dsec_placement::{Demand, NodeView, Placement};
use serde_json::json;

use crate::stats::{f, pct, print_table};

#[derive(Args, Debug)]
pub struct PlacementArgs {
    #[arg(long, value_delimiter = ',', default_value = "40,160,640")]
    pub nodes: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub k: Vec<usize>,
    /// Decisions per (nodes, k) pair.
    #[arg(long, default_value_t = 100_000)]
    pub decisions: usize,
    #[arg(long)]
    pub out: Option<PathBuf>,
}

fn nodes(n: usize) -> Vec<NodeView> {
    // Deterministic spread of load: node i has i mod 10 tenths of its CPU in use.
    (0..n)
        .map(|i| NodeView {
            name: format!("node-{i:04}"),
            healthy: true,
            backends: vec!["container".into(), "microvm".into()],
            labels: BTreeMap::from([("kvm".to_string(), "true".to_string()), ("zone".to_string(), format!("z{}", i % 4))]),
            free_cpu: 256.0 * (1.0 - (i % 10) as f64 / 10.0),
            free_memory_mb: 2 << 20,
            free_slots: 1 << 20,
            cpu_capacity: 256.0,
        })
        .collect()
}

pub async fn run(a: PlacementArgs) -> anyhow::Result<()> {
    let demand = Demand { backend: "container".into(), cpu: 0.001, memory_mb: 1, selector: BTreeMap::new() };
    let mut rows = Vec::new();
    let mut results = Vec::new();
    for &n in &a.nodes {
        let views = nodes(n);
        for &k in &a.k {
            for copy in [true, false] {
                let p = Placement::new(k);
                let mut us = Vec::with_capacity(a.decisions);
                let started = Instant::now();
                for _ in 0..a.decisions {
                    let t = Instant::now();
                    let got = if copy { p.choose(&views.clone(), &demand, &[]) } else { p.choose(&views, &demand, &[]) };
                    us.push(t.elapsed().as_secs_f64() * 1e6);
                    anyhow::ensure!(got.is_some(), "no node chosen");
                }
                let rate = a.decisions as f64 / started.elapsed().as_secs_f64();
                us.sort_by(|x, y| x.total_cmp(y));
                let (p50, p99) = (pct(&us, 50.0), pct(&us, 99.0));
                let what = if copy { "with view copy" } else { "choose only" };
                rows.push(vec![n.to_string(), k.to_string(), what.to_string(), f(rate, 0), f(p50, 1), f(p99, 1)]);
                results.push(json!({"nodes": n, "k": k, "view_copy": copy, "decisions_per_s": rate, "p50_us": p50, "p99_us": p99}));
            }
        }
    }
    print_table("placement decisions (one thread)", &["nodes", "k", "what", "decisions/s", "p50 us", "p99 us"], &rows);
    if let Some(out) = a.out {
        std::fs::write(out, serde_json::to_vec_pretty(&json!({"decisions": a.decisions, "results": results}))?)?;
    }
    Ok(())
}
