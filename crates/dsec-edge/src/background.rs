//! The edge's background duties: re-adopting sandboxes after a restart, the
//! TTL sweeper, and the reaper that removes whatever belongs to no live
//! sandbox. Each loop is a task the edge owns and stops on shutdown.

use std::collections::HashSet;
use std::sync::Arc;

use crate::edge::{lock, Edge, Entry};
use crate::model::{now_ms, Caller, SandboxRecord, State};

impl Edge {
    /// Rebuilds the registry from the database: terminal records come back
    /// for inspection; live ones are re-adopted, or cleaned up and marked
    /// failed when their agent cannot be reached.
    pub(crate) async fn recover(&self, records: Vec<SandboxRecord>) {
        let retention_ms = self.inner.config.retention.as_millis() as u64;
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
            let adopted = match rec.pid {
                Some(pid) => self.inner.container.adopt(&rec.id, pid).await,
                None => Err(crate::error::EdgeError::Internal("no agent was recorded".into())),
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
                        let _ = crate::container::spawn::pidfd_kill(&instance.pidfd, libc::SIGKILL);
                    }
                }
                outcome => {
                    let why = match outcome {
                        Err(e) => e.to_string(),
                        Ok(_) => "no capacity left to re-admit it".to_string(),
                    };
                    tracing::warn!(id = %rec.id, %why, "could not re-adopt sandbox; removing it");
                    let id = rec.id.clone();
                    let edge = self.clone();
                    let _ = tokio::task::spawn_blocking(move || edge.inner.container.cleanup(&id)).await;
                    rec.state = State::Failed;
                    rec.reason = Some(format!("the edge restarted and could not re-adopt the sandbox: {why}"));
                    rec.stopped_at_ms = Some(now_ms());
                    rec.pid = None;
                    self.inner.store.upsert(&rec);
                    self.insert(Entry::new(rec, false));
                }
            }
        }
        let _ = self.inner.store.sync().await;
    }

    fn insert(&self, entry: Arc<Entry>) {
        let id = lock(&entry.record).id.clone();
        self.inner.registry.write().unwrap_or_else(|p| p.into_inner()).insert(id, entry);
    }

    /// Removes cgroups (and their processes) that belong to no live sandbox,
    /// and unmounts layers no image uses. Returns what it removed.
    pub async fn reap_once(&self) -> ReapReport {
        let edge = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut report = ReapReport::default();
            let cgroups = edge.inner.container.cgroups();
            // Cgroups first, live sandboxes second: a creation enters the
            // registry before it makes its cgroup, so every cgroup listed
            // here that belongs to a sandbox is in the set read after it.
            // (The other order would kill a sandbox created in between.)
            let names = cgroups.list();
            let live: HashSet<String> = {
                let reg = edge.inner.registry.read().unwrap_or_else(|p| p.into_inner());
                reg.iter().filter(|(_, e)| !e.state().is_terminal()).map(|(id, _)| id.clone()).collect()
            };
            for name in names {
                if live.contains(&name) {
                    continue;
                }
                report.processes += cgroups.procs(&name).len();
                match edge.inner.container.cleanup(&name) {
                    Ok(()) => report.cgroups += 1,
                    Err(e) => tracing::warn!(cgroup = %name, error = %e, "reaper could not remove cgroup"),
                }
            }
            report.layers = edge.inner.rootfs.reap();
            if report != ReapReport::default() {
                tracing::info!(?report, "reaper removed leftovers");
            }
            report
        })
        .await
        .unwrap_or_default()
    }

    pub(crate) fn spawn_background_loops(&self) {
        let edge = self.clone();
        let mut stop = self.inner.shutdown.subscribe();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(edge.inner.config.sweep_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let stopping = tokio::select! {
                    _ = tick.tick() => false,
                    _ = stop.wait_for(|s| *s) => true,
                };
                if stopping {
                    break;
                }
                edge.sweep();
            }
        });
        let edge = self.clone();
        let mut stop = self.inner.shutdown.subscribe();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(edge.inner.config.reap_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first tick fires at once; start() just reaped
            loop {
                let stopping = tokio::select! {
                    _ = tick.tick() => false,
                    _ = stop.wait_for(|s| *s) => true,
                };
                if stopping {
                    break;
                }
                edge.reap_once().await;
            }
        });
    }

    /// Stops sandboxes past their idle TTL or hard lifetime, and forgets
    /// terminal records past retention.
    fn sweep(&self) {
        let now = now_ms();
        let retention_ms = self.inner.config.retention.as_millis() as u64;
        let mut expired: Vec<(String, String)> = Vec::new();
        let mut forget: Vec<String> = Vec::new();
        {
            let reg = self.inner.registry.read().unwrap_or_else(|p| p.into_inner());
            for (id, e) in reg.iter() {
                let r = lock(&e.record);
                match r.state {
                    State::Running => {
                        if r.spec.max_lifetime_s > 0 && now.saturating_sub(r.created_at_ms) > r.spec.max_lifetime_s * 1000 {
                            expired.push((id.clone(), format!("maximum lifetime of {} s reached", r.spec.max_lifetime_s)));
                        } else if r.spec.idle_ttl_s > 0 {
                            if let Some(last) = e.idle_since_ms() {
                                if now.saturating_sub(last) > r.spec.idle_ttl_s * 1000 {
                                    expired.push((id.clone(), format!("idle for {} s (ttl_running_stop)", r.spec.idle_ttl_s)));
                                }
                            }
                        }
                    }
                    s if s.is_terminal() => {
                        if now.saturating_sub(r.stopped_at_ms.unwrap_or(r.created_at_ms)) > retention_ms {
                            forget.push(id.clone());
                        }
                    }
                    _ => {}
                }
            }
        }
        for (id, reason) in expired {
            let edge = self.clone();
            tokio::spawn(async move {
                tracing::info!(%id, %reason, "stopping sandbox");
                let _ = edge.stop(&Caller::admin(), &id, &reason).await;
            });
        }
        if !forget.is_empty() {
            let mut reg = self.inner.registry.write().unwrap_or_else(|p| p.into_inner());
            for id in forget {
                reg.remove(&id);
                self.inner.store.delete(&id);
            }
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReapReport {
    pub cgroups: usize,
    pub processes: usize,
    pub layers: usize,
}
