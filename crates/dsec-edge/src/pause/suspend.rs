//! Suspend to disk: the pause of a sandbox whose backend can save its
//! memory and device state and end its process (a microVM), and the
//! resume that starts a new process from that image.
//!
//! Both VM backends (microvm, vm) can. A suspended sandbox is `paused`
//! with `suspended` set: it has no process
//! and no admission reservation, only files. Any request resumes it, as it
//! does a frozen one (`agent_ops::running`).
//!
//! Ordering: `pausing` is durable before anything happens; the instance
//! is detached from the entry before its process is ended, so the exit
//! watcher treats that exit as intended (it only reaps); the record says
//! `paused` + `suspended` (durable) once the image is complete. A restarted
//! edge that finds a complete image and no process keeps the sandbox
//! suspended (`recover`).

use std::sync::Arc;
use std::time::Instant;

use crate::cgroup::PushOut;
use crate::edge::{lock, Edge, Entry};
use crate::error::EdgeError;
use crate::model::{now_ms, SandboxRecord, State};
use crate::pause::{ms, PauseOutcome, ResumeOutcome};

/// How a pause keeps a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PauseMode {
    /// Suspend when the backend can (microVMs, full VMs), else freeze.
    #[default]
    Auto,
    /// Freeze the processes and push their memory out (the VM's process
    /// stays, its vCPUs stopped).
    Freeze,
    /// Save memory and device state to disk and end the process.
    Suspend,
}

impl std::str::FromStr for PauseMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(PauseMode::Auto),
            "freeze" => Ok(PauseMode::Freeze),
            "suspend" => Ok(PauseMode::Suspend),
            other => Err(format!("pause mode must be auto, freeze or suspend, not {other:?}")),
        }
    }
}

impl Edge {
    /// Whether a pause in `mode` of this sandbox is a suspend (error if
    /// suspend is asked of a backend that cannot).
    pub(crate) fn suspends(&self, entry: &Entry, mode: PauseMode) -> Result<bool, EdgeError> {
        let rec = entry.record();
        let can = self.inner.backends.get(rec.spec.backend).map(|b| b.can_suspend()).unwrap_or(false);
        match mode {
            PauseMode::Freeze => Ok(false),
            PauseMode::Auto => Ok(can),
            PauseMode::Suspend if can => Ok(true),
            PauseMode::Suspend => Err(EdgeError::Invalid(format!(
                "sandbox {}: suspend to disk works for VMs (microvm, vm) only; pause a {:?} sandbox with mode freeze",
                rec.id, rec.spec.backend
            ))),
        }
    }

    /// Suspends a running sandbox (op lock held, state checked).
    pub(crate) async fn suspend_locked(&self, entry: &Arc<Entry>, t0: Instant) -> Result<PauseOutcome, EdgeError> {
        let rec = entry.record();
        let id = rec.id.clone();
        let backend = self.inner.backends.get(rec.spec.backend)?;
        let Some(inst) = entry.instance() else {
            return Err(EdgeError::NotRunning { id, state: rec.state.as_str() });
        };
        // The guest's dirty pages reach its disk first, so a snapshot of
        // the suspended sandbox's disk holds everything it wrote.
        if let Err(e) = self.guest_sync(entry).await {
            tracing::warn!(%id, error = %e, "guest sync before suspend failed");
        }
        self.set_state(entry, State::Pausing, None);
        if let Err(e) = self.inner.store.sync().await {
            self.set_state(entry, State::Running, None);
            return Err(EdgeError::Store(e));
        }
        // From here its process may end on purpose.
        *lock(&entry.instance) = None;
        match backend.suspend(&id, &inst.pidfd).await {
            Ok(out) => {
                let rec = {
                    let mut r = lock(&entry.record);
                    r.state = State::Paused;
                    r.suspended = true;
                    r.pid = None;
                    r.paused_at_ms = Some(now_ms());
                    r.memory_freed_bytes = Some(out.memory_before_bytes.saturating_sub(out.memory_after_bytes));
                    r.clone()
                };
                self.release(entry, &rec);
                self.save(&rec);
                let _ = self.inner.store.sync().await;
                tracing::debug!(%id, disk = out.disk_bytes, save_ms = out.save_ms, flush_ms = out.flush_ms, "suspended");
                Ok(PauseOutcome {
                    record: entry.record(),
                    changed: true,
                    memory: PushOut { before_bytes: out.memory_before_bytes, after_bytes: out.memory_after_bytes },
                    duration_ms: ms(t0),
                    suspended: true,
                    disk_bytes: out.disk_bytes,
                })
            }
            Err(e) => {
                // The backend continued the VM; if its process died
                // meanwhile, a fresh watcher settles it as failed.
                *lock(&entry.instance) = Some(inst.clone());
                self.set_state(entry, State::Running, None);
                if inst.has_exited() {
                    self.watch_exit(entry.clone(), inst);
                }
                Err(e)
            }
        }
    }

    /// Resumes a suspended sandbox: a new process from its image (op lock
    /// held, reservation taken, state `resuming`).
    pub(crate) async fn restore_locked(&self, entry: &Arc<Entry>, rec: &SandboxRecord, t0: Instant) -> Result<ResumeOutcome, EdgeError> {
        let restored = async {
            let backend = self.inner.backends.get(rec.spec.backend)?;
            // No process is in its cgroup: a thaw is harmless, and a
            // freezer left FROZEN would stop the new QEMU as it joins.
            self.inner.cgroups.thaw(&rec.id)?;
            let plan = self.plan_blocking(&rec.spec).await?;
            let plan_ms = ms(t0);
            let instance = backend.restore(&rec.id, &rec.spec, &plan).await?;
            tracing::info!(id = %rec.id, plan_ms, total_ms = ms(t0), "resumed from suspend");
            Ok::<_, EdgeError>(instance)
        };
        match restored.await {
            Ok(instance) => {
                // A new QEMU: its threads get the class again.
                self.apply_task_qos(rec, false);
                let instance = Arc::new(instance);
                *lock(&entry.instance) = Some(instance.clone());
                let rec = {
                    let mut r = lock(&entry.record);
                    r.state = State::Running;
                    r.suspended = false;
                    r.pid = Some(instance.pid);
                    r.paused_at_ms = None;
                    r.clone()
                };
                drop(entry.begin());
                self.save(&rec);
                self.watch_exit(entry.clone(), instance);
                Ok(ResumeOutcome { record: entry.record(), changed: true, duration_ms: ms(t0) })
            }
            Err(e) => {
                // The image is kept: the sandbox stays suspended.
                self.set_state(entry, State::Paused, None);
                self.release(entry, &entry.record());
                Err(e)
            }
        }
    }
}
