//! The seam between the edge's lifecycle (admission, records, the exit
//! watcher, pause, recovery) and what a sandbox is made of.
//!
//! Every backend hands the edge the same [`Instance`]: one host process
//! whose pidfd ends when the sandbox ends (the container's agent, a VM's
//! QEMU), inside the sandbox's cgroup, and an agent channel. So stop is a
//! SIGKILL to that process, the exit watcher is shared, and pause freezes
//! the cgroup whatever runs in it; a backend only adds what differs: how
//! to start and re-attach, what to clean up besides the cgroup, and hooks
//! around a freeze (a VM's vCPUs are stopped over QMP first).
//!
//! The dispatch is closed: [`Backends`] holds one backend per
//! [`BackendKind`], and nothing outside this module names a concrete one.
//! What differs by kind is a method of [`Backend`] (memory overhead, disk
//! sizing, layer plan, network readiness); optional abilities are
//! capabilities a backend hands out or not: [`Screen`] (screenshots and
//! input), [`DiskSnapshots`] (with [`MemorySnapshots`]), suspend to disk
//! ([`Backend::can_suspend`]) and the writable layer of `pack_diff`.

pub mod container;
#[cfg(test)]
pub(crate) mod fake;
pub mod fullvm;
pub(crate) mod instance;
pub mod microvm;
pub mod qemu;
pub mod screen;
pub mod snapshot;
pub mod unavailable;

use std::collections::HashSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::mpsc::Receiver;

use crate::backends::container::ContainerBackend;
use crate::backends::fullvm::FullVmBackend;
use crate::backends::instance::Instance;
use crate::backends::microvm::MicroVmBackend;
use crate::cgroup::{CgroupLimits, Cgroups};
use crate::edge::EdgeConfig;
use crate::error::EdgeError;
use crate::images::{RootfsPlan, RootfsProvider};
use crate::model::{BackendKind, SandboxSpec};
use crate::ops::audit_forward::Refused;
use crate::store::StoreError;
pub use unavailable::{NoNetwork, Unavailable};

pub use fullvm::FullVmConfig;
pub use microvm::VmConfig as MicroVmConfig;
pub use screen::{ScreenInput, Screenshot};
pub use snapshot::{SnapshotDir, SnapshotMemory, SnapshotMeta};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Resolves when the sandbox's record is committed; a backend starts no
/// process before it has.
pub type Durable = BoxFuture<'static, Result<(), StoreError>>;

pub trait Backend: Send + Sync + 'static {
    fn kind(&self) -> BackendKind;

    /// Makes the cgroup, starts the sandbox and has its agent set it up.
    /// On failure everything made so far is undone before the error
    /// returns.
    fn start<'a>(
        &'a self,
        id: &'a str,
        spec: &'a SandboxSpec,
        plan: &'a RootfsPlan,
        durable: Durable,
    ) -> BoxFuture<'a, Result<Instance, EdgeError>>;

    /// Cuts short a `start` of sandbox `id` that is under way, because the
    /// sandbox is being stopped: kills what the start has spawned so far,
    /// so that the start fails (and undoes itself) at once instead of
    /// finishing a boot nobody wants. May be called again while the start
    /// lasts (it may spawn again: a cold boot after a failed restore).
    /// `false` where a start is too short to be worth cutting: the stop
    /// then waits for it. Blocking.
    fn abort_start(&self, _id: &str) -> bool {
        false
    }

    /// Re-attaches to a running sandbox after an edge restart.
    fn adopt<'a>(&'a self, id: &'a str, pid: i32) -> BoxFuture<'a, Result<Instance, EdgeError>>;

    /// Removes what is left of a sandbox once its process is gone (or
    /// when a crashed edge left it): stray processes, the cgroup, files.
    /// Blocking.
    fn cleanup(&self, id: &str) -> Result<(), EdgeError>;

    /// Before the cgroup freeze of a pause.
    fn before_freeze<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, Result<(), EdgeError>> {
        Box::pin(async { Ok(()) })
    }

    /// After the thaw of a resume (and to undo `before_freeze` when a
    /// pause fails).
    fn after_thaw<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, Result<(), EdgeError>> {
        Box::pin(async { Ok(()) })
    }

    /// Whether this backend can suspend a sandbox to disk (save its memory
    /// and device state, end its process, and later restore it in a new
    /// one).
    fn can_suspend(&self) -> bool {
        false
    }

    /// Saves a running sandbox (whose process is `pidfd`) to disk and
    /// ends that process. On failure the sandbox keeps running as before.
    fn suspend<'a>(&'a self, id: &'a str, _pidfd: &'a std::os::fd::OwnedFd) -> BoxFuture<'a, Result<SuspendOutcome, EdgeError>> {
        Box::pin(async move { Err(EdgeError::Invalid(format!("sandbox {id}: this backend cannot suspend to disk"))) })
    }

    /// Starts a new process from a sandbox's suspend image; the image is
    /// consumed once the sandbox runs again. On failure the image is kept
    /// (the sandbox stays suspended) and no process is left.
    fn restore<'a>(&'a self, id: &'a str, _spec: &'a SandboxSpec, _plan: &'a RootfsPlan) -> BoxFuture<'a, Result<Instance, EdgeError>> {
        Box::pin(async move { Err(EdgeError::Invalid(format!("sandbox {id}: this backend cannot restore a suspend image"))) })
    }

    /// Whether a complete suspend image of `id` is on disk (recovery after
    /// an edge restart trusts it over a record saved before it was done).
    fn has_suspend_image(&self, _id: &str) -> bool {
        false
    }

    /// Removes host files of sandboxes not in `live` (the reaper's pass
    /// over what has no cgroup to find it by). Returns how many. Blocking.
    fn reap_files(&self, _live: &HashSet<String>) -> usize {
        0
    }

    /// Cgroup names the backend holds for itself, not for a sandbox
    /// (microVM standby QEMUs): the reaper leaves them alone. A name is
    /// listed before its cgroup exists.
    fn reserved(&self) -> HashSet<String> {
        HashSet::new()
    }

    /// Releases node-wide resources at edge shutdown.
    fn release(&self) {}

    /// Bytes the running sandbox `id` (first process `pid`) holds in its
    /// writable layer; `None` where the backend cannot tell. Read every
    /// second of every sandbox by the usage sampler: cheap (a stat),
    /// blocking.
    fn disk_used_bytes(&self, _id: &str, _pid: i32) -> Option<u64> {
        None
    }

    /// Something about a running sandbox its owner should know, for its
    /// `state_reason` (a full VM at its disk write limit). Checked by the
    /// sweeper: cheap (a stat), blocking.
    fn condition(&self, _id: &str) -> Option<String> {
        None
    }

    /// Host memory the sandbox's process needs beyond its guest's RAM (a
    /// VM's QEMU), added to its cgroup's limit.
    fn memory_overhead_mb(&self) -> u64 {
        0
    }

    /// The disk a sandbox of `image` gets when the request names none
    /// (`None`: the node's default). A full VM may write as much as its
    /// image's disk holds.
    fn default_disk_mb(&self, _image: &str) -> Option<u64> {
        None
    }

    /// The layers `spec` runs on. Blocking (an image may be fetched from a
    /// shared store).
    fn plan(&self, rootfs: &dyn RootfsProvider, spec: &SandboxSpec) -> Result<RootfsPlan, EdgeError> {
        rootfs.plan(&spec.image, spec.workspace.as_deref(), &spec.toolkits)
    }

    /// Whether this node can give a sandbox of this backend a network under
    /// its rules; if not, why.
    fn network_ready(&self) -> Result<(), NoNetwork> {
        Ok(())
    }

    /// The writable layer of running sandbox `id` (its upper directory,
    /// for `pack_diff`), where the host can see it.
    fn writable_layer(&self, id: &str, _inst: &Instance) -> Result<std::os::fd::OwnedFd, EdgeError> {
        Err(EdgeError::Invalid(format!("sandbox {id}: pack_diff works on container sandboxes only")))
    }

    /// The screen, keyboard and mouse of this backend's sandboxes.
    fn screen(&self) -> Option<&dyn Screen> {
        None
    }

    /// Snapshots of this backend's writable disks.
    fn disk_snapshots(&self) -> Option<&dyn DiskSnapshots> {
        None
    }
}

/// A backend whose sandboxes have a screen (full VMs).
pub trait Screen: Send + Sync {
    /// Checks an input action before anything reaches a sandbox: a bad key
    /// is the caller's error, whatever the sandbox's state.
    fn check_input(&self, action: &ScreenInput) -> Result<(), EdgeError>;

    /// The screen of sandbox `id` as PNG.
    fn screenshot<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Screenshot, EdgeError>>;

    /// Sends a checked input action to sandbox `id`.
    fn input<'a>(&'a self, id: &'a str, action: ScreenInput) -> BoxFuture<'a, Result<(), EdgeError>>;
}

/// A backend whose writable disks can be snapshotted (both VM backends:
/// the snapshots live in one directory per node, [`Backends::snapshot_dir`]).
pub trait DiskSnapshots: Send + Sync {
    /// Copies sandbox `id`'s writable disk into the node's snapshots as
    /// `meta`; a `running` VM's vCPUs stop for the copy (its guest has
    /// synced). Returns the listed snapshot and how long the vCPUs stood.
    fn snapshot_disk<'a>(&'a self, id: &'a str, running: bool, meta: SnapshotMeta)
        -> BoxFuture<'a, Result<(SnapshotMeta, f64), EdgeError>>;

    /// Where this backend's writable disks live (any of them may back onto
    /// a snapshot).
    fn disk_dir(&self) -> &Path;

    /// Memory snapshots, where the backend keeps guest RAM in files of
    /// their own (microVMs).
    fn memory(&self) -> Option<&dyn MemorySnapshots> {
        None
    }
}

/// A backend that can keep a sandbox's memory in a snapshot.
pub trait MemorySnapshots: Send + Sync {
    /// Whether suspended sandbox `id` has a guest RAM file of its own.
    fn has_own_ram_file(&self, id: &str) -> bool;

    /// The RAM file and device state of suspended sandbox `id`.
    fn memory_files(&self, id: &str) -> (PathBuf, PathBuf);

    /// Drops what was loaded of a deleted snapshot's memory.
    fn forget_snapshot(&self, snapshot_id: &str);
}

/// What one suspend to disk did.
#[derive(Debug, Clone, Default)]
pub struct SuspendOutcome {
    /// Host memory the sandbox's cgroup held before, and after the process
    /// ended and its saved pages left the page cache.
    pub memory_before_bytes: u64,
    pub memory_after_bytes: u64,
    /// Bytes the suspend image occupies on disk (allocated blocks: guest
    /// RAM file + device state).
    pub disk_bytes: u64,
    /// Time to save the device (and, without a RAM file, memory) state.
    pub save_ms: f64,
    /// Time to flush the guest RAM file to disk and drop it from memory.
    pub flush_ms: f64,
}

/// The least memory a sandbox of `kind` may ask for, where its backend
/// sets one above the node's (a full VM's operating system).
pub fn min_memory_mb(kind: BackendKind) -> u64 {
    match kind {
        BackendKind::Vm => fullvm::MIN_MEMORY_MB,
        BackendKind::Container | BackendKind::Fncall | BackendKind::Microvm => 0,
    }
}

/// The cgroup limits of a sandbox; `overhead_mb` is its backend's
/// [`Backend::memory_overhead_mb`].
pub(crate) fn cgroup_limits(spec: &SandboxSpec, overhead_mb: u64) -> CgroupLimits {
    CgroupLimits {
        memory_bytes: (spec.limits.memory_mb + overhead_mb) << 20,
        cpu_quota_us: (spec.limits.cpu_quota_cores.unwrap_or(spec.limits.cpu_cores) * crate::cgroup::CPU_PERIOD_US as f64)
            .round()
            .max(1000.0) as u64,
        pids: spec.limits.pids,
        qos: spec.qos_class,
    }
}

/// The backends of one edge: a closed set, one per [`BackendKind`]. FnCall
/// runners are containers with a pool in front (`dsec-fncall`), so that
/// kind is served by the container backend.
pub struct Backends {
    /// The container backend (a fake one in unit tests).
    container: Arc<dyn Backend>,
    /// `Err` when the node cannot run microVMs (no QEMU, no kernel): the
    /// reason is kept for the error a request gets.
    microvm: Result<Arc<MicroVmBackend>, Unavailable>,
    /// Likewise for full VMs (no QEMU, no qemu-img, no OVMF when asked).
    fullvm: Result<Arc<FullVmBackend>, Unavailable>,
    /// The node's disk of containers' writable layers and named volumes
    /// (None: writable layers are tmpfs, and there are no volumes).
    disk: Option<Arc<crate::disk::NodeDisk>>,
}

/// What a node's backends need from the edge's configuration and state.
pub(crate) struct BackendsSetup<'a> {
    pub config: &'a EdgeConfig,
    pub cgroups: &'a Arc<Cgroups>,
    pub egress: Option<&'a dsec_net::Egress>,
}

impl Backends {
    /// Starts the node's backends. The container backend must start (an
    /// error is the edge's); a VM backend that cannot only records why.
    /// Returns the opens of masked paths the container backend watches
    /// (none where fanotify is not available).
    pub(crate) fn open(s: BackendsSetup<'_>) -> Result<(Backends, Option<Receiver<Refused>>), EdgeError> {
        let config = s.config;
        // The node's disk first: a failure later releases it with the
        // backends (`StartUndo`); the container backend mounts the node's
        // sysfs, which nothing would release if the disk failed after it.
        let disk = match &config.writable_layer {
            crate::disk::WritableLayer::Tmpfs => None,
            crate::disk::WritableLayer::Disk(d) => Some(Arc::new(crate::disk::NodeDisk::open(d, &config.state_dir)?)),
        };
        let container =
            ContainerBackend::new(s.cgroups.clone(), &config.agent_path, &config.state_dir, config.create_timeout, config.agent_exec);
        let mut container = match container {
            Ok(c) => c,
            Err(e) => {
                if let Some(d) = &disk {
                    d.release();
                }
                return Err(e);
            }
        };
        if !config.syscall_filter {
            container = container.without_syscall_filter();
        }
        container = container.with_netns_pool(config.prewarm);
        if let Some(d) = &disk {
            container = container.with_disk(d.clone());
        }
        if let Some(e) = s.egress {
            container = container.with_egress(e.clone());
        }
        let masked = match container::mask_watch::MaskWatch::start() {
            Some((watch, rx)) => {
                container = container.with_mask_watch(watch);
                Some(rx)
            }
            None => None,
        };
        let container = Arc::new(container);
        let microvm = match &config.vm {
            None => Err(Unavailable::NotConfigured("microVM")),
            Some(vm) => {
                MicroVmBackend::new(s.cgroups.clone(), vm, &config.node, &config.agent_path, &config.state_dir, config.vm_boot_timeout)
                    .map(|m| match s.egress {
                        Some(e) => m.with_egress(e.clone()),
                        None => m,
                    })
                    .map(Arc::new)
            }
        };
        if let Err(why) = &microvm {
            tracing::info!(%why, "microVMs unavailable on this node");
        }
        let fullvm = match &config.fullvm {
            None => Err(Unavailable::NotConfigured("full VM")),
            Some(cfg) => FullVmBackend::new(s.cgroups.clone(), cfg, &config.node, &config.state_dir, microvm.as_ref().ok().cloned())
                .map(|f| match s.egress {
                    Some(e) => f.with_egress(e.clone()),
                    None => f,
                })
                .map(Arc::new),
        };
        if let Err(why) = &fullvm {
            tracing::info!(%why, "full VMs unavailable on this node");
        }
        Ok((Backends { container, microvm, fullvm, disk }, masked))
    }

    /// A node that runs containers (and FnCall runners) on `container`
    /// only, as the unit tests' fake backend does.
    #[cfg(test)]
    pub(crate) fn containers_only(container: Arc<dyn Backend>) -> Backends {
        Backends {
            container,
            microvm: Err(Unavailable::NotConfigured("microVM")),
            fullvm: Err(Unavailable::NotConfigured("full VM")),
            disk: None,
        }
    }

    /// The node's disk of writable layers and named volumes.
    pub fn disk(&self) -> Option<&Arc<crate::disk::NodeDisk>> {
        self.disk.as_ref()
    }

    pub fn get(&self, kind: BackendKind) -> Result<&dyn Backend, EdgeError> {
        Ok(match kind {
            BackendKind::Container | BackendKind::Fncall => self.container.as_ref(),
            BackendKind::Microvm => available(&self.microvm, "microVMs")?.as_ref(),
            BackendKind::Vm => available(&self.fullvm, "full VMs")?.as_ref(),
        })
    }

    /// [`Backends::get`], as a handle that outlives the borrow (for a
    /// blocking thread).
    pub fn handle(&self, kind: BackendKind) -> Result<Arc<dyn Backend>, EdgeError> {
        Ok(match kind {
            BackendKind::Container | BackendKind::Fncall => self.container.clone(),
            BackendKind::Microvm => available(&self.microvm, "microVMs")?.clone(),
            BackendKind::Vm => available(&self.fullvm, "full VMs")?.clone(),
        })
    }

    /// The backend that cleans up after a sandbox of `kind`; a kind this
    /// node cannot run now (a microVM left by an edge that could) still
    /// has its cgroup removed by the container backend's cleanup.
    pub fn for_cleanup(&self, kind: BackendKind) -> &dyn Backend {
        self.get(kind).unwrap_or(self.container.as_ref())
    }

    /// The backends this node can run, by their wire names (`container`,
    /// `microvm`, `vm`), for placement: only what started successfully.
    pub fn names(&self) -> Vec<String> {
        let mut v = vec!["container".to_string()];
        if self.microvm.is_ok() {
            v.push("microvm".into());
        }
        if self.fullvm.is_ok() {
            v.push("vm".into());
        }
        v
    }

    /// Every backend this node runs, for node-wide duties (reaping,
    /// shutdown).
    pub fn all(&self) -> Vec<&dyn Backend> {
        let mut v: Vec<&dyn Backend> = vec![self.container.as_ref()];
        if let Ok(vm) = &self.microvm {
            v.push(vm.as_ref());
        }
        if let Ok(vm) = &self.fullvm {
            v.push(vm.as_ref());
        }
        v
    }

    /// The memory limit of sandbox `spec`'s cgroup.
    pub fn cgroup_memory_bytes(&self, spec: &SandboxSpec) -> u64 {
        cgroup_limits(spec, self.for_cleanup(spec.backend).memory_overhead_mb()).memory_bytes
    }

    /// The node's disk snapshots: one directory, whichever VM backend runs
    /// here.
    pub fn snapshot_dir(&self) -> Result<&SnapshotDir, EdgeError> {
        match (&self.microvm, &self.fullvm) {
            (Ok(vm), _) => Ok(&vm.snapshots),
            (_, Ok(vm)) => Ok(&vm.snapshots),
            (Err(why), _) => Err(EdgeError::UnsupportedBackend(format!("VMs are not available on this node: {why}"))),
        }
    }

    /// The disk snapshots of sandboxes of `kind`.
    pub fn disk_snapshots(&self, kind: BackendKind, id: &str) -> Result<&dyn DiskSnapshots, EdgeError> {
        self.get(kind)?.disk_snapshots().ok_or_else(|| {
            EdgeError::Invalid(format!("sandbox {id}: snapshots are of VMs (microvm, vm); capture a container with pack_diff"))
        })
    }

    /// Sandboxes whose writable disks back onto snapshot layer `layer`.
    pub fn disks_backed_by(&self, layer: &Path) -> Vec<String> {
        let dirs: Vec<&Path> = self.all().into_iter().filter_map(|b| b.disk_snapshots()).map(|d| d.disk_dir()).collect();
        snapshot::disks_backed_by(&dirs, layer)
    }

    /// Drops what any backend loaded of a deleted snapshot.
    pub fn forget_snapshot(&self, snapshot_id: &str) {
        for b in self.all() {
            if let Some(m) = b.disk_snapshots().and_then(|d| d.memory()) {
                m.forget_snapshot(snapshot_id);
            }
        }
    }
}

/// A VM backend, or why this node has none (`what`: "microVMs", "full VMs").
fn available<'a, T>(backend: &'a Result<Arc<T>, Unavailable>, what: &str) -> Result<&'a Arc<T>, EdgeError> {
    backend.as_ref().map_err(|why| EdgeError::UnsupportedBackend(format!("{what} are not available on this node: {why}")))
}
