//! Placement and the watcher's node view.
//!
//! Placement follows the paper: filter healthy nodes that can run the
//! backend and fit the request, sample k of them, take the least loaded.
//! Each placement instance overlays its own recent decisions on the
//! watcher's periodic view (so a burst does not pile onto the node that
//! looked emptiest at the last poll), with no coordination between
//! instances; the node has the final say and may refuse, and the caller then
//! tries elsewhere.
//!
//! API boundary: [`NodeView`] in, node name out. No I/O here: the watcher's
//! polling lives with whoever owns the connections to the nodes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::seq::IndexedRandom;

/// What the watcher last saw of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub healthy: bool,
    pub backends: Vec<String>,
    pub free_cpu: f64,
    pub free_memory_mb: u64,
    pub free_slots: u64,
    pub cpu_capacity: f64,
}

/// What one sandbox needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    pub backend: String,
    pub cpu: f64,
    pub memory_mb: u64,
}

/// Recent placements are assumed still "in flight" (not yet visible in the
/// watcher's view) for this long.
const RECENT_WINDOW: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct Placement {
    k: usize,
    recent: Mutex<HashMap<String, Vec<(Instant, Demand)>>>,
}

impl Placement {
    pub fn new(k: usize) -> Self {
        Self { k: k.max(1), recent: Mutex::new(HashMap::new()) }
    }

    /// Picks a node for `demand`, never one in `exclude` (nodes that already
    /// refused this request). `None` if no node fits.
    pub fn choose(&self, nodes: &[NodeView], demand: &Demand, exclude: &[String]) -> Option<String> {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        recent.values_mut().for_each(|v| v.retain(|(t, _)| now.duration_since(*t) < RECENT_WINDOW));
        let adjusted: Vec<(f64, &NodeView)> = nodes
            .iter()
            .filter(|n| n.healthy && n.backends.contains(&demand.backend) && !exclude.contains(&n.name))
            .filter_map(|n| {
                let pending = recent.get(&n.name).map(|v| v.as_slice()).unwrap_or(&[]);
                let cpu = n.free_cpu - pending.iter().map(|(_, d)| d.cpu).sum::<f64>();
                let mem = n.free_memory_mb.saturating_sub(pending.iter().map(|(_, d)| d.memory_mb).sum());
                let slots = n.free_slots.saturating_sub(pending.len() as u64);
                let fits = cpu >= demand.cpu && mem >= demand.memory_mb && slots > 0;
                // Load = share of CPU capacity in use after this placement.
                let load = 1.0 - (cpu - demand.cpu) / n.cpu_capacity.max(1e-9);
                fits.then_some((load, n))
            })
            .collect();
        let sample: Vec<&(f64, &NodeView)> = adjusted.choose_multiple(&mut rand::rng(), self.k).collect();
        let best = sample.into_iter().min_by(|a, b| a.0.total_cmp(&b.0))?.1;
        recent.entry(best.name.clone()).or_default().push((now, demand.clone()));
        Some(best.name.clone())
    }

    /// Forgets a placement that the node refused or that failed.
    pub fn forget(&self, node: &str) {
        if let Some(v) = self.recent.lock().unwrap_or_else(|p| p.into_inner()).get_mut(node) {
            v.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, free_cpu: f64) -> NodeView {
        NodeView {
            name: name.into(),
            healthy: true,
            backends: vec!["container".into()],
            free_cpu,
            free_memory_mb: 10_000,
            free_slots: 100,
            cpu_capacity: 32.0,
        }
    }

    fn demand() -> Demand {
        Demand { backend: "container".into(), cpu: 1.0, memory_mb: 512 }
    }

    #[test]
    fn with_k_equal_to_n_the_least_loaded_wins() {
        let p = Placement::new(3);
        let nodes = vec![node("a", 4.0), node("b", 30.0), node("c", 10.0)];
        assert_eq!(p.choose(&nodes, &demand(), &[]).as_deref(), Some("b"));
    }

    #[test]
    fn recent_placements_spread_a_burst() {
        let p = Placement::new(2);
        let nodes = vec![node("a", 8.0), node("b", 8.0)];
        let mut counts = HashMap::new();
        for _ in 0..16 {
            *counts.entry(p.choose(&nodes, &demand(), &[]).unwrap()).or_insert(0) += 1;
        }
        assert_eq!(counts["a"], 8);
        assert_eq!(counts["b"], 8);
        assert_eq!(p.choose(&nodes, &demand(), &[]), None, "both nodes are full after 16 placements");
    }

    #[test]
    fn unhealthy_excluded_and_wrong_backend_nodes_are_skipped() {
        let p = Placement::new(5);
        let mut sick = node("sick", 30.0);
        sick.healthy = false;
        let mut vm = node("vm", 30.0);
        vm.backends = vec!["vm".into()];
        let nodes = vec![sick, vm, node("refused", 30.0), node("ok", 2.0)];
        assert_eq!(p.choose(&nodes, &demand(), &["refused".into()]).as_deref(), Some("ok"));
        assert_eq!(p.choose(&nodes, &Demand { cpu: 64.0, ..demand() }, &[]), None);
    }
}
