//! A closed-loop load runner: `concurrency` workers pull operation indexes
//! from a shared counter until `n` are done, each operation timed.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// One finished operation.
#[derive(Debug, Clone)]
pub struct Done<T> {
    /// Completion order.
    pub completed: usize,
    /// Since the start of the run, when the operation ended.
    pub end_ms: f64,
    pub latency_ms: f64,
    pub result: Result<T, String>,
}

pub struct RunOutput<T> {
    pub done: Vec<Done<T>>,
    pub wall: Duration,
}

impl<T> RunOutput<T> {
    pub fn ok(&self) -> impl Iterator<Item = (&Done<T>, &T)> {
        self.done.iter().filter_map(|d| d.result.as_ref().ok().map(|v| (d, v)))
    }

    pub fn errors(&self) -> Vec<String> {
        self.done.iter().filter_map(|d| d.result.as_ref().err().cloned()).collect()
    }

    pub fn latencies(&self) -> Vec<f64> {
        self.ok().map(|(d, _)| d.latency_ms).collect()
    }

    /// Successful operations per second over the whole run.
    pub fn rate(&self) -> f64 {
        self.ok().count() as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

pub fn progress(n: usize, label: &str, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(n as u64), ProgressDrawTarget::stderr_with_hz(5));
    pb.set_style(
        ProgressStyle::with_template("{prefix:>12} [{elapsed_precise}] {bar:40.cyan/blue} {pos:>6}/{len:6} {per_sec:>10} eta {eta} {msg}")
            .unwrap()
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    pb
}

/// Runs `op(i)` for i in 0..n with `concurrency` workers.
pub async fn run<T, F, Fut>(n: usize, concurrency: usize, pb: ProgressBar, op: F) -> RunOutput<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<T>> + Send + 'static,
{
    let next = Arc::new(AtomicUsize::new(0));
    let completed = Arc::new(AtomicUsize::new(0));
    let out: Arc<Mutex<Vec<Done<T>>>> = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let op = Arc::new(op);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1).min(n.max(1)) {
        let (next, completed, out, op, pb) = (next.clone(), completed.clone(), out.clone(), op.clone(), pb.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let t0 = Instant::now();
                let r = op(i).await;
                let lat = t0.elapsed().as_secs_f64() * 1000.0;
                let end_ms = start.elapsed().as_secs_f64() * 1000.0;
                let c = completed.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = &r {
                    pb.set_message(format!("error: {e:#}"));
                }
                pb.inc(1);
                out.lock().unwrap().push(Done { completed: c, end_ms, latency_ms: lat, result: r.map_err(|e| format!("{e:#}")) });
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let wall = start.elapsed();
    pb.finish_and_clear();
    let mut done = std::mem::take(&mut *out.lock().unwrap());
    done.sort_by_key(|d| d.completed);
    RunOutput { done, wall }
}
