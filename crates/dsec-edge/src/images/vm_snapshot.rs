//! Snapshots of VM disks (`Edge::snapshot`; microVMs and full VMs alike)
//! and sandboxes started from them (`create` with a snapshot name): the
//! edge's side of `backends::snapshot` and the backends' `DiskSnapshots`. A snapshot may be taken of a
//! running VM (its guest syncs, its vCPUs stop for the copy) or of a
//! suspended one (no process needed), so a parent need not be kept
//! running to fork from it.
//! Idempotency keys (scope `snapshot`) make a retried snapshot return the
//! first one.

use std::time::Duration;

use dsec_agent_proto::{Command, ExecSpec, Stdin};

use crate::backends::snapshot::validate_name;
use crate::backends::{MemorySnapshots, SnapshotDir, SnapshotMemory, SnapshotMeta};
use crate::edge::Edge;
use crate::error::EdgeError;
use crate::model::{now_ms, BackendKind, Caller, State};
use crate::spec::SandboxRequest;

/// Scope of snapshot keys in the journal.
pub const SCOPE_SNAPSHOT: &str = "snapshot";
/// A guest `sync` before a snapshot or suspend may take this long.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// What one snapshot did.
#[derive(Debug, Clone)]
pub struct SnapshotOutcome {
    pub snapshot: SnapshotMeta,
    /// False if an earlier request with the same idempotency key made it.
    pub created: bool,
    /// How long the VM's vCPUs were stopped for the copy (0 if suspended).
    pub frozen_ms: f64,
}

impl Edge {
    /// The node's snapshots (one directory, whichever VM backend runs here).
    fn snapshot_dir(&self) -> Result<&SnapshotDir, EdgeError> {
        self.inner.backends.snapshot_dir()
    }

    /// The memory snapshots of microVMs, where this node runs them.
    fn memory_snapshots(&self) -> Result<&dyn MemorySnapshots, EdgeError> {
        self.inner
            .backends
            .disk_snapshots(BackendKind::Microvm, "")?
            .memory()
            .ok_or_else(|| EdgeError::UnsupportedBackend("memory snapshots are of microVMs, and this node's microVMs keep none".into()))
    }

    /// Snapshots the writable disk of microVM `id` as `name` (unique per
    /// tenant). With `key`, a retry returns the first request's snapshot.
    pub async fn snapshot(&self, caller: &Caller, id: &str, name: &str, key: Option<&str>) -> Result<SnapshotOutcome, EdgeError> {
        self.snapshot_with(caller, id, name, key, false).await
    }

    /// `snapshot`; with `memory`, a memory snapshot of a microVM: the VM
    /// is suspended (if it is not already; it resumes on its next request)
    /// and its RAM and device state are kept with the disk, so sandboxes
    /// started from the snapshot continue its processes.
    pub async fn snapshot_with(
        &self,
        caller: &Caller,
        id: &str,
        name: &str,
        key: Option<&str>,
        memory: bool,
    ) -> Result<SnapshotOutcome, EdgeError> {
        validate_name(name)?;
        let (edge, caller, id, name, key) = (self.clone(), caller.clone(), id.to_string(), name.to_string(), key.map(str::to_string));
        // Finish even if the caller goes away (a retry must find it).
        tokio::spawn(async move { edge.snapshot_keyed(&caller, &id, &name, key.as_deref(), memory).await })
            .await
            .map_err(EdgeError::task("snapshot"))?
    }

    async fn snapshot_keyed(
        &self,
        caller: &Caller,
        id: &str,
        name: &str,
        key: Option<&str>,
        memory: bool,
    ) -> Result<SnapshotOutcome, EdgeError> {
        let Some(key) = key else { return self.snapshot_now(caller, id, name, memory).await };
        let work = async {
            let out = self.snapshot_now(caller, id, name, memory).await?;
            let snap = out.snapshot.id.clone();
            Ok((out, snap))
        };
        let replay = |snap: &str| {
            let snapshot = self.snapshot_dir()?.get(snap).ok_or_else(|| EdgeError::SnapshotNotFound(name.to_string()))?;
            Ok(SnapshotOutcome { snapshot, created: false, frozen_ms: 0.0 })
        };
        let what = if memory { format!("{id}\n{name}\nmemory") } else { format!("{id}\n{name}") };
        self.once(&caller.tenant, SCOPE_SNAPSHOT, key, &what, work, replay).await
    }

    async fn snapshot_now(&self, caller: &Caller, id: &str, name: &str, memory: bool) -> Result<SnapshotOutcome, EdgeError> {
        let snaps = self.snapshot_dir()?;
        let entry = self.entry(caller, id)?;
        let rec = entry.record();
        let disks = self.inner.backends.disk_snapshots(rec.spec.backend, id)?;
        // A frozen (not suspended) VM is resumed first: its guest must
        // sync. A suspended one is snapshotted as it lies.
        if rec.state.is_paused() && !rec.suspended {
            self.running(caller, id).await?;
        }
        if memory {
            self.suspend_with_ram_file(caller, id).await?;
        }
        let _op = entry.op_lock.lock().await;
        let rec = entry.record();
        if snaps.find(&rec.tenant, name).is_some() {
            return Err(EdgeError::AlreadyExists(format!("a snapshot named {name:?} exists already")));
        }
        let running = match rec.state {
            State::Running if memory => {
                return Err(EdgeError::Invalid(format!("sandbox {id} was resumed while its memory snapshot was being taken: try again")))
            }
            State::Running => true,
            State::Paused if rec.suspended => false,
            s if s.is_terminal() => return Err(EdgeError::Ended { id: id.to_string(), state: s.as_str() }),
            s => return Err(EdgeError::NotRunning { id: id.to_string(), state: s.as_str() }),
        };
        if running {
            let _activity = entry.begin();
            self.guest_sync(&entry).await?;
        }
        let mut meta = SnapshotMeta {
            id: format!("snap-{}", crate::ids::short_id(&crate::ids::new_sandbox_id("x"))),
            name: name.to_string(),
            tenant: rec.tenant.clone(),
            source: id.to_string(),
            image: rec.spec.image.clone(),
            workspace: rec.spec.workspace.clone(),
            toolkits: rec.spec.toolkits.clone(),
            disk_mb: rec.spec.limits.disk_mb.max(16),
            parent: None,
            backend: rec.spec.backend,
            created_at_ms: now_ms(),
            bytes: 0,
            memory: None,
        };
        if memory {
            meta = self.copy_memory(&rec, meta).await?;
        }
        let snap_id = meta.id.clone();
        let taken = disks.snapshot_disk(id, running, meta).await;
        if taken.is_err() {
            // The memory files copied before (the snapshot is not listed).
            let _ = snaps.remove(&snap_id);
        }
        let (snapshot, frozen_ms) = taken?;
        Ok(SnapshotOutcome { snapshot, created: true, frozen_ms })
    }

    /// Leaves microVM `id` suspended with a RAM file of its own (a VM
    /// restored from a template or a memory snapshot maps that image
    /// privately and suspends its RAM into the stream instead: a resume
    /// loads it into a file of its own, and a second suspend keeps it
    /// there).
    async fn suspend_with_ram_file(&self, caller: &Caller, id: &str) -> Result<(), EdgeError> {
        let vm = self.memory_snapshots()?;
        let rec = self.entry(caller, id)?.record();
        if rec.spec.backend != BackendKind::Microvm {
            return Err(EdgeError::Invalid(format!("sandbox {id}: memory snapshots are of microVMs; snapshot a full VM's disk")));
        }
        if !rec.suspended {
            self.pause_with(caller, id, crate::pause::suspend::PauseMode::Suspend).await?;
        }
        if !vm.has_own_ram_file(id) {
            self.resume(caller, id).await?;
            self.pause_with(caller, id, crate::pause::suspend::PauseMode::Suspend).await?;
        }
        if !vm.has_own_ram_file(id) {
            return Err(EdgeError::Invalid("memory snapshots need guest RAM files on this node (dsec up --vm-ram-file true)".into()));
        }
        Ok(())
    }

    /// Copies suspended microVM `rec`'s RAM file and device state into the
    /// snapshot `meta` will list, and records what its sandboxes must
    /// match.
    async fn copy_memory(&self, rec: &crate::model::SandboxRecord, mut meta: SnapshotMeta) -> Result<SnapshotMeta, EdgeError> {
        let vm = self.memory_snapshots()?;
        let plan = self.plan_blocking(&rec.spec).await?;
        meta.memory = Some(SnapshotMemory {
            memory_mb: rec.spec.limits.memory_mb,
            cpu_cores: rec.spec.limits.cpu_cores,
            layer_files: plan.layer_files,
        });
        let (ram, vmstate) = vm.memory_files(&rec.id);
        let (snaps, id) = (self.snapshot_dir()?.clone(), meta.id.clone());
        tokio::task::spawn_blocking(move || snaps.write_memory(&id, &ram, &vmstate)).await.map_err(EdgeError::task("snapshot"))??;
        Ok(meta)
    }

    /// Flushes the guest's dirty pages to its disks (`sync` in the guest).
    pub(crate) async fn guest_sync(&self, entry: &crate::edge::Entry) -> Result<(), EdgeError> {
        let Some(inst) = entry.instance() else { return Ok(()) };
        let spec = ExecSpec {
            command: Command::Argv(vec!["sync".into()]),
            env: vec![],
            cwd: None,
            user: Some("root".into()),
            stdin: Stdin::Null,
            stream_output: false,
            timeout_ms: Some(SYNC_TIMEOUT.as_millis() as u64),
            kill_grace_ms: 1000,
            max_output_bytes: 4096,
            session: None,
        };
        let r = self.exec_on(&inst, spec).await?;
        match r.exit_code {
            Some(0) => Ok(()),
            _ => Err(EdgeError::Command { program: "sync in the guest", detail: String::from_utf8_lossy(&r.stderr).trim().to_string() }),
        }
    }

    /// Snapshots of this node visible to `caller`.
    pub fn snapshots(&self, caller: &Caller) -> Vec<SnapshotMeta> {
        let Ok(snaps) = self.snapshot_dir() else { return vec![] };
        snaps.list().into_iter().filter(|m| caller.may_see(&m.tenant)).collect()
    }

    /// Deletes `caller`'s snapshot `name`, refused (`SnapshotInUse`) while
    /// a snapshot chains onto it or a sandbox that is not yet stopped
    /// started from it: its layer backs their disks. (Docker's `rmi` has
    /// the same rule for images with children or containers.) Stopped
    /// sandboxes' disks are gone, so they do not hold it.
    pub fn delete_snapshot(&self, caller: &Caller, name: &str) -> Result<SnapshotMeta, EdgeError> {
        let snaps = self.snapshot_dir()?;
        let snap = snaps.find(&caller.tenant, name).ok_or_else(|| EdgeError::SnapshotNotFound(name.to_string()))?;
        let _guard = snaps.guard();
        let children: Vec<String> = snaps.children(&snap.id).into_iter().map(|m| m.name).collect();
        if !children.is_empty() {
            return Err(EdgeError::SnapshotInUse(format!(
                "snapshot {name:?} has snapshots chained onto it ({}): delete them first",
                children.join(", ")
            )));
        }
        let mut users: Vec<String> = self
            .inner
            .registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|e| e.record())
            .filter(|r| r.spec.snapshot.as_deref() == Some(snap.id.as_str()) && !r.state.is_terminal())
            .map(|r| r.id)
            .collect();
        // Whatever disk still backs onto it (a sandbox whose files outlive
        // its record's state, e.g. one being cleaned up).
        users.extend(self.inner.backends.disks_backed_by(&snaps.layer(&snap.id)));
        users.sort();
        users.dedup();
        if !users.is_empty() {
            return Err(EdgeError::SnapshotInUse(format!(
                "snapshot {name:?} backs the disks of sandboxes {}: stop or delete them first",
                users.join(", ")
            )));
        }
        snaps.remove(&snap.id)?;
        self.inner.backends.forget_snapshot(&snap.id);
        if let Err(e) = self.inner.journal.forget_target(SCOPE_SNAPSHOT, &snap.id) {
            tracing::warn!(snapshot = %snap.id, error = %e, "dropping the idempotency keys of a deleted snapshot");
        }
        Ok(snap)
    }

    /// A creation from a snapshot: the request takes the snapshot's image
    /// stack and disk size; returns the snapshot's id for the spec.
    pub(crate) fn apply_snapshot(&self, caller: &Caller, req: &mut SandboxRequest) -> Result<Option<String>, EdgeError> {
        let Some(name) = req.snapshot.clone() else { return Ok(None) };
        let snap = self.snapshot_dir()?.find(&caller.tenant, &name).ok_or_else(|| EdgeError::SnapshotNotFound(name.clone()))?;
        if req.backend.is_some_and(|b| b != snap.backend) {
            return Err(EdgeError::Invalid(format!(
                "snapshot {name:?} is of a {} sandbox: a sandbox started from it is one too",
                format!("{:?}", snap.backend).to_lowercase()
            )));
        }
        req.backend = Some(snap.backend);
        req.image = snap.image;
        req.workspace = snap.workspace;
        req.toolkits = snap.toolkits;
        req.disk_mb = Some(snap.disk_mb);
        if let Some(mem) = &snap.memory {
            // The machine its memory was saved from.
            req.memory_mb = Some(mem.memory_mb);
            req.cpu_cores = Some(mem.cpu_cores);
        }
        Ok(Some(snap.id))
    }
}
