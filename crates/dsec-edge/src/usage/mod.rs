//! Resource use over time: every running sandbox's CPU, memory, pids,
//! writable-layer size and network traffic, and the node's CPU, memory and
//! swap, sampled once a second into a bounded ring each (the last
//! `usage_window_s` seconds).
//!
//! One sampler task serves the whole node: each second it walks the
//! registry once on a blocking thread and reads a few small files per
//! running sandbox (`read`). A series holds packed samples (32 bytes: 9.6
//! KiB for the default five minutes) and lives in the sandbox's registry
//! entry, so it goes with the sandbox; a sandbox that ended gives its
//! memory back at the next pass. Paused sandboxes are not sampled (they
//! use no CPU and their memory is in swap): their series has a gap.

mod read;
mod ring;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::edge::{lock, Edge, Entry};
use crate::error::EdgeError;
use crate::model::{now_ms, BackendKind, Caller, Limits, State};
use ring::Ring;

/// How often the sampler reads every sandbox.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Samples kept per series by default: five minutes.
pub const DEFAULT_WINDOW_S: usize = 300;

/// One second of a sandbox's use (the fields as `dsec_api::MetricsSample`
/// documents them: CPU in cores over the second before, `None` where a
/// value cannot be read for this backend).
#[derive(Debug, Clone, PartialEq)]
pub struct UsageSample {
    pub time_ms: u64,
    pub cpu_cores: f64,
    pub memory_bytes: u64,
    pub pids: u64,
    pub disk_bytes: Option<u64>,
    pub net_rx_bytes_per_s: Option<u64>,
    pub net_tx_bytes_per_s: Option<u64>,
}

/// A sandbox's recent use, oldest sample first.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxUsage {
    pub id: String,
    pub state: State,
    pub limits: Limits,
    pub interval_ms: u64,
    /// Bytes received and sent since its network namespace was made.
    pub net_rx_bytes: Option<u64>,
    pub net_tx_bytes: Option<u64>,
    pub samples: Vec<UsageSample>,
}

/// One second of the node's use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeUsageSample {
    pub time_ms: u64,
    pub cpu_cores: f64,
    pub memory_bytes: u64,
    pub swap_bytes: u64,
    /// Sandboxes running at that moment.
    pub sandboxes: u64,
}

/// The node's recent use, oldest sample first.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeUsage {
    pub node: String,
    pub interval_ms: u64,
    pub cpus: u32,
    pub memory_total_bytes: u64,
    pub samples: Vec<NodeUsageSample>,
}

/// A sample as the ring keeps it. `UNKNOWN` marks a value that could not
/// be read.
#[derive(Debug, Clone, Copy)]
struct Packed {
    time_ms: u64,
    cpu_millicores: u32,
    memory_kib: u32,
    pids: u32,
    disk_kib: u32,
    rx_per_s: u32,
    tx_per_s: u32,
}

const UNKNOWN: u32 = u32::MAX;

fn pack(v: Option<u64>) -> u32 {
    v.map_or(UNKNOWN, |v| v.min(u64::from(UNKNOWN - 1)) as u32)
}

fn unpack(v: u32) -> Option<u64> {
    (v != UNKNOWN).then_some(u64::from(v))
}

impl Packed {
    fn sample(&self) -> UsageSample {
        UsageSample {
            time_ms: self.time_ms,
            cpu_cores: f64::from(self.cpu_millicores) / 1000.0,
            memory_bytes: u64::from(self.memory_kib) << 10,
            pids: u64::from(self.pids),
            disk_bytes: unpack(self.disk_kib).map(|k| k << 10),
            net_rx_bytes_per_s: unpack(self.rx_per_s),
            net_tx_bytes_per_s: unpack(self.tx_per_s),
        }
    }
}

/// One sandbox's series: its ring, and the last reading (rates are the
/// difference to it).
#[derive(Debug, Default)]
pub(crate) struct Series {
    ring: Option<Ring<Packed>>,
    last: Option<(Instant, read::Reading)>,
}

impl Series {
    /// Adds the second that ended with `now` (nothing for a first reading,
    /// which has no second before it, nor for an unreadable cgroup).
    fn record(&mut self, time_ms: u64, at: Instant, now: read::Reading, window: usize) {
        let Some(cpu_ns) = now.cpu_ns else { return };
        let Some((then, before)) = self.last.replace((at, now)) else { return };
        let secs = at.duration_since(then).as_secs_f64();
        if secs <= 0.0 {
            return;
        }
        let per_s = |a: u64, b: u64| (a.saturating_sub(b) as f64 / secs) as u64;
        let (rx, tx) = match (now.net, before.net) {
            (Some(n), Some(b)) => (Some(per_s(n.rx_bytes, b.rx_bytes)), Some(per_s(n.tx_bytes, b.tx_bytes))),
            _ => (None, None),
        };
        let cpu_ns_per_s = per_s(cpu_ns, before.cpu_ns.unwrap_or(cpu_ns));
        self.ring.get_or_insert_with(|| Ring::new(window)).push(Packed {
            time_ms,
            cpu_millicores: pack(Some(cpu_ns_per_s / 1_000_000)),
            memory_kib: pack(Some(now.memory_bytes.unwrap_or(0) >> 10)),
            pids: pack(Some(now.pids.unwrap_or(0))),
            disk_kib: pack(now.disk_bytes.map(|b| b >> 10)),
            rx_per_s: pack(rx),
            tx_per_s: pack(tx),
        });
    }

    fn clear(&mut self) {
        if self.ring.is_some() || self.last.is_some() {
            *self = Series::default();
        }
    }

    fn samples(&self, n: usize) -> Vec<UsageSample> {
        self.ring.as_ref().map(|r| r.last(n).iter().map(Packed::sample).collect()).unwrap_or_default()
    }
}

/// The node's series.
#[derive(Debug)]
pub(crate) struct NodeSeries {
    inner: Mutex<NodeSamples>,
}

#[derive(Debug)]
struct NodeSamples {
    last: Option<(Instant, read::NodeReading)>,
    ring: Ring<NodeUsageSample>,
}

impl NodeSeries {
    pub(crate) fn new(window: usize) -> Self {
        NodeSeries { inner: Mutex::new(NodeSamples { last: None, ring: Ring::new(window) }) }
    }

    fn record(&self, time_ms: u64, at: Instant, now: read::NodeReading, sandboxes: u64) {
        let mut inner = lock(&self.inner);
        let Some((_, before)) = inner.last.replace((at, now)) else { return };
        let total = now.total_jiffies.saturating_sub(before.total_jiffies);
        let busy = now.busy_jiffies.saturating_sub(before.busy_jiffies);
        let cpu_cores = if total == 0 { 0.0 } else { busy as f64 / total as f64 * f64::from(now.cpus) };
        inner.ring.push(NodeUsageSample {
            time_ms,
            cpu_cores,
            memory_bytes: now.memory_used_bytes,
            swap_bytes: now.swap_used_bytes,
            sandboxes,
        });
    }
}

impl Edge {
    /// Sandbox `id`'s use over its last `seconds` (all that is kept if
    /// `None`), oldest first. Reading it is not activity: it neither
    /// resumes a paused sandbox nor resets its idle clock.
    pub fn usage(&self, caller: &Caller, id: &str, seconds: Option<u64>) -> Result<SandboxUsage, EdgeError> {
        let entry = self.entry(caller, id)?;
        let rec = entry.record();
        if rec.state.is_terminal() {
            return Err(EdgeError::Ended { id: rec.id, state: rec.state.as_str() });
        }
        let n = self.window_of(seconds)?;
        let series = lock(&entry.usage);
        let net = series.last.and_then(|(_, r)| r.net);
        Ok(SandboxUsage {
            id: rec.id,
            state: rec.state,
            limits: rec.spec.limits,
            interval_ms: SAMPLE_EVERY.as_millis() as u64,
            net_rx_bytes: net.map(|n| n.rx_bytes),
            net_tx_bytes: net.map(|n| n.tx_bytes),
            samples: series.samples(n),
        })
    }

    /// The node's use over its last `seconds` (all that is kept if `None`).
    pub fn node_usage(&self, seconds: Option<u64>) -> Result<NodeUsage, EdgeError> {
        let n = self.window_of(seconds)?;
        let (cpus, memory_mb) = crate::edge::host_resources();
        let inner = lock(&self.inner.node_usage.inner);
        Ok(NodeUsage {
            node: self.inner.config.node.clone(),
            interval_ms: SAMPLE_EVERY.as_millis() as u64,
            cpus: inner.last.map_or(cpus as u32, |(_, r)| r.cpus),
            memory_total_bytes: memory_mb << 20,
            samples: inner.ring.last(n),
        })
    }

    /// How many samples `seconds` asks for, refused beyond the window.
    fn window_of(&self, seconds: Option<u64>) -> Result<usize, EdgeError> {
        let window = self.inner.config.usage_window_s;
        match seconds {
            None => Ok(window),
            Some(s) if s >= 1 && s <= window as u64 => Ok(s as usize),
            Some(s) => Err(EdgeError::Invalid(format!("seconds={s} must be between 1 and {window} (the samples this node keeps)"))),
        }
    }

    /// Starts the one sampler of this edge (none if the window is 0).
    pub(crate) fn spawn_usage_sampler(&self) {
        if self.inner.config.usage_window_s == 0 {
            return;
        }
        let edge = self.clone();
        let mut stop = self.inner.shutdown.subscribe();
        tokio::spawn(async move {
            let host_netns = read::netns_of("self");
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
                let edge = edge.clone();
                let _ = tokio::task::spawn_blocking(move || edge.sample_all(host_netns)).await;
            }
        });
    }

    /// One pass: a sample of every running sandbox and of the node.
    fn sample_all(&self, host_netns: Option<u64>) {
        let entries: Vec<Arc<Entry>> = self.inner.registry.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        let window = self.inner.config.usage_window_s;
        let mut running = 0;
        for entry in entries {
            let (id, state, pid, kind, networked) = {
                let r = lock(&entry.record);
                (r.id.clone(), r.state, r.pid, r.spec.backend, !r.spec.network_rules.is_empty())
            };
            if state.is_terminal() {
                lock(&entry.usage).clear();
                continue;
            }
            if state != State::Running {
                continue;
            }
            running += 1;
            let Some(pid) = pid else { continue };
            let disk = self.inner.backends.for_cleanup(kind).disk_used_bytes(&id, pid);
            // A container made without rules has a namespace with loopback
            // only, which the counters leave out: nothing to read.
            let loopback_only = !networked && matches!(kind, BackendKind::Container | BackendKind::Fncall);
            let net = if loopback_only { read::Net::LoopbackOnly } else { read::Net::Read { host_netns } };
            let reading = read::sandbox(&self.inner.cgroups, &id, pid, net, disk);
            lock(&entry.usage).record(now_ms(), Instant::now(), reading, window);
        }
        self.inner.node_usage.record(now_ms(), Instant::now(), read::node(), running);
    }
}

#[cfg(test)]
mod tests {
    use super::read::{NetCounters, Reading};
    use super::*;

    fn reading(cpu_ns: u64, memory: u64, rx: u64) -> Reading {
        Reading {
            cpu_ns: Some(cpu_ns),
            memory_bytes: Some(memory),
            pids: Some(3),
            disk_bytes: None,
            net: Some(NetCounters { rx_bytes: rx, tx_bytes: 0 }),
        }
    }

    #[test]
    fn rates_are_per_second_of_the_interval_between_readings() {
        let mut s = Series::default();
        let t0 = Instant::now();
        s.record(1000, t0, reading(0, 1 << 20, 0), 10);
        assert!(s.samples(10).is_empty(), "a first reading has no second before it");
        // Two seconds, one and a half cores busy, 4 KiB/s received.
        s.record(3000, t0 + Duration::from_secs(2), reading(3_000_000_000, 2 << 20, 8192), 10);
        let got = s.samples(10);
        assert_eq!(got.len(), 1);
        let x = &got[0];
        assert_eq!((x.time_ms, x.memory_bytes, x.pids, x.disk_bytes), (3000, 2 << 20, 3, None));
        assert!((x.cpu_cores - 1.5).abs() < 0.002, "{x:?}");
        assert_eq!((x.net_rx_bytes_per_s, x.net_tx_bytes_per_s), (Some(4096), Some(0)));
    }

    #[test]
    fn a_series_keeps_its_window_and_gives_its_memory_back() {
        let mut s = Series::default();
        let t0 = Instant::now();
        for i in 0..50u64 {
            s.record(i * 1000, t0 + Duration::from_secs(i), reading(i * 1_000_000, 0, 0), 5);
        }
        let got = s.samples(100);
        assert_eq!(got.iter().map(|x| x.time_ms).collect::<Vec<_>>(), vec![45_000, 46_000, 47_000, 48_000, 49_000]);
        assert_eq!(s.samples(2).len(), 2);
        s.clear();
        assert!(s.ring.is_none() && s.last.is_none());
    }

    #[test]
    fn an_unreadable_cgroup_adds_no_sample() {
        let mut s = Series::default();
        let t0 = Instant::now();
        s.record(0, t0, reading(0, 0, 0), 5);
        s.record(1000, t0 + Duration::from_secs(1), Reading::default(), 5);
        assert!(s.samples(5).is_empty());
    }

    #[test]
    fn the_node_series_computes_busy_cores() {
        let n = NodeSeries::new(3);
        let t0 = Instant::now();
        let r =
            |busy, total| read::NodeReading { busy_jiffies: busy, total_jiffies: total, cpus: 4, memory_used_bytes: 7, swap_used_bytes: 1 };
        n.record(0, t0, r(0, 0), 2);
        n.record(1000, t0 + SAMPLE_EVERY, r(200, 400), 2);
        let got = lock(&n.inner).ring.last(5);
        assert_eq!(got, vec![NodeUsageSample { time_ms: 1000, cpu_cores: 2.0, memory_bytes: 7, swap_bytes: 1, sandboxes: 2 }]);
    }
}
