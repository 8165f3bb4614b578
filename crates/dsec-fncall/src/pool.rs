//! A pool of runners for one language: between `min` and `max` runners,
//! idle ones reused, a bounded queue of waiting calls when all are busy.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dsec_api::FnCallPoolStatus;
use dsec_edge::Edge;
use tokio::sync::oneshot;

use crate::config::FnCallConfig;
use crate::error::FnCallError;
use crate::runner::Runner;

type Waiter = oneshot::Sender<Result<Runner, FnCallError>>;

#[derive(Default)]
struct State {
    idle: Vec<Runner>,
    /// Runners in existence or being started (idle + busy + starting).
    total: u32,
    starting: u32,
    waiters: VecDeque<Waiter>,
    calls: u64,
    replaced: u64,
    /// Starts that failed in a row, and when the last did: keeping the
    /// minimum warm backs off instead of retrying every tick (a missing
    /// image would otherwise make a failing sandbox per second).
    failures: u32,
    last_failure: Option<Instant>,
}

impl State {
    fn in_backoff(&self) -> bool {
        let wait = Duration::from_secs(1u64 << self.failures.min(6));
        self.last_failure.is_some_and(|t| t.elapsed() < wait)
    }
}

pub struct Pool {
    pub language: String,
    pub min: u32,
    pub max: u32,
    /// The memory of each of its runners.
    pub runner_memory_mb: u64,
    edge: Edge,
    cfg: Arc<FnCallConfig>,
    state: Mutex<State>,
    closed: AtomicBool,
}

/// A runner lent to one call. Dropped without [`Lease::finish`], the
/// runner is presumed broken (the call did not complete) and retired.
pub struct Lease {
    runner: Option<Runner>,
    pool: Arc<Pool>,
    healthy: bool,
}

impl Lease {
    pub fn runner(&mut self) -> &mut Runner {
        self.runner.as_mut().expect("a lease holds its runner until dropped")
    }

    /// The call ended cleanly: the runner may serve the next one.
    pub fn finish(mut self) {
        self.healthy = true;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(r) = self.runner.take() {
            self.pool.release(r, self.healthy);
        }
    }
}

impl Pool {
    pub fn new(language: &str, min: u32, max: u32, runner_memory_mb: u64, edge: Edge, cfg: Arc<FnCallConfig>) -> Arc<Pool> {
        Arc::new(Pool {
            language: language.to_string(),
            min,
            max: max.max(1),
            runner_memory_mb,
            edge,
            cfg,
            state: Mutex::new(State::default()),
            closed: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent before any
        // call that could panic, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lease(self: &Arc<Self>, runner: Runner) -> Lease {
        Lease { runner: Some(runner), pool: self.clone(), healthy: false }
    }

    /// A runner for one call: an idle one at once, else a place in the
    /// queue (starting another runner if the pool may grow).
    pub async fn acquire(self: &Arc<Self>) -> Result<Lease, FnCallError> {
        let rx = {
            let mut s = self.lock();
            if self.closed.load(Ordering::SeqCst) {
                return Err(FnCallError::ShuttingDown);
            }
            if let Some(r) = s.idle.pop() {
                s.calls += 1;
                return Ok(self.lease(r));
            }
            s.waiters.retain(|w| !w.is_closed());
            if s.waiters.len() >= self.cfg.queue_limit {
                return Err(FnCallError::QueueFull { language: self.language.clone(), queued: s.waiters.len(), retry_after_s: 1 });
            }
            let (tx, rx) = oneshot::channel();
            s.waiters.push_back(tx);
            self.grow_locked(&mut s);
            rx
        };
        match tokio::time::timeout(self.cfg.queue_timeout, rx).await {
            Ok(Ok(Ok(r))) => Ok(self.lease(r)),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(FnCallError::ShuttingDown),
            Err(_) => Err(FnCallError::QueueTimeout(self.language.clone())),
        }
    }

    /// Starts runners for waiters that no starting runner will serve, up
    /// to `max`, and up to `min` in any case.
    fn grow_locked(self: &Arc<Self>, s: &mut State) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        loop {
            let for_waiter = (s.starting as usize) < s.waiters.len();
            let for_min = s.total < self.min && !s.in_backoff();
            if s.total >= self.max || !(for_waiter || for_min) {
                break;
            }
            s.total += 1;
            s.starting += 1;
            let pool = self.clone();
            tokio::spawn(async move {
                let r = Runner::start(&pool.edge, &pool.cfg, &pool.language, pool.runner_memory_mb).await;
                pool.started(r).await;
            });
        }
    }

    async fn started(self: &Arc<Self>, r: Result<Runner, FnCallError>) {
        let retire = {
            let mut s = self.lock();
            s.starting -= 1;
            match r {
                Ok(runner) if self.closed.load(Ordering::SeqCst) => {
                    s.total -= 1;
                    Some(runner)
                }
                Ok(runner) => {
                    s.failures = 0;
                    s.last_failure = None;
                    self.hand_out_locked(&mut s, runner);
                    None
                }
                Err(e) => {
                    s.total -= 1;
                    s.failures += 1;
                    s.last_failure = Some(Instant::now());
                    tracing::warn!(language = %self.language, error = %e, "starting a runner failed");
                    // The waiter this runner was for learns why; the others
                    // keep their runners coming (or their own errors).
                    if let Some(w) = s.waiters.pop_front() {
                        let _ = w.send(Err(FnCallError::RunnerFailed(e.to_string())));
                    }
                    None
                }
            }
        };
        if let Some(r) = retire {
            r.retire(&self.edge).await;
        }
    }

    fn hand_out_locked(&self, s: &mut State, mut runner: Runner) {
        while let Some(w) = s.waiters.pop_front() {
            match w.send(Ok(runner)) {
                Ok(()) => {
                    s.calls += 1;
                    return;
                }
                // That caller gave up waiting: try the next.
                Err(Ok(r)) => runner = r,
                Err(Err(_)) => unreachable!("only runners are sent here"),
            }
        }
        runner.idle_since = Instant::now();
        s.idle.push(runner);
    }

    fn release(self: &Arc<Self>, runner: Runner, healthy: bool) {
        let keep = healthy && runner.calls < self.cfg.max_calls_per_runner && !self.closed.load(Ordering::SeqCst);
        if keep {
            let mut s = self.lock();
            self.hand_out_locked(&mut s, runner);
            return;
        }
        {
            let mut s = self.lock();
            s.total -= 1;
            s.replaced += 1;
            self.grow_locked(&mut s);
        }
        tracing::debug!(runner = %runner.id, healthy, calls = runner.calls, "retiring a runner");
        let edge = self.edge.clone();
        tokio::spawn(async move { runner.retire(&edge).await });
    }

    /// Keeps `min` runners; stops runners idle too long above `min`.
    pub async fn maintain(self: &Arc<Self>) {
        let surplus: Vec<Runner> = {
            let mut s = self.lock();
            self.grow_locked(&mut s);
            let mut out = Vec::new();
            // Oldest idle first (the idle list is a stack: index 0 is oldest).
            while s.total > self.min && s.idle.first().is_some_and(|r| r.idle_since.elapsed() >= self.cfg.shrink_after) {
                out.push(s.idle.remove(0));
                s.total -= 1;
            }
            out
        };
        for r in surplus {
            r.retire(&self.edge).await;
        }
    }

    pub fn status(&self) -> FnCallPoolStatus {
        let s = self.lock();
        FnCallPoolStatus {
            language: self.language.clone(),
            runner_memory_mb: self.runner_memory_mb,
            min_runners: self.min,
            max_runners: self.max,
            runners: s.total,
            idle: s.idle.len() as u32,
            starting: s.starting,
            queued: s.waiters.iter().filter(|w| !w.is_closed()).count() as u32,
            queue_limit: self.cfg.queue_limit as u32,
            calls: s.calls,
            runners_replaced: s.replaced,
        }
    }

    /// Stops taking calls, fails the waiting ones and removes idle runners;
    /// busy runners are removed when their call ends.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let idle = {
            let mut s = self.lock();
            for w in s.waiters.drain(..) {
                let _ = w.send(Err(FnCallError::ShuttingDown));
            }
            let idle = std::mem::take(&mut s.idle);
            s.total -= idle.len() as u32;
            idle
        };
        for r in idle {
            r.retire(&self.edge).await;
        }
    }
}
