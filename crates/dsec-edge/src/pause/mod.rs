//! Pause and resume of one sandbox (running -> pausing -> paused ->
//! resuming -> running), each bounded by a timeout.
//!
//! Pause freezes the sandbox's cgroup, pushes its memory out of RAM (see
//! `cgroup::pause`) and gives its admission reservation back, so a paused
//! sandbox does not count against the node's running quota. Resume takes a
//! reservation again, restores the memory limit and thaws; pages come back
//! as the sandbox touches them. Any request to a paused sandbox resumes it
//! first (`agent_ops`).
//!
//! Crash safety: `pausing` is committed before the freeze, so a restarted
//! edge knows to look at the freezer; recovery (`background`) finishes a
//! pause it finds half-done and keeps paused sandboxes frozen, adopting
//! their agent only when they are resumed (a frozen agent cannot answer the
//! re-attach handshake).

pub(crate) mod jobs;
pub(crate) mod prefetch;
pub(crate) mod suspend;
pub mod swap;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cgroup::PushOut;
use crate::edge::{lock, Edge, Entry};
use crate::error::EdgeError;
use crate::model::{now_ms, Caller, SandboxRecord, State};
pub use crate::pause::suspend::PauseMode;

/// What one pause did.
#[derive(Debug, Clone)]
pub struct PauseOutcome {
    pub record: SandboxRecord,
    /// False if the sandbox was already paused (pausing is idempotent).
    pub changed: bool,
    pub memory: PushOut,
    pub duration_ms: f64,
    /// Suspended to disk (the VM's process ended) rather than frozen.
    pub suspended: bool,
    /// Bytes the suspend image occupies on disk (0 for a freeze).
    pub disk_bytes: u64,
}

/// What one resume did.
#[derive(Debug, Clone)]
pub struct ResumeOutcome {
    pub record: SandboxRecord,
    /// False if the sandbox was already running.
    pub changed: bool,
    pub duration_ms: f64,
}

/// Pause between attempts to re-attach to a just-thawed agent.
const REATTACH_RETRY: Duration = Duration::from_millis(5);

impl Edge {
    /// Pauses a running sandbox the default way for its backend (a
    /// microVM is suspended to disk, a container frozen with its memory
    /// pushed out). Pausing a paused sandbox changes nothing and says so
    /// (`changed: false`).
    pub async fn pause(&self, caller: &Caller, id: &str) -> Result<PauseOutcome, EdgeError> {
        self.pause_with(caller, id, PauseMode::Auto).await
    }

    /// Pauses a running sandbox in `mode`.
    pub async fn pause_with(&self, caller: &Caller, id: &str, mode: PauseMode) -> Result<PauseOutcome, EdgeError> {
        // Like stop: finish even if the caller goes away.
        let (edge, caller, id) = (self.clone(), caller.clone(), id.to_string());
        let out =
            tokio::spawn(async move { edge.pause_to_completion(&caller, &id, mode).await }).await.map_err(EdgeError::task("pause"))?;
        if matches!(&out, Ok(o) if o.changed) {
            self.inner.counters.paused();
        }
        out
    }

    /// Thaws a paused sandbox. Resuming a running one changes nothing.
    pub async fn resume(&self, caller: &Caller, id: &str) -> Result<ResumeOutcome, EdgeError> {
        let (edge, caller, id) = (self.clone(), caller.clone(), id.to_string());
        let out = tokio::spawn(async move {
            let entry = edge.entry(&caller, &id)?;
            let _op = entry.op_lock.lock().await;
            edge.resume_locked(&entry).await
        })
        .await
        .map_err(EdgeError::task("resume"))?;
        if matches!(&out, Ok(o) if o.changed) {
            self.inner.counters.resumed();
        }
        out
    }

    async fn pause_to_completion(&self, caller: &Caller, id: &str, mode: PauseMode) -> Result<PauseOutcome, EdgeError> {
        let entry = self.entry(caller, id)?;
        let _op = entry.op_lock.lock().await;
        let t0 = Instant::now();
        match entry.state() {
            State::Running => {}
            State::Paused => {
                let record = entry.record();
                let suspended = record.suspended;
                return Ok(PauseOutcome { record, changed: false, memory: PushOut::default(), duration_ms: 0.0, suspended, disk_bytes: 0 });
            }
            s if s.is_terminal() => return Err(EdgeError::Ended { id: id.to_string(), state: s.as_str() }),
            s => return Err(EdgeError::NotRunning { id: id.to_string(), state: s.as_str() }),
        }
        if self.suspends(&entry, mode)? {
            return self.suspend_locked(&entry, t0).await;
        }
        self.set_state(&entry, State::Pausing, None);
        // Durable before the freeze: a restarted edge then looks at the
        // freezer instead of trying to talk to a frozen agent.
        if let Err(e) = self.inner.store.sync().await {
            self.set_state(&entry, State::Running, None);
            return Err(EdgeError::Store(e));
        }
        let spec = entry.record().spec;
        let limit = self.inner.backends.cgroup_memory_bytes(&spec);
        let backend = self.inner.backends.for_cleanup(spec.backend);
        if let Err(e) = backend.before_freeze(id).await {
            self.set_state(&entry, State::Running, None);
            return Err(e);
        }
        let cgroups = self.inner.cgroups.clone();
        let timeout = self.inner.config.pause_timeout;
        let name = id.to_string();
        let done = tokio::task::spawn_blocking(move || {
            cgroups.freeze(&name, timeout)?;
            cgroups.push_out(&name, limit, push_budget(timeout))
        })
        .await
        .map_err(EdgeError::task("pause"))
        .and_then(|r| r.map_err(EdgeError::from));
        match done {
            Ok(memory) => {
                let rec = {
                    let mut r = lock(&entry.record);
                    r.state = State::Paused;
                    r.paused_at_ms = Some(now_ms());
                    r.memory_freed_bytes = Some(memory.freed_bytes());
                    r.clone()
                };
                // Paused sandboxes do not count against the running quota.
                self.release(&entry, &rec);
                self.save(&rec);
                tracing::debug!(%id, freed = memory.freed_bytes(), "paused");
                Ok(PauseOutcome { record: entry.record(), changed: true, memory, duration_ms: ms(t0), suspended: false, disk_bytes: 0 })
            }
            Err(e) => {
                // Undo: the sandbox keeps running as if nothing happened.
                let _ = self.inner.cgroups.restore_memory_limit(id, limit);
                let _ = self.inner.cgroups.thaw(id);
                let _ = backend.after_thaw(id).await;
                self.set_state(&entry, State::Running, None);
                Err(e)
            }
        }
    }

    /// Resume with the sandbox's op lock held (also the first step of any
    /// request to a paused sandbox).
    pub(crate) async fn resume_locked(&self, entry: &Arc<Entry>) -> Result<ResumeOutcome, EdgeError> {
        let t0 = Instant::now();
        let rec = entry.record();
        let id = rec.id.clone();
        match rec.state {
            State::Running => return Ok(ResumeOutcome { record: rec, changed: false, duration_ms: 0.0 }),
            State::Paused | State::Pausing | State::Resuming => {}
            s if s.is_terminal() => return Err(EdgeError::Ended { id, state: s.as_str() }),
            s => return Err(EdgeError::NotRunning { id, state: s.as_str() }),
        }
        // A paused sandbox gave its reservation back; it needs one to run.
        if !entry.reserved.load(Ordering::Acquire) {
            self.inner.admission.reserve(&rec.spec.limits)?;
            entry.reserved.store(true, Ordering::Release);
        }
        // Not committed before the thaw: recovery decides from the freezer,
        // and the resume path must stay fast.
        self.set_state(entry, State::Resuming, None);
        if rec.suspended {
            return self.restore_locked(entry, &rec, t0).await;
        }
        let limit = self.inner.backends.cgroup_memory_bytes(&rec.spec);
        let cgroups = &self.inner.cgroups;
        let thawed = cgroups.restore_memory_limit(&id, limit).and_then(|_| cgroups.thaw(&id));
        if let Err(e) = thawed {
            self.set_state(entry, State::Paused, None);
            self.release(entry, &entry.record());
            return Err(e.into());
        }
        if let Err(e) = self.inner.backends.for_cleanup(rec.spec.backend).after_thaw(&id).await {
            let _ = cgroups.freeze(&id, self.inner.config.pause_timeout);
            self.set_state(entry, State::Paused, None);
            self.release(entry, &entry.record());
            return Err(e);
        }
        if entry.instance().is_none() {
            // Paused when the edge restarted: its agent is adopted now that
            // it runs again.
            if let Err(e) = self.adopt_thawed(entry, &rec).await {
                let _ = cgroups.freeze(&id, self.inner.config.pause_timeout);
                self.set_state(entry, State::Paused, None);
                self.release(entry, &entry.record());
                return Err(e);
            }
        }
        let rec = {
            let mut r = lock(&entry.record);
            r.state = State::Running;
            r.paused_at_ms = None;
            r.clone()
        };
        // Resuming is activity: the idle clock starts again now.
        drop(entry.begin());
        self.save(&rec);
        if rec.memory_freed_bytes.unwrap_or(0) > 0 && self.inner.swap.is_some() {
            // Its memory is in swap: start reading it back now, while it
            // runs, rather than one page fault at a time.
            let cgroups = self.inner.cgroups.clone();
            tokio::task::spawn_blocking(move || {
                let done = crate::pause::prefetch::prefetch(&cgroups.procs(&id));
                tracing::debug!(%id, ?done, "prefetch after resume");
            });
        }
        Ok(ResumeOutcome { record: entry.record(), changed: true, duration_ms: ms(t0) })
    }

    /// Re-attaches to the agent of a sandbox that was paused across an edge
    /// restart. Right after the thaw the agent has not yet seen that its
    /// old edge is gone and has no re-attach channel to offer: retry.
    async fn adopt_thawed(&self, entry: &Arc<Entry>, rec: &SandboxRecord) -> Result<(), EdgeError> {
        let pid = rec.pid.ok_or_else(|| EdgeError::NoProcess(rec.id.clone()))?;
        let deadline = Instant::now() + self.inner.config.resume_timeout;
        loop {
            match self.inner.backends.for_cleanup(rec.spec.backend).adopt(&rec.id, pid).await {
                Ok(instance) => {
                    let instance = Arc::new(instance);
                    *lock(&entry.instance) = Some(instance.clone());
                    self.watch_exit(entry.clone(), instance);
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(REATTACH_RETRY).await,
            }
        }
    }

    /// Sets a sandbox's state (and reason, if given) and saves the record.
    pub(crate) fn set_state(&self, entry: &Entry, state: State, reason: Option<&str>) -> SandboxRecord {
        let rec = {
            let mut r = lock(&entry.record);
            r.state = state;
            if let Some(reason) = reason {
                r.reason = Some(reason.to_string());
            }
            r.clone()
        };
        self.save(&rec);
        rec
    }
}

/// Time a push-out may take: none beyond one pass when the host has no
/// swap (only page cache can go then, and it goes in that pass).
pub(crate) fn push_budget(timeout: Duration) -> Duration {
    if crate::pause::swap::host_has_swap() {
        timeout
    } else {
        Duration::ZERO
    }
}

pub(crate) fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests;
