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

pub mod container;
pub mod fullvm;
pub(crate) mod instance;
pub mod microvm;

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;

use crate::backends::instance::Instance;
use crate::error::EdgeError;
use crate::images::RootfsPlan;
use crate::model::{BackendKind, SandboxSpec};
use crate::store::StoreError;

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

    /// Something about a running sandbox its owner should know, for its
    /// `state_reason` (a full VM at its disk write limit). Checked by the
    /// sweeper: cheap (a stat), blocking.
    fn condition(&self, _id: &str) -> Option<String> {
        None
    }
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

/// The memory limit of a sandbox's cgroup: a VM's QEMU needs room beyond
/// its guest's RAM.
pub fn cgroup_memory_bytes(spec: &SandboxSpec) -> u64 {
    match spec.backend {
        BackendKind::Microvm => (spec.limits.memory_mb + crate::backends::microvm::QEMU_OVERHEAD_MB) << 20,
        BackendKind::Vm => (spec.limits.memory_mb + crate::backends::fullvm::QEMU_OVERHEAD_MB) << 20,
        _ => spec.limits.memory_mb << 20,
    }
}

/// The cgroup limits of a sandbox.
pub fn cgroup_limits(spec: &SandboxSpec) -> crate::cgroup::CgroupLimits {
    crate::cgroup::CgroupLimits {
        memory_bytes: cgroup_memory_bytes(spec),
        cpu_quota_us: (spec.limits.cpu_quota_cores.unwrap_or(spec.limits.cpu_cores) * crate::cgroup::CPU_PERIOD_US as f64)
            .round()
            .max(1000.0) as u64,
        pids: spec.limits.pids,
    }
}

/// The backends of one edge, by kind.
pub struct Backends {
    pub container: std::sync::Arc<crate::backends::container::ContainerBackend>,
    /// `None` when the node cannot run microVMs (no QEMU, no kernel): the
    /// reason is kept for the error a request gets.
    pub microvm: Result<std::sync::Arc<crate::backends::microvm::MicroVmBackend>, String>,
    /// Likewise for full VMs (no QEMU, no qemu-img, no OVMF when asked).
    pub fullvm: Result<std::sync::Arc<crate::backends::fullvm::FullVmBackend>, String>,
}

impl Backends {
    pub fn get(&self, kind: BackendKind) -> Result<&dyn Backend, EdgeError> {
        match kind {
            BackendKind::Container => Ok(self.container.as_ref()),
            BackendKind::Microvm => match &self.microvm {
                Ok(vm) => Ok(vm.as_ref()),
                Err(why) => Err(EdgeError::UnsupportedBackend(format!("microVMs are not available on this node: {why}"))),
            },
            BackendKind::Vm => match &self.fullvm {
                Ok(vm) => Ok(vm.as_ref()),
                Err(why) => Err(EdgeError::UnsupportedBackend(format!("full VMs are not available on this node: {why}"))),
            },
            other => Err(EdgeError::UnsupportedBackend(format!("backend {other:?} is not available on this node"))),
        }
    }

    /// The backend that cleans up after a sandbox of `kind`; a kind this
    /// node cannot run now (a microVM left by an edge that could) still
    /// has its cgroup removed by the container backend's cleanup.
    pub fn for_cleanup(&self, kind: BackendKind) -> &dyn Backend {
        self.get(kind).unwrap_or(self.container.as_ref())
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
}
