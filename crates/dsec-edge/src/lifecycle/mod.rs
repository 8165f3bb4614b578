//! Create, stop, delete, inspect: the sandbox state machine
//! (creating -> running -> stopping -> stopped, or failed with a reason),
//! each transition bounded by a timeout.

pub mod admission;
pub(crate) mod background;
pub(crate) mod create_queue;
pub(crate) mod idempotency;
pub(crate) mod lease;
pub(crate) mod node_lock;
/// The made-ahead pools (network namespaces here, v1 cgroup directories in
/// `dsec-cgroup`) share one filler.
pub(crate) use dsec_cgroup::prewarm;
pub(crate) mod qos;
pub(crate) mod recover;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::io::unix::AsyncFd;

use crate::backends::instance::Instance;
use crate::edge::{lock, Edge, Entry};
use crate::error::EdgeError;
use crate::ids::new_sandbox_id;
use crate::lifecycle::create_queue::Ticket;
use crate::model::{now_ms, Caller, ListFilter, SandboxRecord, State};
use crate::spec::{resolve, SandboxRequest};

impl Edge {
    /// Creates a sandbox and returns it running, or fails with the reason
    /// (the failed record stays listable).
    pub async fn create(&self, caller: &Caller, req: SandboxRequest) -> Result<SandboxRecord, EdgeError> {
        // Run to completion even if the caller goes away (an HTTP client
        // that disconnects drops this future): a creation abandoned half-way
        // would leave an agent without an edge. The sandbox then exists, is
        // listed, and its idle TTL reclaims it if nobody comes back for it.
        let edge = self.clone();
        let caller = caller.clone();
        let out = tokio::spawn(async move { edge.create_to_completion(&caller, req).await }).await.map_err(EdgeError::task("creation"))?;
        match &out {
            Ok(rec) => self.inner.counters.created(rec.spec.backend, rec.create_ms.unwrap_or(0.0)),
            Err(_) => self.inner.counters.creation_failed(),
        }
        out
    }

    async fn create_to_completion(&self, caller: &Caller, req: SandboxRequest) -> Result<SandboxRecord, EdgeError> {
        let t0 = Instant::now();
        let inner = &self.inner;
        let (mut req, network_rules) = crate::ops::network::take_rules(self, req)?;
        let snapshot = self.apply_snapshot(caller, &mut req)?;
        // A backend may size the disk by the image (a full VM may write as
        // much as its image's disk holds).
        if let (Some(kind), None) = (req.backend, req.disk_mb) {
            if let Ok(backend) = inner.backends.get(kind) {
                req.disk_mb = backend.default_disk_mb(&req.image);
            }
        }
        let user_given = req.init_user.is_some();
        let mut spec = resolve(req, &inner.config.policy)?;
        spec.snapshot = snapshot;
        if let Some(rules) = network_rules {
            spec.network_rules = rules;
        }
        // Refused before anything is reserved when this node cannot run it.
        inner.backends.get(spec.backend)?;
        let mut plan = self.plan_blocking(&spec).await?;
        // As in Docker, the image's USER is the default user of its
        // sandboxes (a creation may name another).
        if !user_given && !plan.user.is_empty() {
            spec.init_user = plan.user.clone();
        }
        plan.volumes = self.resolve_volumes(&caller.tenant, &spec)?;
        let t_plan = t0.elapsed();
        inner.admission.reserve(&spec.limits)?;

        let now = now_ms();
        let id = new_sandbox_id(&inner.config.node);
        let job = spec.job.clone().unwrap_or_default();
        let rec = SandboxRecord {
            id: id.clone(),
            tenant: caller.tenant.clone(),
            node: inner.config.node.clone(),
            spec,
            state: State::Queued,
            reason: None,
            created_at_ms: now,
            last_active_ms: now,
            stopped_at_ms: None,
            create_ms: None,
            pid: None,
            paused_at_ms: None,
            memory_freed_bytes: None,
            suspended: false,
            queue_position: None,
        };
        let entry = Entry::new(rec.clone(), true);
        let ticket = match inner.create_queue.enter(&job, &id) {
            Ok(t) => t,
            Err(e) => {
                self.release(&entry, &rec);
                return Err(e);
            }
        };
        // Listed (as `queued`, with its position) while it waits; not
        // stored: a queued creation has nothing on the host yet, and a crash
        // ends the caller's request with it.
        inner.registry.write().unwrap_or_else(|p| p.into_inner()).insert(id.clone(), entry.clone());
        let _slot = match ticket {
            Ticket::Go(slot) => slot,
            Ticket::Wait(wait) => {
                self.publish(&self.entry_record(&entry));
                match wait.await {
                    Ok(()) => inner.create_queue.granted(),
                    // Stopped while queued: stop settled the record.
                    Err(_) => return Err(stopped_while_creating(&entry, id)),
                }
            }
        };
        let _op = entry.op_lock.lock().await;
        if entry.state() != State::Queued {
            // Stopped between the hand-off and here.
            return Err(stopped_while_creating(&entry, id));
        }
        let rec = {
            let mut r = lock(&entry.record);
            r.state = State::Creating;
            r.clone()
        };
        // The record is durable before any process exists, so a crash at
        // any later point leaves something the next edge will clean up. The
        // commit runs while the backend makes the cgroup; the backend waits
        // for it before it starts a process.
        self.save(&rec);
        let durable = inner.store.sync_request();

        let backend = inner.backends.get(rec.spec.backend)?;
        let t_pre = t0.elapsed();
        match backend.start(&id, &rec.spec, &plan, Box::pin(durable)).await {
            Ok(instance) => {
                // Before any command can run: what they fork inherits it.
                self.apply_task_qos(&rec, true);
                let t_started = t0.elapsed();
                let instance = Arc::new(instance);
                let rec = {
                    let mut r = lock(&entry.record);
                    r.state = State::Running;
                    r.pid = Some(instance.pid);
                    r.create_ms = Some(t0.elapsed().as_secs_f64() * 1000.0);
                    r.clone()
                };
                *lock(&entry.instance) = Some(instance.clone());
                self.save(&rec);
                self.watch_exit(entry.clone(), instance);
                tracing::debug!(target: "dsec_edge::create_phases", plan = t_plan.as_micros() as u64, pre = t_pre.as_micros() as u64, started = t_started.as_micros() as u64, done = t0.elapsed().as_micros() as u64, "create phases");
                Ok(rec)
            }
            Err(e) => match entry.stop_asked() {
                // A stop cut the start short (`lock_for_stop`), or came as
                // it failed anyway: the sandbox was stopped, not broken.
                Some(reason) => {
                    self.settle_without_process(&entry, State::Stopped, &reason);
                    Err(EdgeError::StoppedWhileCreating { id, reason })
                }
                None => {
                    self.settle_without_process(&entry, State::Failed, &format!("creation failed: {e}"));
                    Err(e)
                }
            },
        }
    }

    /// A record as callers see it: with its queue position while queued.
    pub(crate) fn entry_record(&self, entry: &Entry) -> SandboxRecord {
        let mut r = entry.record();
        if r.state == State::Queued {
            r.queue_position = self.inner.create_queue.position(r.spec.job.as_deref().unwrap_or_default(), &r.id);
        }
        r
    }

    /// Settles a sandbox whose start left no process (failed, or stopped
    /// while it started) and frees its reservation.
    fn settle_without_process(&self, entry: &Arc<Entry>, state: State, reason: &str) {
        let rec = {
            let mut r = lock(&entry.record);
            r.state = state;
            r.reason = Some(reason.to_string());
            r.stopped_at_ms = Some(now_ms());
            r.pid = None;
            r.clone()
        };
        self.release(entry, &rec);
        self.save(&rec);
        let _ = entry.exited.send(true);
    }

    pub(crate) fn release(&self, entry: &Entry, rec: &SandboxRecord) {
        if entry.reserved.swap(false, Ordering::AcqRel) {
            self.inner.admission.release(&rec.spec.limits);
        }
    }

    /// Waits for the agent to exit (for whatever reason), then cleans up and
    /// settles the final state. This is the one place a sandbox's host
    /// resources are freed, so stop, TTL expiry, crashes and OOM all end the
    /// same way.
    pub(crate) fn watch_exit(&self, entry: Arc<Entry>, instance: Arc<Instance>) {
        // Every running agent reaches this point once per connection, so
        // its audit events are counted from here on (see metrics.rs).
        instance.agent.on_audit(self.inner.counters.audit_sink());
        let edge = self.clone();
        tokio::spawn(async move {
            let Ok(fd) = instance.pidfd.try_clone() else {
                tracing::error!("cannot watch a sandbox agent: pidfd dup failed");
                return;
            };
            // SAFETY: `fd` is an owned pidfd that the AsyncFd owns (and so
            // keeps open) for as long as it is registered.
            match unsafe { AsyncFd::register(fd) } {
                Ok(afd) => {
                    let _ = afd.readable().await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot poll pidfd; falling back to the channel");
                    instance.agent.closed().await;
                }
            }
            if !entry.instance().is_some_and(|current| Arc::ptr_eq(&current, &instance)) {
                // Detached before it ended (a suspend to disk ended it on
                // purpose): the sandbox lives on without this process.
                let inst = instance.clone();
                let _ = tokio::task::spawn_blocking(move || inst.reap()).await;
                return;
            }
            let (id, kind) = {
                let r = lock(&entry.record);
                (r.id.clone(), r.spec.backend)
            };
            let inst = instance.clone();
            let backend_edge = edge.clone();
            let cleanup_id = id.clone();
            let (status, oom, cleanup) = tokio::task::spawn_blocking(move || {
                let status = inst.reap();
                let oom = backend_edge.inner.cgroups.oom_kills(&cleanup_id);
                let cleanup = backend_edge.inner.backends.for_cleanup(kind).cleanup(&cleanup_id);
                (status, oom, cleanup)
            })
            .await
            .unwrap_or((None, 0, Ok(())));
            if let Err(e) = cleanup {
                tracing::warn!(%id, error = %e, "cleanup after exit incomplete; the reaper will retry");
            }
            *lock(&entry.instance) = None;
            let stop_asked = entry.stop_asked();
            let rec = {
                let mut r = lock(&entry.record);
                match r.state {
                    // Killed by a stop that found it still starting
                    // (`lock_for_stop`) as the start completed.
                    State::Running if stop_asked.is_some() => {
                        r.state = State::Stopped;
                        r.reason = stop_asked;
                    }
                    State::Queued | State::Creating | State::Running | State::Pausing | State::Paused | State::Resuming => {
                        r.state = State::Failed;
                        r.reason = Some(describe_exit(status, oom));
                    }
                    State::Stopping => r.state = State::Stopped,
                    State::Stopped | State::Failed => {}
                }
                r.pid = None;
                r.stopped_at_ms.get_or_insert(now_ms());
                r.clone()
            };
            edge.release(&entry, &rec);
            edge.save(&rec);
            let _ = entry.exited.send(true);
        });
    }

    pub fn get(&self, caller: &Caller, id: &str) -> Result<SandboxRecord, EdgeError> {
        let entry = self.entry(caller, id)?;
        Ok(self.entry_record(&entry))
    }

    pub fn list(&self, caller: &Caller, filter: &ListFilter) -> Vec<SandboxRecord> {
        let reg = self.inner.registry.read().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<SandboxRecord> =
            reg.values().map(|e| self.entry_record(e)).filter(|r| caller.may_see(&r.tenant) && filter.matches(r)).collect();
        out.sort_by(|a, b| a.created_at_ms.cmp(&b.created_at_ms).then_with(|| a.id.cmp(&b.id)));
        out
    }

    /// Stops a sandbox: kills its processes and frees its resources. The
    /// record stays (state `stopped`) for inspection. Stopping a stopped
    /// sandbox is a no-op.
    pub async fn stop(&self, caller: &Caller, id: &str, reason: &str) -> Result<SandboxRecord, EdgeError> {
        // Like create: finish even if the caller goes away.
        let (edge, caller, id, reason) = (self.clone(), caller.clone(), id.to_string(), reason.to_string());
        tokio::spawn(async move { edge.stop_to_completion(&caller, &id, &reason).await }).await.map_err(EdgeError::task("stop"))?
    }

    async fn stop_to_completion(&self, caller: &Caller, id: &str, reason: &str) -> Result<SandboxRecord, EdgeError> {
        let entry = self.entry(caller, id)?;
        let _op = self.lock_for_stop(&entry, reason).await;
        let before = entry.state();
        if before == State::Queued {
            return Ok(self.stop_queued(&entry, reason));
        }
        let rec = {
            let mut r = lock(&entry.record);
            if r.state.is_terminal() {
                return Ok(r.clone());
            }
            if r.state != State::Stopping {
                r.state = State::Stopping;
                r.reason = Some(reason.to_string());
            }
            r.clone()
        };
        self.save(&rec);
        let mut exited = entry.exited.subscribe();
        match entry.instance() {
            Some(instance) => {
                // SIGKILL to PID 1 of the sandbox's pid namespace: the kernel
                // kills every other process in it before PID 1 is gone.
                let _ = instance.kill();
                // A frozen task on cgroup v1 acts on SIGKILL only once
                // thawed.
                if before.is_paused() {
                    let _ = self.inner.cgroups.thaw(id);
                }
            }
            None => {
                // No agent is known (creation failed half-way, adoption
                // found none, or it was paused when the edge restarted and
                // is adopted only on resume): kill whatever its cgroup
                // still holds, wait for it to be gone, remove the cgroup,
                // then settle directly.
                let edge = self.clone();
                let cg_id = id.to_string();
                let kind = lock(&entry.record).spec.backend;
                let cleaned = tokio::task::spawn_blocking(move || edge.inner.backends.for_cleanup(kind).cleanup(&cg_id)).await;
                if let Ok(Err(e)) = cleaned {
                    tracing::warn!(%id, error = %e, "cleanup after stop incomplete; the reaper will retry");
                }
                let r = {
                    let mut r = lock(&entry.record);
                    r.state = State::Stopped;
                    r.stopped_at_ms = Some(now_ms());
                    r.clone()
                };
                self.release(&entry, &r);
                self.save(&r);
                let _ = entry.exited.send(true);
            }
        }
        let wait = exited.wait_for(|done| *done);
        if tokio::time::timeout(self.inner.config.stop_timeout, wait).await.is_err() {
            let r = {
                let mut r = lock(&entry.record);
                r.state = State::Failed;
                r.reason = Some(format!("did not stop within {:?}; the reaper will remove it", self.inner.config.stop_timeout));
                r.clone()
            };
            self.save(&r);
            return Err(EdgeError::Timeout(format!("stopping {id}")));
        }
        Ok(entry.record())
    }

    /// Stops every sandbox still queued or being created, without waiting:
    /// the node is shutting down, and their creations end at once (as
    /// `stopped`, with `reason`) instead of holding the shutdown for a
    /// VM's boot. Sandboxes already running are left to
    /// [`Edge::shutdown`].
    pub fn stop_creations(&self, reason: &str) {
        let ids: Vec<String> = {
            let reg = self.inner.registry.read().unwrap_or_else(|p| p.into_inner());
            reg.iter().filter(|(_, e)| matches!(e.state(), State::Queued | State::Creating)).map(|(id, _)| id.clone()).collect()
        };
        for id in ids {
            let (edge, reason) = (self.clone(), reason.to_string());
            tokio::spawn(async move {
                if let Err(e) = edge.stop(&Caller::admin(), &id, &reason).await {
                    tracing::warn!(%id, error = %e, "stopping a creation at shutdown");
                }
            });
        }
    }

    /// Takes the sandbox's operation lock for a stop. A creation holds it
    /// until its sandbox runs, and a VM's boot can take a minute under
    /// emulation: while a creation holds it, the stop is recorded on the
    /// entry and the backend kills what the start has spawned (again every
    /// [`ABORT_START_EVERY`], since a start may spawn again), so that the
    /// creation fails at once and settles the sandbox as stopped. Backends
    /// whose start is short are waited for.
    async fn lock_for_stop<'e>(&self, entry: &'e Arc<Entry>, reason: &str) -> tokio::sync::MutexGuard<'e, ()> {
        let mut op = std::pin::pin!(entry.op_lock.lock());
        let mut tick = tokio::time::interval(ABORT_START_EVERY);
        loop {
            tokio::select! {
                biased;
                guard = &mut op => return guard,
                _ = tick.tick() => {}
            }
            let (id, kind, creating) = {
                let r = lock(&entry.record);
                (r.id.clone(), r.spec.backend, r.state == State::Creating)
            };
            if !creating {
                continue;
            }
            lock(&entry.stop_asked).get_or_insert_with(|| reason.to_string());
            let edge = self.clone();
            let cut = tokio::task::spawn_blocking(move || edge.inner.backends.for_cleanup(kind).abort_start(&id)).await.unwrap_or(false);
            if !cut {
                // Nothing was killed: the creation ends as it would have.
                *lock(&entry.stop_asked) = None;
                return op.await;
            }
        }
    }

    /// A queued creation has nothing on the host yet: take it out of the
    /// queue and settle it. (If it was handed a slot just now, its creation
    /// sees the new state and gives up.)
    fn stop_queued(&self, entry: &Arc<Entry>, reason: &str) -> SandboxRecord {
        let (id, job) = {
            let r = lock(&entry.record);
            (r.id.clone(), r.spec.job.clone().unwrap_or_default())
        };
        self.inner.create_queue.cancel(&job, &id);
        let rec = {
            let mut r = lock(&entry.record);
            r.state = State::Stopped;
            r.reason = Some(reason.to_string());
            r.stopped_at_ms = Some(now_ms());
            r.clone()
        };
        self.release(entry, &rec);
        self.publish(&rec);
        let _ = entry.exited.send(true);
        rec
    }

    /// Stops the sandbox if needed and forgets it.
    pub async fn delete(&self, caller: &Caller, id: &str) -> Result<(), EdgeError> {
        let (edge, caller, id) = (self.clone(), caller.clone(), id.to_string());
        tokio::spawn(async move {
            edge.stop_to_completion(&caller, &id, "deleted").await?;
            edge.inner.registry.write().unwrap_or_else(|p| p.into_inner()).remove(&id);
            edge.inner.store.delete(&id);
            edge.forget_log(&id);
            Ok(())
        })
        .await
        .map_err(EdgeError::task("delete"))?
    }
}

fn describe_exit(status: Option<i32>, oom_kills: u64) -> String {
    let base = match status {
        Some(s) => format!("the sandbox's init (guest agent) exited unexpectedly (status {s})"),
        None => "the sandbox's init (guest agent) exited unexpectedly".to_string(),
    };
    if oom_kills > 0 {
        format!("{base}; the kernel OOM-killed {oom_kills} process(es): memory limit reached")
    } else {
        base
    }
}

impl Edge {
    /// The layers `spec` runs on, resolved on a blocking thread: resolving
    /// an image may fetch it from a shared store (seconds, behind a lock),
    /// which must not stall the runtime's few workers.
    pub(crate) async fn plan_blocking(&self, spec: &crate::model::SandboxSpec) -> Result<crate::images::RootfsPlan, EdgeError> {
        let rootfs = self.inner.rootfs.clone();
        let backend = self.inner.backends.handle(spec.backend)?;
        let spec = spec.clone();
        let plan = move || backend.plan(rootfs.as_ref(), &spec);
        tokio::task::spawn_blocking(plan).await.map_err(EdgeError::task("layer resolution"))?
    }
}

/// How often a stop kills again what a creation it cuts short has spawned.
const ABORT_START_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// The answer to a creation that a stop settled before it ran.
fn stopped_while_creating(entry: &Entry, id: String) -> EdgeError {
    let reason = entry.record().reason.unwrap_or_else(|| "stopped".into());
    EdgeError::StoppedWhileCreating { id, reason }
}

#[cfg(test)]
mod tests;
