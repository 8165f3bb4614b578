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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::seq::IndexedRandom;

/// What the watcher last saw of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub name: String,
    /// Whether the node may take new sandboxes: answering, and neither
    /// draining nor left.
    pub healthy: bool,
    pub backends: Vec<String>,
    /// Hardware and operator labels (`kvm=true`).
    pub labels: BTreeMap<String, String>,
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
    /// Labels the node must carry, each with this value.
    pub selector: BTreeMap<String, String>,
}

impl Demand {
    /// Whether `node` could run this at all, whatever its load.
    pub fn eligible(&self, node: &NodeView) -> bool {
        node.healthy && node.backends.contains(&self.backend) && self.selector.iter().all(|(k, v)| node.labels.get(k) == Some(v))
    }
}

/// A placement is counted at most this long, whatever the view says (a
/// node whose probes stopped answering must not keep its count forever).
const RECENT_WINDOW: Duration = Duration::from_secs(5);

/// One placement not yet in the view: chosen at `at`; `settled` once the
/// node admitted it (from then on, the node's next probe shows it).
#[derive(Debug, Clone, Copy)]
struct Entry {
    at: Instant,
    cpu: f64,
    memory_mb: u64,
    settled: Option<Instant>,
}

/// One node's placements that its view does not show yet, oldest first,
/// with their running sums (so a decision costs O(nodes), not O(recent
/// placements)). Settled entries are always a prefix: `settle` marks the
/// oldest unsettled one, `pop_latest` removes the newest.
#[derive(Debug, Default)]
struct Pending {
    entries: VecDeque<Entry>,
    cpu: f64,
    memory_mb: u64,
}

impl Pending {
    fn push(&mut self, at: Instant, d: &Demand) {
        self.entries.push_back(Entry { at, cpu: d.cpu, memory_mb: d.memory_mb, settled: None });
        self.cpu += d.cpu;
        self.memory_mb += d.memory_mb;
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&e) = self.entries.front() {
            if now.duration_since(e.at) < RECENT_WINDOW {
                break;
            }
            self.entries.pop_front();
            self.subtract(e.cpu, e.memory_mb);
        }
    }

    fn pop_latest(&mut self) {
        if let Some(e) = self.entries.pop_back() {
            self.subtract(e.cpu, e.memory_mb);
        }
    }

    fn settle(&mut self, now: Instant) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.settled.is_none()) {
            e.settled = Some(now);
        }
    }

    /// Drops what a view taken at `at` shows: placements the node had
    /// admitted by then.
    fn observed(&mut self, at: Instant) {
        while let Some(&e) = self.entries.front() {
            if e.settled.is_none_or(|s| s > at) {
                break;
            }
            self.entries.pop_front();
            self.subtract(e.cpu, e.memory_mb);
        }
    }

    fn subtract(&mut self, cpu: f64, mem: u64) {
        if self.entries.is_empty() {
            // Exact zero, whatever the float sums drifted to.
            (self.cpu, self.memory_mb) = (0.0, 0);
        } else {
            self.cpu -= cpu;
            self.memory_mb = self.memory_mb.saturating_sub(mem);
        }
    }
}

#[derive(Debug)]
pub struct Placement {
    k: usize,
    recent: Mutex<HashMap<String, Pending>>,
}

impl Placement {
    /// Samples `k` eligible nodes per decision (at least 1).
    pub fn new(k: usize) -> Self {
        Self { k: k.max(1), recent: Mutex::new(HashMap::new()) }
    }

    /// Picks a node for `demand`, never one in `exclude` (nodes that already
    /// refused this request). `None` if no node fits.
    pub fn choose(&self, nodes: &[NodeView], demand: &Demand, exclude: &[String]) -> Option<String> {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        recent.retain(|_, p| {
            p.expire(now);
            !p.entries.is_empty()
        });
        let adjusted: Vec<(f64, &NodeView)> = nodes
            .iter()
            .filter(|n| demand.eligible(n) && !exclude.contains(&n.name))
            .filter_map(|n| {
                let (cpu, mem, slots) = match recent.get(&n.name) {
                    Some(p) => (
                        n.free_cpu - p.cpu,
                        n.free_memory_mb.saturating_sub(p.memory_mb),
                        n.free_slots.saturating_sub(p.entries.len() as u64),
                    ),
                    None => (n.free_cpu, n.free_memory_mb, n.free_slots),
                };
                let fits = cpu >= demand.cpu && mem >= demand.memory_mb && slots > 0;
                // Load = share of CPU capacity in use after this placement.
                let load = 1.0 - (cpu - demand.cpu) / n.cpu_capacity.max(1e-9);
                fits.then_some((load, n))
            })
            .collect();
        let sample: Vec<&(f64, &NodeView)> = adjusted.choose_multiple(&mut rand::rng(), self.k).collect();
        let best = sample.into_iter().min_by(|a, b| a.0.total_cmp(&b.0))?.1;
        recent.entry(best.name.clone()).or_default().push(now, demand);
        Some(best.name.clone())
    }

    /// Forgets a placement that the node refused or that failed.
    pub fn forget(&self, node: &str) {
        if let Some(p) = self.recent.lock().unwrap_or_else(|p| p.into_inner()).get_mut(node) {
            p.pop_latest();
        }
    }

    /// The node admitted a placement: it stays counted until a view of the
    /// node taken after now ([`Placement::observed`]) shows it, and no
    /// longer (else it would count twice, once in the view and once here,
    /// and a node would look full at half its capacity).
    pub fn settle(&self, node: &str) {
        if let Some(p) = self.recent.lock().unwrap_or_else(|p| p.into_inner()).get_mut(node) {
            p.settle(Instant::now());
        }
    }

    /// The view of `node` now reflects what it had admitted at `at`.
    pub fn observed(&self, node: &str, at: Instant) {
        if let Some(p) = self.recent.lock().unwrap_or_else(|p| p.into_inner()).get_mut(node) {
            p.observed(at);
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
            labels: BTreeMap::new(),
        }
    }

    fn demand() -> Demand {
        Demand { backend: "container".into(), cpu: 1.0, memory_mb: 512, selector: BTreeMap::new() }
    }

    #[test]
    fn a_selector_keeps_to_nodes_with_every_label() {
        let p = Placement::new(8);
        let mut kvm = node("kvm", 2.0);
        kvm.labels.insert("kvm".into(), "true".into());
        let mut both = node("both", 4.0);
        both.labels = BTreeMap::from([("kvm".into(), "true".into()), ("zone".into(), "a".into())]);
        let mut no_kvm = node("no-kvm", 30.0);
        no_kvm.labels.insert("kvm".into(), "false".into());
        let nodes = vec![kvm, both, no_kvm, node("plain", 30.0)];
        let want =
            |pairs: &[(&str, &str)]| Demand { selector: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..demand() };
        assert_eq!(p.choose(&nodes, &want(&[("kvm", "true")]), &[]).as_deref(), Some("both"), "the least loaded of the kvm nodes");
        assert_eq!(p.choose(&nodes, &want(&[("kvm", "true"), ("zone", "a")]), &[]).as_deref(), Some("both"));
        assert_eq!(p.choose(&nodes, &want(&[("zone", "b")]), &[]), None);
        assert_eq!(p.choose(&nodes, &demand(), &[]).as_deref().map(|n| n == "plain" || n == "no-kvm"), Some(true));
    }

    #[test]
    fn a_microvm_goes_only_to_a_node_that_runs_microvms() {
        let p = Placement::new(2);
        let mut vm_node = node("vm-node", 1.5);
        vm_node.backends = vec!["container".into(), "microvm".into()];
        let nodes = vec![node("a", 30.0), node("b", 30.0), vm_node];
        let microvm = Demand { backend: "microvm".into(), ..demand() };
        for _ in 0..20 {
            assert_eq!(p.choose(&nodes, &microvm, &[]).as_deref(), Some("vm-node"));
            p.forget("vm-node");
        }
    }

    #[test]
    fn k_of_one_is_random_and_larger_k_prefers_the_emptier_nodes() {
        // 10 nodes, one nearly empty and nine loaded: with k = 1 the empty
        // node gets about a tenth of the placements, with k = 5 half, with
        // k = 10 all.
        let mut nodes: Vec<NodeView> = (0..9).map(|i| node(&format!("busy{i}"), 4.0)).collect();
        nodes.push(node("empty", 31.0));
        let count = |k: usize| {
            let p = Placement::new(k);
            (0..200)
                .filter(|_| {
                    let got = p.choose(&nodes, &demand(), &[]).unwrap();
                    p.forget(&got);
                    got == "empty"
                })
                .count()
        };
        assert_eq!(count(10), 200);
        let random = count(1);
        // Expected 20 (k = 1) and 100 (k = 5), several standard deviations
        // from the bounds.
        assert!(random < 60, "k = 1 sampled the empty node {random} times of 200");
        let five = count(5);
        assert!(five > 60, "k = 5 chose the empty node only {five} times of 200");
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
    fn an_admitted_placement_stops_counting_once_a_later_view_shows_it() {
        let p = Placement::new(1);
        let full = vec![node("a", 8.0)];
        for _ in 0..8 {
            assert_eq!(p.choose(&full, &demand(), &[]).as_deref(), Some("a"));
        }
        assert_eq!(p.choose(&full, &demand(), &[]), None, "8 in flight fill the node");
        // Four are admitted; a view taken before that does not show them.
        for _ in 0..4 {
            p.settle("a");
        }
        let before = Instant::now() - Duration::from_millis(10);
        p.observed("a", before);
        assert_eq!(p.choose(&full, &demand(), &[]), None, "a view older than the admissions changes nothing");
        // A view taken after them shows them in its own counts (4 of 8 CPUs
        // free): they no longer count twice, the 4 unsettled still do.
        p.observed("a", Instant::now());
        let seen = vec![node("a", 4.0)];
        assert_eq!(p.choose(&seen, &demand(), &[]), None, "4 admitted (in the view) + 4 in flight = full");
        // One more admitted and seen (5 in the view, 3 in flight): full.
        p.settle("a");
        p.observed("a", Instant::now());
        let seen = vec![node("a", 3.0)];
        assert_eq!(p.choose(&seen, &demand(), &[]), None);
        // One in flight refused: room for one.
        p.forget("a");
        assert_eq!(p.choose(&seen, &demand(), &[]).as_deref(), Some("a"));
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
