//! The edge's background duties: the TTL sweeper, and the reaper that
//! removes whatever belongs to no live sandbox (re-adoption after a restart
//! is in `recover`). Each loop is a task the edge owns and stops on shutdown.

use std::collections::HashSet;

use crate::edge::{lock, Edge};
use crate::model::{now_ms, Caller, State};

impl Edge {
    /// Removes cgroups (and their processes) that belong to no live sandbox,
    /// and unmounts layers no image uses. Returns what it removed.
    pub async fn reap_once(&self) -> ReapReport {
        let edge = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut report = ReapReport::default();
            let cgroups = &edge.inner.cgroups;
            // Cgroups first, live sandboxes second: a creation enters the
            // registry before it makes its cgroup, so every cgroup listed
            // here that belongs to a sandbox is in the set read after it.
            // (The other order would kill a sandbox created in between.)
            let names = cgroups.list();
            let mut live: HashSet<String> = {
                let reg = edge.inner.registry.read().unwrap_or_else(|p| p.into_inner());
                reg.iter().filter(|(_, e)| !e.state().is_terminal()).map(|(id, _)| id.clone()).collect()
            };
            // What backends hold for themselves (read after the list too).
            for b in edge.inner.backends.all() {
                live.extend(b.reserved());
            }
            for name in names {
                if live.contains(&name) {
                    continue;
                }
                report.processes += cgroups.procs(&name).len();
                // Which backend made it is unknown here; each removes
                // what it would have left (the cgroup, a VM's files).
                let mut removed = Ok(());
                for b in edge.inner.backends.all() {
                    removed = b.cleanup(&name);
                }
                match removed {
                    Ok(()) => report.cgroups += 1,
                    Err(e) => tracing::warn!(cgroup = %name, error = %e, "reaper could not remove cgroup"),
                }
            }
            for b in edge.inner.backends.all() {
                report.files += b.reap_files(&live);
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
        let mut watched = Vec::new();
        {
            let reg = self.inner.registry.read().unwrap_or_else(|p| p.into_inner());
            for (id, e) in reg.iter() {
                let r = lock(&e.record);
                match r.state {
                    // The hard lifetime counts whatever the activity, paused
                    // included; the idle TTL does not run while paused (a
                    // paused sandbox waits for its preempted trainer).
                    State::Running | State::Paused => {
                        if r.state == State::Running && r.reason.is_none() {
                            watched.push((id.clone(), r.spec.backend, e.clone()));
                        }
                        if r.spec.max_lifetime_s > 0 && now.saturating_sub(r.created_at_ms) > r.spec.max_lifetime_s * 1000 {
                            expired.push((id.clone(), format!("maximum lifetime of {} s reached", r.spec.max_lifetime_s)));
                        } else if r.state == State::Running && r.spec.idle_ttl_s > 0 {
                            if let Some(last) = e.idle_since_ms() {
                                if now.saturating_sub(last) > r.spec.idle_ttl_s * 1000 {
                                    expired.push((id.clone(), format!("idle for {} s (ttl_running_stop)", r.spec.idle_ttl_s)));
                                }
                            }
                        }
                    }
                    s if s.is_terminal() && now.saturating_sub(r.stopped_at_ms.unwrap_or(r.created_at_ms)) > retention_ms => {
                        forget.push(id.clone());
                    }
                    _ => {}
                }
            }
        }
        // Conditions a running sandbox's owner should see (once).
        for (id, kind, entry) in watched {
            let Ok(backend) = self.inner.backends.get(kind) else { continue };
            if let Some(note) = backend.condition(&id) {
                tracing::warn!(%id, %note, "sandbox condition");
                let rec = {
                    let mut r = lock(&entry.record);
                    r.reason = Some(note);
                    r.clone()
                };
                self.save(&rec);
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
                self.forget_log(&id);
            }
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReapReport {
    pub cgroups: usize,
    pub processes: usize,
    pub layers: usize,
    /// Host files of gone sandboxes (a VM's run directory and disk).
    pub files: usize,
}
