//! Re-adoption after an edge restart: the registry is rebuilt from the
//! database; live sandboxes are re-attached (or cleaned up and marked
//! failed when their agent is gone); paused ones stay frozen until resumed.

use std::sync::Arc;

use crate::edge::{lock, Edge, Entry};
use crate::model::{now_ms, Caller, SandboxRecord, State};
use crate::pause::push_budget;

impl Edge {
    /// Rebuilds the registry from the database: terminal records come back
    /// for inspection; live ones are re-adopted, or cleaned up and marked
    /// failed when their agent cannot be reached.
    pub(crate) async fn recover(&self, records: Vec<SandboxRecord>) {
        let retention_ms = self.inner.config.retention.as_millis() as u64;
        let lost = self.inner.rootfs.lost_layers();
        let mut resuming = Vec::new();
        for mut rec in records {
            if rec.node != self.inner.config.node {
                continue;
            }
            if rec.state.is_terminal() {
                if now_ms().saturating_sub(rec.stopped_at_ms.unwrap_or(rec.created_at_ms)) > retention_ms {
                    self.inner.store.delete(&rec.id);
                } else {
                    self.insert(Entry::new(rec, false));
                }
                continue;
            }
            if rec.state.is_paused() && self.keep_suspended(&mut rec) {
                continue;
            }
            // Its layers' data came through the previous process (paused
            // ones too: they would fail at their first read after resume).
            if lost.used_by(rec.pid, &self.inner.cgroups.procs(&rec.id)) {
                self.abandon(rec, crate::images::lost_layers::LOST_REASON).await;
                continue;
            }
            if rec.state.is_paused() {
                if self.recover_paused(&mut rec).await && rec.state == State::Resuming {
                    resuming.push(rec.id.clone());
                }
                continue;
            } else {
                // Not paused by its record, but frozen: a crash between the
                // thaw being due and its record. Thaw before the handshake,
                // which a frozen agent cannot answer.
                if self.inner.cgroups.frozen(&rec.id) == Some(true) {
                    let _ = self.inner.cgroups.restore_memory_limit(&rec.id, self.inner.backends.cgroup_memory_bytes(&rec.spec));
                    let _ = self.inner.cgroups.thaw(&rec.id);
                    // A VM's vCPUs were stopped before its freeze.
                    let _ = self.inner.backends.for_cleanup(rec.spec.backend).after_thaw(&rec.id).await;
                }
            }
            let adopted = match rec.pid {
                Some(pid) => match self.inner.backends.get(rec.spec.backend) {
                    Ok(backend) => backend.adopt(&rec.id, pid).await,
                    Err(e) => Err(e),
                },
                None => Err(crate::error::EdgeError::NoProcess(rec.id.clone())),
            };
            match adopted {
                Ok(instance) if self.inner.admission.reserve(&rec.spec.limits).is_ok() => {
                    tracing::info!(id = %rec.id, pid = instance.pid, "re-adopted sandbox");
                    let stopping = rec.state == State::Stopping;
                    rec.state = if stopping { State::Stopping } else { State::Running };
                    // Activity is counted in memory only; while the edge was
                    // down nobody could reach the sandbox, so its idle clock
                    // starts again now rather than at its last saved state.
                    rec.last_active_ms = now_ms();
                    let entry = Entry::new(rec.clone(), true);
                    let instance = Arc::new(instance);
                    *lock(&entry.instance) = Some(instance.clone());
                    self.insert(entry.clone());
                    self.watch_exit(entry, instance.clone());
                    if stopping {
                        let _ = instance.kill();
                    }
                }
                outcome => {
                    let why = match outcome {
                        Err(e) => e.to_string(),
                        Ok(_) => "no capacity left to re-admit it".to_string(),
                    };
                    self.abandon(rec, &why).await;
                }
            }
        }
        let _ = self.inner.store.sync().await;
        // A resume the crash interrupted: finish it, as its caller asked.
        for id in resuming {
            let edge = self.clone();
            tokio::spawn(async move {
                if let Err(e) = edge.resume(&Caller::admin(), &id).await {
                    tracing::warn!(%id, error = %e, "could not finish an interrupted resume; the sandbox stays paused");
                }
            });
        }
    }

    /// A sandbox whose record says pausing, paused or resuming: its agent
    /// is (or may be) frozen, so it is not contacted now. It is kept frozen
    /// with its memory limit restored (a crash may have come in the middle
    /// of a push-out); a half-done pause is finished. Its agent is adopted
    /// when it resumes. False if its agent is gone (then it was abandoned).
    async fn recover_paused(&self, rec: &mut SandboxRecord) -> bool {
        let cgroups = self.inner.cgroups.clone();
        let alive = rec.pid.is_some_and(|pid| cgroups.contains(&rec.id, pid));
        if !alive {
            self.abandon(rec.clone(), "its agent is gone").await;
            return false;
        }
        let (name, limit, finish_push) = (rec.id.clone(), self.inner.backends.cgroup_memory_bytes(&rec.spec), rec.state == State::Pausing);
        let timeout = self.inner.config.pause_timeout;
        let kept = tokio::task::spawn_blocking(move || -> Result<u64, crate::cgroup::CgroupError> {
            cgroups.freeze(&name, timeout)?;
            if finish_push {
                return Ok(cgroups.push_out(&name, limit, push_budget(timeout))?.freed_bytes());
            }
            cgroups.restore_memory_limit(&name, limit)?;
            Ok(0)
        })
        .await;
        match kept {
            Ok(Ok(freed)) => {
                if rec.state == State::Pausing {
                    rec.state = State::Paused;
                    rec.paused_at_ms = Some(now_ms());
                    rec.memory_freed_bytes = Some(freed);
                }
                tracing::info!(id = %rec.id, state = rec.state.as_str(), "kept paused sandbox frozen");
                self.save(rec);
                // No reservation: paused sandboxes do not count.
                self.insert(Entry::new(rec.clone(), false));
                true
            }
            other => {
                let why = match other {
                    Ok(Err(e)) => e.to_string(),
                    _ => "the freeze task failed".to_string(),
                };
                self.abandon(rec.clone(), &why).await;
                false
            }
        }
    }

    /// A paused sandbox with a complete suspend image and no live process
    /// (suspended, or cut by the crash between image and record, or in a
    /// restore the crash interrupted) stays suspended. False if it is not
    /// that case.
    fn keep_suspended(&self, rec: &mut SandboxRecord) -> bool {
        let backend = self.inner.backends.for_cleanup(rec.spec.backend);
        let alive = rec.pid.is_some_and(|pid| self.inner.cgroups.contains(&rec.id, pid));
        if alive || !backend.has_suspend_image(&rec.id) {
            return false;
        }
        // A half-started restore's process, if any. kill_all leaves the
        // freezer FROZEN (it expects a removal next): thaw, or the restore's
        // QEMU would freeze as it joins.
        self.inner.cgroups.kill_all(&rec.id);
        let _ = self.inner.cgroups.thaw(&rec.id);
        rec.state = State::Paused;
        rec.suspended = true;
        rec.pid = None;
        rec.paused_at_ms.get_or_insert(now_ms());
        tracing::info!(id = %rec.id, "kept suspended sandbox");
        self.save(rec);
        self.insert(Entry::new(rec.clone(), false));
        true
    }

    /// Cleans up a sandbox that cannot be re-adopted and marks it failed.
    async fn abandon(&self, mut rec: SandboxRecord, why: &str) {
        tracing::warn!(id = %rec.id, %why, "could not re-adopt sandbox; removing it");
        let (id, kind) = (rec.id.clone(), rec.spec.backend);
        let edge = self.clone();
        let _ = tokio::task::spawn_blocking(move || edge.inner.backends.for_cleanup(kind).cleanup(&id)).await;
        rec.state = State::Failed;
        rec.reason = Some(format!("the edge restarted and could not re-adopt the sandbox: {why}"));
        rec.stopped_at_ms = Some(now_ms());
        rec.pid = None;
        self.save(&rec);
        self.insert(Entry::new(rec, false));
    }

    fn insert(&self, entry: Arc<Entry>) {
        let id = lock(&entry.record).id.clone();
        self.inner.registry.write().unwrap_or_else(|p| p.into_inner()).insert(id, entry);
    }
}
