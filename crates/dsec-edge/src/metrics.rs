//! What an edge counts for its metrics endpoint: monotonic counters of the
//! operations it carried out, a histogram of creation latency, and, read at
//! scrape time, the sandboxes it holds by state and backend.
//!
//! Counters are relaxed atomics bumped on the paths they count (one add,
//! no lock); nothing here is on a path that could fail because of it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::edge::{Edge, NodeStats};

/// Upper bounds (ms) of the creation-latency buckets; the last bucket is
/// everything above.
pub const CREATE_MS_BUCKETS: [u64; 12] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000];

#[derive(Default)]
pub(crate) struct Counters {
    creations: AtomicU64,
    creation_failures: AtomicU64,
    execs: AtomicU64,
    steps: AtomicU64,
    pauses: AtomicU64,
    resumes: AtomicU64,
    create_ms_buckets: [AtomicU64; CREATE_MS_BUCKETS.len() + 1],
    create_us_sum: AtomicU64,
    /// Audit events of every sandbox's agent, by kind (fed by the agents'
    /// tallies through `audit_sink`).
    audit: Arc<Mutex<BTreeMap<String, u64>>>,
}

/// Kinds of audit event counted under their own name; anything else an
/// agent reports is counted as `other` (the label set stays bounded).
const AUDIT_KINDS: &[&str] = &["syscall", "network", "masked_path", "tamper"];

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn created(&self, ms: f64) {
        bump(&self.creations);
        let i = CREATE_MS_BUCKETS.iter().position(|&b| ms <= b as f64).unwrap_or(CREATE_MS_BUCKETS.len());
        bump(&self.create_ms_buckets[i]);
        self.create_us_sum.fetch_add((ms.max(0.0) * 1000.0) as u64, Ordering::Relaxed);
    }

    pub(crate) fn creation_failed(&self) {
        bump(&self.creation_failures);
    }

    pub(crate) fn exec(&self) {
        bump(&self.execs);
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
            create_ms_buckets: self.create_ms_buckets.iter().map(get).collect(),
            create_us_sum: get(&self.create_us_sum),
            audit_events: self.audit.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }
}

/// The counters at one moment.
#[derive(Debug, Clone, Default)]
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
    /// Creations per latency bucket (not cumulative); one more entry than
    /// [`CREATE_MS_BUCKETS`] (the overflow bucket).
    pub create_ms_buckets: Vec<u64>,
    /// Sum of all creation latencies, in microseconds.
    pub create_us_sum: u64,
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
}

impl Edge {
    /// The node's metrics now. Walks the registry once (a scrape every few
    /// seconds; never on a request's path).
    pub fn metrics(&self) -> EdgeMetrics {
        let mut sandboxes = BTreeMap::new();
        for entry in self.inner.registry.read().unwrap_or_else(|p| p.into_inner()).values() {
            let rec = entry.record();
            let key = (entry.state().as_str().to_string(), format!("{:?}", rec.spec.backend).to_lowercase());
            *sandboxes.entry(key).or_insert(0) += 1;
        }
        EdgeMetrics { counters: self.inner.counters.snapshot(), sandboxes, stats: self.stats() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_latencies_land_in_their_buckets() {
        let c = Counters::default();
        for ms in [0.0, 1.0, 2.5, 5000.0, 5000.5, 60_000.0] {
            c.created(ms);
        }
        c.creation_failed();
        let s = c.snapshot();
        assert_eq!(s.creations, 6);
        assert_eq!(s.creation_failures, 1);
        assert_eq!(s.create_ms_buckets.len(), CREATE_MS_BUCKETS.len() + 1);
        // 0 and 1 -> "<= 1"; 2.5 -> "<= 5"; 5000 -> "<= 5000"; the rest above.
        assert_eq!(s.create_ms_buckets[0], 2);
        assert_eq!(s.create_ms_buckets[2], 1);
        assert_eq!(s.create_ms_buckets[CREATE_MS_BUCKETS.len() - 1], 1);
        assert_eq!(s.create_ms_buckets[CREATE_MS_BUCKETS.len()], 2);
        assert_eq!(s.create_us_sum, 1000 + 2500 + 5_000_000 + 5_000_500 + 60_000_000);
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
