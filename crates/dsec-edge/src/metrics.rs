//! What an edge counts for its metrics endpoint: monotonic counters of the
//! operations it carried out, histograms of creation latency (per backend)
//! and of buffered commands' latency, and, read at scrape time, the
//! sandboxes it holds by state and backend and the host's swap traffic.
//!
//! Counters are relaxed atomics bumped on the paths they count (one add,
//! no lock); nothing here is on a path that could fail because of it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use crate::edge::{Edge, NodeStats};
use crate::histogram::{Histogram, HistogramSnapshot, OPERATION_BOUNDS};
use crate::model::BackendKind;

/// Every backend, in the order of [`Counters`]' creation histograms.
const BACKENDS: [BackendKind; 4] = [BackendKind::Container, BackendKind::Microvm, BackendKind::Vm, BackendKind::Fncall];

pub(crate) struct Counters {
    creations: AtomicU64,
    creation_failures: AtomicU64,
    execs: AtomicU64,
    steps: AtomicU64,
    pauses: AtomicU64,
    resumes: AtomicU64,
    /// Creation latency, one histogram per backend (indexed as BACKENDS).
    create_latency: [Histogram; BACKENDS.len()],
    /// Buffered commands, from the request to the agent to its answer.
    exec_latency: Histogram,
    /// Audit events of every sandbox's agent, by kind (fed by the agents'
    /// tallies through `audit_sink`).
    audit: Arc<Mutex<BTreeMap<String, u64>>>,
}

/// Kinds of audit event counted under their own name; anything else an
/// agent reports is counted as `other` (the label set stays bounded).
const AUDIT_KINDS: &[&str] = &["syscall", "network", "masked_path", "tamper"];

impl Default for Counters {
    fn default() -> Self {
        Self {
            creations: Default::default(),
            creation_failures: Default::default(),
            execs: Default::default(),
            steps: Default::default(),
            pauses: Default::default(),
            resumes: Default::default(),
            create_latency: BACKENDS.map(|_| Histogram::new(OPERATION_BOUNDS)),
            exec_latency: Histogram::new(OPERATION_BOUNDS),
            audit: Default::default(),
        }
    }
}

fn backend_index(kind: BackendKind) -> usize {
    BACKENDS.iter().position(|&b| b == kind).unwrap_or(0)
}

/// A backend's name as labels and records spell it.
pub fn backend_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Container => "container",
        BackendKind::Microvm => "microvm",
        BackendKind::Vm => "vm",
        BackendKind::Fncall => "fncall",
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn created(&self, backend: BackendKind, ms: f64) {
        bump(&self.creations);
        self.create_latency[backend_index(backend)].observe(Duration::from_secs_f64(ms.max(0.0) / 1000.0));
    }

    pub(crate) fn creation_failed(&self) {
        bump(&self.creation_failures);
    }

    pub(crate) fn exec(&self) {
        bump(&self.execs);
    }

    /// A buffered command answered (or failed) after `took`.
    pub(crate) fn exec_done(&self, took: Duration) {
        self.exec_latency.observe(took);
    }

    pub(crate) fn step(&self) {
        bump(&self.steps);
    }

    pub(crate) fn paused(&self) {
        bump(&self.pauses);
    }

    pub(crate) fn resumed(&self) {
        bump(&self.resumes);
    }

    /// What an agent client reports its audit events' growth to.
    pub(crate) fn audit_sink(&self) -> dsec_agent_proto::client::AuditSink {
        let audit = self.audit.clone();
        Arc::new(move |kind: &str, n: u64| {
            let kind = if AUDIT_KINDS.contains(&kind) { kind } else { "other" };
            *audit.lock().unwrap_or_else(|p| p.into_inner()).entry(kind.to_string()).or_insert(0) += n;
        })
    }

    fn snapshot(&self) -> CounterSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CounterSnapshot {
            creations: get(&self.creations),
            creation_failures: get(&self.creation_failures),
            execs: get(&self.execs),
            steps: get(&self.steps),
            pauses: get(&self.pauses),
            resumes: get(&self.resumes),
            create_latency: BACKENDS.iter().zip(&self.create_latency).map(|(&b, h)| (backend_name(b), h.snapshot())).collect(),
            exec_latency: self.exec_latency.snapshot(),
            audit_events: self.audit.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }
}

/// The counters at one moment.
#[derive(Debug, Clone)]
pub struct CounterSnapshot {
    /// Sandboxes created (running at the end of their creation).
    pub creations: u64,
    /// Creations that failed (refused, or failed while starting).
    pub creation_failures: u64,
    /// Commands run (buffered; streamed ones count as steps).
    pub execs: u64,
    /// Operations appended to trajectory logs.
    pub steps: u64,
    pub pauses: u64,
    pub resumes: u64,
    /// Creation latency (accepted request to running sandbox), by backend
    /// name; every backend is present, observed or not.
    pub create_latency: BTreeMap<&'static str, HistogramSnapshot>,
    /// Buffered commands' latency.
    pub exec_latency: HistogramSnapshot,
    /// Refused attempts recorded in sandboxes, by kind (`syscall`,
    /// `network`, `masked_path`, `tamper`, `other`).
    pub audit_events: BTreeMap<String, u64>,
}

/// What an edge reports at a scrape.
#[derive(Debug, Clone)]
pub struct EdgeMetrics {
    pub counters: CounterSnapshot,
    /// Sandboxes held, by (state, backend).
    pub sandboxes: BTreeMap<(String, String), u64>,
    pub stats: NodeStats,
    /// Pages the host swapped in and out since boot (`/proc/vmstat`), the
    /// traffic paused sandboxes cause; `None` where it cannot be read.
    pub swap_pages: Option<SwapPages>,
}

/// The host's swap counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwapPages {
    pub swapped_in: u64,
    pub swapped_out: u64,
}

/// `pswpin` and `pswpout` of a `/proc/vmstat` text.
pub fn parse_vmstat_swap(text: &str) -> Option<SwapPages> {
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
    };
    Some(SwapPages { swapped_in: field("pswpin")?, swapped_out: field("pswpout")? })
}

impl Edge {
    /// The node's metrics now. Walks the registry once (a scrape every few
    /// seconds; never on a request's path).
    pub fn metrics(&self) -> EdgeMetrics {
        let mut sandboxes = BTreeMap::new();
        for entry in self.inner.registry.read().unwrap_or_else(|p| p.into_inner()).values() {
            let rec = entry.record();
            let key = (entry.state().as_str().to_string(), backend_name(rec.spec.backend).to_string());
            *sandboxes.entry(key).or_insert(0) += 1;
        }
        let swap_pages = std::fs::read_to_string("/proc/vmstat").ok().as_deref().and_then(parse_vmstat_swap);
        EdgeMetrics { counters: self.inner.counters.snapshot(), sandboxes, stats: self.stats(), swap_pages }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_latencies_are_kept_per_backend() {
        let c = Counters::default();
        for ms in [0.0, 1.0, 2.5] {
            c.created(BackendKind::Container, ms);
        }
        c.created(BackendKind::Microvm, 60_000.5);
        c.creation_failed();
        c.exec_done(Duration::from_millis(7));
        let s = c.snapshot();
        assert_eq!(s.creations, 4);
        assert_eq!(s.creation_failures, 1);
        assert_eq!(s.create_latency.keys().copied().collect::<Vec<_>>(), vec!["container", "fncall", "microvm", "vm"]);
        let container = &s.create_latency["container"];
        // 0 and 1 ms -> "<= 0.001"; 2.5 ms -> "<= 0.005".
        assert_eq!((container.counts[0], container.counts[2], container.count()), (2, 1, 3));
        let microvm = &s.create_latency["microvm"];
        assert_eq!(microvm.counts[OPERATION_BOUNDS.len()], 1, "above the last bound: {microvm:?}");
        assert!((microvm.sum_seconds - 60.0005).abs() < 1e-6);
        assert_eq!(s.create_latency["vm"].count(), 0);
        assert_eq!(s.exec_latency.count(), 1);
    }

    #[test]
    fn swap_counters_are_read_from_vmstat() {
        let text = "nr_free_pages 10\npswpin 12\npswpout 345\npswpout_extra 9\n";
        assert_eq!(parse_vmstat_swap(text), Some(SwapPages { swapped_in: 12, swapped_out: 345 }));
        assert_eq!(parse_vmstat_swap("pswpin 1\n"), None);
    }

    #[test]
    fn audit_events_are_summed_by_kind_with_unknown_kinds_as_other() {
        let c = Counters::default();
        let (a, b) = (c.audit_sink(), c.audit_sink());
        a("syscall", 2);
        b("syscall", 3);
        b("network", 1);
        a("made-up", 4);
        let got: Vec<_> = c.snapshot().audit_events.into_iter().collect();
        assert_eq!(got, vec![("network".into(), 1), ("other".into(), 4), ("syscall".into(), 5)]);
    }
}
