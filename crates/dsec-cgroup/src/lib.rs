//! Per-sandbox cgroups on cgroup v1 (these development machines) and v2
//! (most production hosts), behind one type.
//!
//! Every sandbox gets one cgroup named after its id under a per-node parent
//! (`dsec/<node>`), so the reaper can tell ours from everything else and two
//! edges on one machine never touch each other's cgroups.

mod mountinfo;
mod pause;
pub mod prewarm;
mod qos;
mod v1;
mod v1_pool;
mod v2;

pub use mountinfo::{find_cgroup_mounts, CgroupMounts};
pub use pause::{PushOut, SQUEEZE_BYTES};
pub use qos::{core_sched, scheduler_of, QosClass};
pub use v1::V1Cgroups;
pub use v2::V2Cgroups;

use std::path::Path;

/// CFS period used for CPU limits (the kernel default).
pub const CPU_PERIOD_US: u64 = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no usable cgroup hierarchy: {0}")]
    NoHierarchy(String),
    #[error("cgroup {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("cgroup {0} no longer exists")]
    Gone(String),
    #[error("cgroup {0} did not freeze within {1:?} (a process in uninterruptible sleep?)")]
    FreezeTimeout(String, std::time::Duration),
}

pub(crate) fn io_err(path: &Path, source: std::io::Error) -> CgroupError {
    CgroupError::Io { path: path.display().to_string(), source }
}

/// Which cgroup version to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    /// v1 if the memory controller is mounted as v1, else v2.
    Auto,
    V1,
    V2,
}

impl std::str::FromStr for CgroupMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(CgroupMode::Auto),
            "v1" => Ok(CgroupMode::V1),
            "v2" => Ok(CgroupMode::V2),
            other => Err(format!("cgroup mode must be auto, v1 or v2, not {other:?}")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CgroupLimits {
    pub memory_bytes: u64,
    /// CPU time per `CPU_PERIOD_US`, in microseconds (cores x period).
    pub cpu_quota_us: u64,
    pub pids: u64,
    /// The CPU QoS class's weights (`cpu.shares`, or `cpu.weight` and
    /// `cpu.idle`); the per-task side is [`Cgroups::set_task_qos`].
    pub qos: QosClass,
}

/// The cgroup driver of one edge.
#[derive(Debug)]
pub enum Cgroups {
    V1(V1Cgroups),
    V2(V2Cgroups),
}

impl Cgroups {
    /// Finds the hierarchies and creates the node's parent cgroup.
    pub fn open(mode: CgroupMode, parent: &str) -> Result<Cgroups, CgroupError> {
        let mounts = find_cgroup_mounts(Path::new("/proc/self/mountinfo"))?;
        let use_v1 = match mode {
            CgroupMode::V1 => true,
            CgroupMode::V2 => false,
            CgroupMode::Auto => mounts.v1.contains_key("memory"),
        };
        let cg = if use_v1 {
            Cgroups::V1(V1Cgroups::new(&mounts, parent)?)
        } else {
            let root = mounts.v2.clone().ok_or_else(|| CgroupError::NoHierarchy("no cgroup2 mount".into()))?;
            Cgroups::V2(V2Cgroups::new(root, parent, true)?)
        };
        cg.init()?;
        Ok(cg)
    }

    pub fn version(&self) -> u8 {
        match self {
            Cgroups::V1(_) => 1,
            Cgroups::V2(_) => 2,
        }
    }

    fn init(&self) -> Result<(), CgroupError> {
        match self {
            Cgroups::V1(c) => c.init(),
            Cgroups::V2(c) => c.init(),
        }
    }

    /// Creates the cgroup `name` with `limits`. An existing cgroup of that
    /// name (a leftover) is reused and its limits rewritten.
    pub fn create(&self, name: &str, limits: &CgroupLimits) -> Result<(), CgroupError> {
        match self {
            Cgroups::V1(c) => c.create(name, limits),
            Cgroups::V2(c) => c.create(name, limits),
        }
    }

    /// Keeps `size` cgroups made ahead, so `create` only renames one and
    /// writes its limits. cgroup v1 only: cgroup2 cannot rename a cgroup,
    /// so there it does nothing.
    pub fn start_pool(&self, size: usize) -> std::io::Result<()> {
        match self {
            Cgroups::V1(c) => c.start_pool(size),
            Cgroups::V2(_) => Ok(()),
        }
    }

    pub fn attach(&self, name: &str, pid: i32) -> Result<(), CgroupError> {
        match self {
            Cgroups::V1(c) => c.attach(name, pid),
            Cgroups::V2(c) => c.attach(name, pid),
        }
    }

    /// The `cgroup.procs` files a process writes to join cgroup `name`
    /// (one per v1 hierarchy), e.g. between fork and exec.
    pub fn procs_files(&self, name: &str) -> Vec<std::path::PathBuf> {
        match self {
            Cgroups::V1(c) => c.procs_files(name),
            Cgroups::V2(c) => vec![c.procs_files(name)],
        }
    }

    /// Changes the QoS class of a running sandbox: its cgroup's weights,
    /// then its tasks (see [`Cgroups::set_task_qos`]).
    pub fn set_qos(&self, name: &str, class: QosClass) -> Result<(), CgroupError> {
        match self {
            Cgroups::V1(c) => c.set_qos_weights(name, class)?,
            Cgroups::V2(c) => c.set_qos_weights(name, class)?,
        }
        self.set_task_qos(name, class, false)
    }

    /// Puts the tasks of cgroup `name` in `class`: on v1 `SCHED_IDLE` for
    /// a best-effort sandbox (and back to `SCHED_OTHER`); where the kernel
    /// has core scheduling, a cookie of its own for a latency-sensitive
    /// one (cleared for a best-effort one). `fresh`: the sandbox was just
    /// started with this class, so its tasks have the kernel's defaults
    /// and only what differs from them is done (nothing at all for a
    /// latency-sensitive sandbox without core scheduling).
    pub fn set_task_qos(&self, name: &str, class: QosClass, fresh: bool) -> Result<(), CgroupError> {
        let threads = match self {
            Cgroups::V1(c) => c.threads_file(name),
            Cgroups::V2(c) => Some(c.threads_file(name)),
        };
        let Some(threads) = threads else { return Ok(()) };
        if self.version() == 1 && (class.idle_tasks() || !fresh) {
            qos::set_task_policies(&threads, class.idle_tasks()).map_err(|e| io_err(&threads, e))?;
        }
        let cookie = class == QosClass::LatencySensitive;
        if core_sched::available() && (cookie || !fresh) {
            core_sched::set_cookie(&threads, cookie).map_err(|e| io_err(&threads, e))?;
        }
        Ok(())
    }

    /// Pids in the cgroup (empty if it does not exist).
    pub fn procs(&self, name: &str) -> Vec<i32> {
        match self {
            Cgroups::V1(c) => c.procs(name),
            Cgroups::V2(c) => c.procs(name),
        }
    }

    /// SIGKILLs every process in the cgroup (freezing first on v1 so no
    /// process can fork away while we iterate) and waits, up to
    /// [`KILL_PATIENCE`], until none is left, so that the cgroup can be
    /// removed next. False if some were still there when it gave up.
    pub fn kill_all(&self, name: &str) -> bool {
        match self {
            Cgroups::V1(c) => c.kill_all(name),
            Cgroups::V2(c) => c.kill_all(name),
        }
    }

    /// Removes the cgroup; `Ok` if it is gone (or never existed).
    pub fn remove(&self, name: &str) -> Result<(), CgroupError> {
        match self {
            Cgroups::V1(c) => c.remove(name),
            Cgroups::V2(c) => c.remove(name),
        }
    }

    /// Removes the node's parent cgroup if it is empty (edge shutdown).
    pub fn remove_parent(&self) {
        match self {
            Cgroups::V1(c) => c.remove_parent(),
            Cgroups::V2(c) => c.remove_parent(),
        }
    }

    /// Names of every cgroup under the node's parent.
    pub fn list(&self) -> Vec<String> {
        match self {
            Cgroups::V1(c) => c.list(),
            Cgroups::V2(c) => c.list(),
        }
    }

    /// Current memory use of the cgroup in bytes.
    pub fn memory_usage(&self, name: &str) -> Option<u64> {
        match self {
            Cgroups::V1(c) => c.memory_usage(name),
            Cgroups::V2(c) => c.memory_usage(name),
        }
    }

    /// CPU time the cgroup's processes used, in nanoseconds (v1
    /// `cpuacct.usage`, v2 `cpu.stat`'s `usage_usec`).
    pub fn cpu_usage_ns(&self, name: &str) -> Option<u64> {
        match self {
            Cgroups::V1(c) => c.cpu_usage_ns(name),
            Cgroups::V2(c) => c.cpu_usage_ns(name),
        }
    }

    /// Processes and threads in the cgroup now (`pids.current`).
    pub fn pids_current(&self, name: &str) -> Option<u64> {
        match self {
            Cgroups::V1(c) => c.pids_current(name),
            Cgroups::V2(c) => c.pids_current(name),
        }
    }

    /// How many times the kernel OOM-killed a process in this cgroup.
    pub fn oom_kills(&self, name: &str) -> u64 {
        match self {
            Cgroups::V1(c) => c.oom_kills(name),
            Cgroups::V2(c) => c.oom_kills(name),
        }
    }

    /// Whether `pid` is in cgroup `name` (checked through /proc, so it also
    /// guards re-adoption against pid reuse).
    pub fn contains(&self, name: &str, pid: i32) -> bool {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else { return false };
        let suffix = format!("/{name}");
        text.lines().any(|l| l.ends_with(&suffix))
    }
}

/// How long [`Cgroups::kill_all`] waits for the killed processes to be
/// gone. Dying takes the kernel a moment per process, and much longer when
/// many sandboxes die at once (a shutdown that stops them all): a wait of
/// a tenth of a second left one sandbox in seven of a hundred and twenty
/// with empty cgroups nobody removed.
pub const KILL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `round` until it says the cgroup is empty, pausing a little longer
/// each time (1 ms, doubling up to 20 ms), for at most [`KILL_PATIENCE`].
pub(crate) fn until_empty(mut round: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + KILL_PATIENCE;
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        if round() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(20));
    }
}

pub(crate) fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(|e| io_err(path, e))
}

pub(crate) fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path).map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect()).unwrap_or_default()
}

/// rmdir with a few retries: a cgroup stays busy for a moment after its last
/// process has been reaped.
pub(crate) fn rmdir_retry(path: &Path) -> Result<(), CgroupError> {
    for attempt in 0..50 {
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempt < 49 => {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(e) => return Err(io_err(path, e)),
        }
    }
    unreachable!("the loop returns on its last attempt")
}

/// Removes `dir`, then its parents, `levels` directories in all, innermost
/// first, stopping at the first that is not empty. The edge made them all
/// (create_dir_all of its cgroup parent, e.g. `dsec/<node>`); a level that
/// another node still uses stays.
pub(crate) fn remove_empty_levels(dir: &Path, levels: usize) {
    for d in dir.ancestors().take(levels) {
        if std::fs::remove_dir(d).is_err() {
            break;
        }
    }
}

/// How many directories a relative cgroup parent (`dsec/<node>`) spans.
pub(crate) fn parent_levels(parent: &str) -> usize {
    Path::new(parent).components().filter(|c| matches!(c, std::path::Component::Normal(_))).count()
}

pub(crate) fn list_dirs(path: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(path) else { return Vec::new() };
    rd.filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_removes_the_parent_levels_that_are_empty() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(parent_levels("dsec/node1"), 2);
        let node = t.path().join("dsec/node1");
        std::fs::create_dir_all(&node).unwrap();
        std::fs::create_dir_all(t.path().join("dsec/node2")).unwrap();
        remove_empty_levels(&node, 2);
        assert!(!node.exists() && t.path().join("dsec").exists(), "another node's level stays");
        remove_empty_levels(&t.path().join("dsec/node2"), 2);
        assert!(!t.path().join("dsec").exists() && t.path().exists(), "nothing above the parent path is touched");
    }
}
