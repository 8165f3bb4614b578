//! A latency histogram for the Prometheus exposition: fixed bucket bounds,
//! one relaxed atomic add per observation (no lock, no allocation), read
//! as a snapshot at scrape time.
//!
//! Shared by the edge (creation and exec latency), FnCall (call latency)
//! and the apiserver (request duration), so every histogram of `/metrics`
//! has the same shape and the same formatter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bucket upper bounds (seconds) for operations from a millisecond to a
/// minute: creation, FnCall calls, commands.
pub const OPERATION_BOUNDS: &[f64] = &[0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];

/// Bucket upper bounds (seconds) for HTTP requests, most of which answer in
/// well under a millisecond.
pub const REQUEST_BOUNDS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

/// Observations counted per bucket (not cumulative) plus an overflow
/// bucket, and their sum in nanoseconds.
pub struct Histogram {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// `bounds` must be ascending (they are constants of this module).
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "histogram bounds must ascend");
        Self { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum_ns: AtomicU64::new(0) }
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.iter().position(|&b| s <= b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: self.bounds,
            counts: self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
            sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// A histogram at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Bucket upper bounds, seconds.
    pub bounds: &'static [f64],
    /// Observations per bucket, not cumulative: one more entry than
    /// `bounds` (everything above the last bound).
    pub counts: Vec<u64>,
    pub sum_seconds: f64,
}

impl HistogramSnapshot {
    pub fn empty(bounds: &'static [f64]) -> Self {
        Self { bounds, counts: vec![0; bounds.len() + 1], sum_seconds: 0.0 }
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds another snapshot of the same bounds (several pools of one
    /// language, several edges of one process).
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        debug_assert_eq!(self.bounds, other.bounds, "only histograms of the same bounds merge");
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_seconds += other.sum_seconds;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = Histogram::new(&[0.001, 0.01]);
        for ms in [0, 1, 2, 10, 11, 5000] {
            h.observe(Duration::from_millis(ms));
        }
        let s = h.snapshot();
        assert_eq!(s.counts, vec![2, 2, 2]);
        assert_eq!(s.count(), 6);
        assert!((s.sum_seconds - 5.024).abs() < 1e-9, "{}", s.sum_seconds);
    }

    #[test]
    fn snapshots_of_the_same_bounds_merge() {
        let (a, b) = (Histogram::new(OPERATION_BOUNDS), Histogram::new(OPERATION_BOUNDS));
        a.observe(Duration::from_millis(3));
        b.observe(Duration::from_secs(100));
        let mut m = HistogramSnapshot::empty(OPERATION_BOUNDS);
        m.merge(&a.snapshot());
        m.merge(&b.snapshot());
        assert_eq!(m.count(), 2);
        assert_eq!(m.counts[2], 1);
        assert_eq!(m.counts[OPERATION_BOUNDS.len()], 1);
        assert!((m.sum_seconds - 100.003).abs() < 1e-9);
    }
}
