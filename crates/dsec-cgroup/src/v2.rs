//! cgroup v2: one unified hierarchy.

use std::path::PathBuf;

use super::v1::read_u64;
use super::*;

const CONTROLLERS: &[&str] = &["memory", "cpu", "pids"];

#[derive(Debug)]
pub struct V2Cgroups {
    root: PathBuf,
    parent: PathBuf,
    /// Directories the parent path spans (removed, where empty, at shutdown).
    levels: usize,
    /// Refuse to run when a limit cannot be enforced (production). Tests of
    /// the v2 mechanics on a hybrid host, whose cgroup2 carries no
    /// controllers, turn this off.
    require_controllers: bool,
}

impl V2Cgroups {
    pub fn new(root: PathBuf, parent: &str, require_controllers: bool) -> Result<Self, CgroupError> {
        let levels = super::parent_levels(parent);
        let parent = root.join(parent);
        Ok(Self { root, parent, levels, require_controllers })
    }

    fn available(&self) -> Vec<String> {
        std::fs::read_to_string(self.root.join("cgroup.controllers"))
            .map(|t| t.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// Creates the node's parent and delegates the controllers down to it.
    /// Public for the integration tests of the v2 mechanics
    /// (tests/cgroup_v2.rs), which build a driver without `Cgroups::open`.
    pub fn init(&self) -> Result<(), CgroupError> {
        let avail = self.available();
        let wanted: Vec<&str> = CONTROLLERS.iter().copied().filter(|c| avail.iter().any(|a| a == c)).collect();
        if self.require_controllers && wanted.len() != CONTROLLERS.len() {
            return Err(CgroupError::NoHierarchy(format!(
                "cgroup2 at {} offers controllers {avail:?}; memory, cpu and pids are needed",
                self.root.display()
            )));
        }
        std::fs::create_dir_all(&self.parent).map_err(|e| io_err(&self.parent, e))?;
        // Delegate the controllers down every level to our parent, so each
        // sandbox cgroup below it gets the interface files.
        let enable: String = wanted.iter().map(|c| format!("+{c} ")).collect();
        if !enable.is_empty() {
            let rel = self.parent.strip_prefix(&self.root).unwrap_or(&self.parent).to_path_buf();
            let mut dir = self.root.clone();
            write_file(&dir.join("cgroup.subtree_control"), enable.trim())?;
            for comp in rel.components() {
                dir.push(comp);
                write_file(&dir.join("cgroup.subtree_control"), enable.trim())?;
            }
        }
        Ok(())
    }

    pub(super) fn create(&self, name: &str, l: &CgroupLimits) -> Result<(), CgroupError> {
        let dir = self.parent.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(&dir, e)),
        }
        let set = |file: &str, value: String| -> Result<(), CgroupError> {
            let p = dir.join(file);
            if !self.require_controllers && !p.exists() {
                return Ok(());
            }
            write_file(&p, &value)
        };
        set("memory.max", l.memory_bytes.to_string())?;
        set("cpu.max", format!("{} {CPU_PERIOD_US}", l.cpu_quota_us))?;
        set("pids.max", l.pids.to_string())?;
        if self.require_controllers || dir.join("cpu.weight").exists() {
            write_qos(&dir, l.qos)?;
        }
        // As on v1: a running sandbox never swaps; only a pause does. The
        // file exists only with swap accounting.
        let swap_max = dir.join("memory.swap.max");
        if swap_max.exists() {
            write_file(&swap_max, "0")?;
        }
        Ok(())
    }

    pub(super) fn set_qos_weights(&self, name: &str, class: QosClass) -> Result<(), CgroupError> {
        let dir = self.parent.join(name);
        if !dir.is_dir() {
            return Err(CgroupError::Gone(dir.display().to_string()));
        }
        if !self.require_controllers && !dir.join("cpu.weight").exists() {
            return Ok(());
        }
        write_qos(&dir, class)
    }

    /// Every thread of the cgroup.
    pub(super) fn threads_file(&self, name: &str) -> PathBuf {
        self.parent.join(name).join("cgroup.threads")
    }

    pub(super) fn set_frozen(&self, name: &str, frozen: bool) -> Result<(), CgroupError> {
        write_file(&self.parent.join(name).join("cgroup.freeze"), if frozen { "1" } else { "0" })
    }

    pub(super) fn frozen(&self, name: &str) -> Option<bool> {
        let text = std::fs::read_to_string(self.parent.join(name).join("cgroup.events")).ok()?;
        Some(text.lines().any(|l| l.trim() == "frozen 1"))
    }

    pub(super) fn set_memory_limit(&self, name: &str, bytes: u64) -> Result<(), CgroupError> {
        let p = self.parent.join(name).join("memory.max");
        if !self.require_controllers && !p.exists() {
            return Ok(());
        }
        write_file(&p, &bytes.to_string())
    }

    /// Asks the kernel to reclaim everything the cgroup holds. EAGAIN means
    /// it reclaimed less than asked (no swap, unswappable memory, or pages
    /// still being written to swap): asked again while that makes
    /// progress, until `deadline`. A hierarchy without the memory
    /// controller has nothing to reclaim.
    pub(super) fn reclaim(&self, name: &str, deadline: std::time::Instant) -> Result<(), CgroupError> {
        let dir = self.parent.join(name);
        let reclaim = dir.join("memory.reclaim");
        if !reclaim.exists() {
            return Ok(());
        }
        let swap_max = dir.join("memory.swap.max");
        let has_swap_max = swap_max.exists();
        if has_swap_max {
            write_file(&swap_max, "max")?;
        }
        let usage = || read_u64(&dir.join("memory.current")).unwrap_or(0);
        let mut r = Ok(());
        let mut last = usage();
        while std::time::Instant::now() < deadline {
            r = write_file(&reclaim, &last.max(1).to_string());
            let again = matches!(&r, Err(CgroupError::Io { source, .. }) if source.raw_os_error() == Some(libc::EAGAIN));
            let now = usage();
            if !again || now + (1 << 20) > last {
                break;
            }
            last = now;
        }
        if has_swap_max {
            write_file(&swap_max, "0")?;
        }
        match r {
            Err(CgroupError::Io { source, .. }) if source.raw_os_error() == Some(libc::EAGAIN) => Ok(()),
            other => other,
        }
    }

    pub(super) fn procs_files(&self, name: &str) -> std::path::PathBuf {
        self.parent.join(name).join("cgroup.procs")
    }

    pub(super) fn attach(&self, name: &str, pid: i32) -> Result<(), CgroupError> {
        write_file(&self.parent.join(name).join("cgroup.procs"), &pid.to_string())
    }

    pub(super) fn procs(&self, name: &str) -> Vec<i32> {
        read_pids(&self.parent.join(name).join("cgroup.procs"))
    }

    pub(super) fn kill_all(&self, name: &str) -> bool {
        let dir = self.parent.join(name);
        // cgroup.kill (5.14+) kills atomically, forks included; without it,
        // each round kills what is left.
        let atomic = std::fs::write(dir.join("cgroup.kill"), "1").is_ok();
        super::until_empty(|| {
            let pids = self.procs(name);
            if !atomic {
                for &pid in &pids {
                    // SAFETY: kill(2) has no memory effects.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            pids.is_empty()
        })
    }

    pub(super) fn remove(&self, name: &str) -> Result<(), CgroupError> {
        rmdir_retry(&self.parent.join(name))
    }

    pub(super) fn remove_parent(&self) {
        super::remove_empty_levels(&self.parent, self.levels);
    }

    pub(super) fn list(&self) -> Vec<String> {
        list_dirs(&self.parent)
    }

    pub(super) fn memory_usage(&self, name: &str) -> Option<u64> {
        read_u64(&self.parent.join(name).join("memory.current"))
    }

    pub(super) fn cpu_usage_ns(&self, name: &str) -> Option<u64> {
        let text = std::fs::read_to_string(self.parent.join(name).join("cpu.stat")).ok()?;
        let usec: u64 = text.lines().find_map(|l| l.strip_prefix("usage_usec "))?.trim().parse().ok()?;
        Some(usec.saturating_mul(1000))
    }

    pub(super) fn pids_current(&self, name: &str) -> Option<u64> {
        read_u64(&self.parent.join(name).join("pids.current"))
    }

    pub(super) fn oom_kills(&self, name: &str) -> u64 {
        let Ok(text) = std::fs::read_to_string(self.parent.join(name).join("memory.events")) else { return 0 };
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
    }
}

/// Writes the class's files into cgroup directory `dir`. A kernel before
/// 5.15 has no `cpu.idle`: there a best-effort group gets the smallest
/// weight instead, which is all it can have.
fn write_qos(dir: &std::path::Path, class: QosClass) -> Result<(), CgroupError> {
    if !dir.join("cpu.idle").exists() {
        let weight = if class == QosClass::BestEffort { "1" } else { "100" };
        return write_file(&dir.join("cpu.weight"), weight);
    }
    for (file, value) in class.v2_files() {
        write_file(&dir.join(file), value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delegates_controllers_and_writes_limits() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("cgroup.controllers"), "cpuset cpu io memory pids").unwrap();
        let cg = V2Cgroups::new(t.path().to_path_buf(), "dsec/n1", true).unwrap();
        cg.init().unwrap();
        assert_eq!(std::fs::read_to_string(t.path().join("cgroup.subtree_control")).unwrap(), "+memory +cpu +pids");
        assert_eq!(std::fs::read_to_string(t.path().join("dsec/n1/cgroup.subtree_control")).unwrap(), "+memory +cpu +pids");
        cg.create("sb", &CgroupLimits { memory_bytes: 1 << 30, cpu_quota_us: 150_000, pids: 64, qos: QosClass::LatencySensitive }).unwrap();
        assert_eq!(std::fs::read_to_string(t.path().join("dsec/n1/sb/cpu.max")).unwrap(), "150000 100000");
        assert_eq!(std::fs::read_to_string(t.path().join("dsec/n1/sb/memory.max")).unwrap(), (1u64 << 30).to_string());
    }

    #[test]
    fn qos_classes_map_to_cpu_idle_and_cpu_weight() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("cgroup.controllers"), "cpu memory pids").unwrap();
        let cg = V2Cgroups::new(t.path().to_path_buf(), "dsec/n1", true).unwrap();
        cg.init().unwrap();
        let read = |f: &str| std::fs::read_to_string(t.path().join("dsec/n1/sb").join(f)).unwrap();
        // A kernel without cpu.idle (before 5.15): the smallest weight.
        cg.create("sb", &CgroupLimits { memory_bytes: 1 << 30, cpu_quota_us: 100_000, pids: 64, qos: QosClass::BestEffort }).unwrap();
        assert_eq!(read("cpu.weight"), "1");
        assert!(!t.path().join("dsec/n1/sb/cpu.idle").exists());
        // With cpu.idle: the group becomes idle, and back.
        std::fs::write(t.path().join("dsec/n1/sb/cpu.idle"), "0").unwrap();
        cg.set_qos_weights("sb", QosClass::BestEffort).unwrap();
        assert_eq!(read("cpu.idle"), "1");
        cg.set_qos_weights("sb", QosClass::LatencySensitive).unwrap();
        assert_eq!((read("cpu.idle").as_str(), read("cpu.weight").as_str()), ("0", "100"));
        assert!(matches!(cg.set_qos_weights("gone", QosClass::BestEffort), Err(CgroupError::Gone(_))));
        assert_eq!(cg.threads_file("sb"), t.path().join("dsec/n1/sb/cgroup.threads"));
    }

    #[test]
    fn refuses_a_hierarchy_without_controllers() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("cgroup.controllers"), "hugetlb").unwrap();
        let cg = V2Cgroups::new(t.path().to_path_buf(), "dsec", true).unwrap();
        assert!(matches!(cg.init(), Err(CgroupError::NoHierarchy(_))));
    }
}
