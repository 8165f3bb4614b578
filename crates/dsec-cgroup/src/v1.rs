//! cgroup v1: one directory per controller hierarchy.

use std::path::{Path, PathBuf};

use super::*;

/// Controllers a sandbox is placed in. cpuset is left out on purpose: a new
/// v1 cpuset cgroup starts with no CPUs and would need two extra writes per
/// sandbox for nothing we use.
const CONTROLLERS: &[&str] = &["memory", "cpu", "cpuacct", "pids", "freezer"];

#[derive(Debug)]
pub struct V1Cgroups {
    /// Distinct hierarchy directories of our parent cgroup, with the
    /// controllers each carries (co-mounted controllers share a directory).
    parents: Vec<(PathBuf, Vec<String>)>,
    /// Directories the parent path spans (removed, where empty, at shutdown).
    levels: usize,
    /// Cgroups made ahead (`start_pool`); `None` until started, and again
    /// once stopped at shutdown.
    pool: std::sync::Mutex<Option<super::v1_pool::V1Pool>>,
}

impl V1Cgroups {
    pub fn new(mounts: &CgroupMounts, parent: &str) -> Result<Self, CgroupError> {
        let mut parents: Vec<(PathBuf, Vec<String>)> = Vec::new();
        for ctrl in CONTROLLERS {
            let Some(mp) = mounts.v1.get(*ctrl) else {
                if matches!(*ctrl, "memory" | "cpu" | "pids" | "freezer") {
                    return Err(CgroupError::NoHierarchy(format!("cgroup v1 controller {ctrl} is not mounted")));
                }
                continue;
            };
            let dir = mp.join(parent);
            match parents.iter_mut().find(|(d, _)| *d == dir) {
                Some((_, ctrls)) => ctrls.push(ctrl.to_string()),
                None => parents.push((dir, vec![ctrl.to_string()])),
            }
        }
        Ok(Self { parents, levels: super::parent_levels(parent), pool: std::sync::Mutex::new(None) })
    }

    pub(super) fn init(&self) -> Result<(), CgroupError> {
        for (dir, _) in &self.parents {
            std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        }
        Ok(())
    }

    fn dir_of(&self, ctrl: &str, name: &str) -> Option<PathBuf> {
        self.parents.iter().find(|(_, c)| c.iter().any(|x| x == ctrl)).map(|(d, _)| d.join(name))
    }

    fn memory_dir(&self, name: &str) -> PathBuf {
        self.dir_of("memory", name).expect("memory hierarchy is required at construction")
    }

    /// Keeps `size` cgroups ready for `create` to rename (0: none).
    pub(super) fn start_pool(&self, size: usize) -> std::io::Result<()> {
        let mut pool = self.pool_lock();
        *pool = None;
        if size > 0 {
            *pool = Some(super::v1_pool::V1Pool::start(self.parents.iter().map(|(p, _)| p.clone()).collect(), size)?);
        }
        Ok(())
    }

    fn pool_lock(&self) -> std::sync::MutexGuard<'_, Option<super::v1_pool::V1Pool>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn create(&self, name: &str, l: &CgroupLimits) -> Result<(), CgroupError> {
        let pooled = self.pool_lock().as_ref().and_then(|p| p.take());
        if pooled.is_some_and(|p| super::v1_pool::claim(&self.parents, &p, name, l)) {
            return Ok(());
        }
        for (parent, ctrls) in &self.parents {
            let dir = parent.join(name);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(&dir, e)),
            }
            if ctrls.iter().any(|c| c == "memory") {
                // A running sandbox that reaches its limit is OOM-killed,
                // never swapped, even on a host with swap (v1 limit reclaim
                // honours swappiness 0 strictly); only a pause swaps (see
                // squeeze). Pooled cgroups get this when they are made.
                write_file(&dir.join("memory.swappiness"), "0")?;
            }
            write_limits(&dir, ctrls, l)?;
        }
        Ok(())
    }

    pub(super) fn procs_files(&self, name: &str) -> Vec<std::path::PathBuf> {
        self.parents.iter().map(|(parent, _)| parent.join(name).join("cgroup.procs")).collect()
    }

    pub(super) fn attach(&self, name: &str, pid: i32) -> Result<(), CgroupError> {
        let pid = pid.to_string();
        for (parent, _) in &self.parents {
            write_file(&parent.join(name).join("cgroup.procs"), &pid)?;
        }
        Ok(())
    }

    /// Writes the class's `cpu.shares` (the tasks' policies are
    /// `Cgroups::set_task_qos`'s).
    pub(super) fn set_qos_weights(&self, name: &str, class: QosClass) -> Result<(), CgroupError> {
        let dir = self.dir_of("cpu", name).ok_or_else(|| CgroupError::NoHierarchy("no cpu hierarchy".into()))?;
        if !dir.is_dir() {
            return Err(CgroupError::Gone(dir.display().to_string()));
        }
        write_v1_qos(&dir, class)
    }

    /// Every thread of the cgroup (the cpu hierarchy's `tasks`).
    pub(super) fn threads_file(&self, name: &str) -> Option<PathBuf> {
        Some(self.dir_of("cpu", name)?.join("tasks"))
    }

    pub(super) fn procs(&self, name: &str) -> Vec<i32> {
        read_pids(&self.memory_dir(name).join("cgroup.procs"))
    }

    pub(super) fn kill_all(&self, name: &str) -> bool {
        let freezer = self.dir_of("freezer", name);
        if let Some(f) = &freezer {
            let _ = std::fs::write(f.join("freezer.state"), "FROZEN");
        }
        // A frozen process still receives SIGKILL once thawed; killing all
        // first and then thawing leaves no window to fork. Each round kills
        // what is left (a fork that raced the freeze included) and thaws.
        let emptied = super::until_empty(|| {
            let pids = self.procs(name);
            if pids.is_empty() {
                return true;
            }
            for pid in pids {
                // SAFETY: kill(2) has no memory effects; a stale pid at worst
                // fails with ESRCH.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if let Some(f) = &freezer {
                let _ = std::fs::write(f.join("freezer.state"), "THAWED");
            }
            false
        });
        // Never leave it frozen (it was empty at once, or the wait gave up):
        // whatever is attached to it later must run.
        if let Some(f) = &freezer {
            let _ = std::fs::write(f.join("freezer.state"), "THAWED");
        }
        emptied
    }

    /// Tries every hierarchy even when one refuses, so that a failure
    /// leaves as little as it can; the first error is returned.
    pub(super) fn remove(&self, name: &str) -> Result<(), CgroupError> {
        let mut first_error = None;
        for (parent, _) in &self.parents {
            if let Err(e) = rmdir_retry(&parent.join(name)) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    pub(super) fn remove_parent(&self) {
        // The pool's ready cgroups go first, or the parent is not empty.
        let pool = self.pool_lock().take();
        drop(pool);
        for (parent, _) in &self.parents {
            super::remove_empty_levels(parent, self.levels);
        }
    }

    /// Every cgroup under the parent but this run's pool (an earlier run's
    /// pool directories are listed: strays for the reaper).
    pub(super) fn list(&self) -> Vec<String> {
        let ours = self.pool_lock().as_ref().map(|p| p.run_prefix.clone());
        let mut all: Vec<String> = self
            .parents
            .iter()
            .flat_map(|(p, _)| list_dirs(p))
            .filter(|n| ours.as_ref().is_none_or(|o| !n.starts_with(o.as_str())))
            .collect();
        all.sort();
        all.dedup();
        all
    }

    pub(super) fn memory_usage(&self, name: &str) -> Option<u64> {
        read_u64(&self.memory_dir(name).join("memory.usage_in_bytes"))
    }

    pub(super) fn cpu_usage_ns(&self, name: &str) -> Option<u64> {
        read_u64(&self.dir_of("cpuacct", name)?.join("cpuacct.usage"))
    }

    pub(super) fn pids_current(&self, name: &str) -> Option<u64> {
        read_u64(&self.dir_of("pids", name)?.join("pids.current"))
    }

    pub(super) fn oom_kills(&self, name: &str) -> u64 {
        let Ok(text) = std::fs::read_to_string(self.memory_dir(name).join("memory.oom_control")) else { return 0 };
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
    }
}

impl V1Cgroups {
    pub(super) fn set_frozen(&self, name: &str, frozen: bool) -> Result<(), CgroupError> {
        let dir = self.dir_of("freezer", name).ok_or_else(|| CgroupError::NoHierarchy("no freezer".into()))?;
        write_file(&dir.join("freezer.state"), if frozen { "FROZEN" } else { "THAWED" })
    }

    pub(super) fn frozen(&self, name: &str) -> Option<bool> {
        let dir = self.dir_of("freezer", name)?;
        let state = std::fs::read_to_string(dir.join("freezer.state")).ok()?;
        Some(state.trim() == "FROZEN")
    }

    pub(super) fn set_memory_limit(&self, name: &str, bytes: u64) -> Result<(), CgroupError> {
        write_file(&self.memory_dir(name).join("memory.limit_in_bytes"), &bytes.to_string())
    }

    /// Lowers the limit of a frozen cgroup so the kernel reclaims its pages
    /// (anonymous and tmpfs ones into swap), then puts the limit back. The
    /// kernel answers EBUSY when it cannot get below the squeeze limit in
    /// one go: no swap, unswappable memory, or (often, on a busy disk)
    /// pages still being written to swap, which become free only once the
    /// write completes. So it tries again while that makes progress, until
    /// `deadline`; what was reclaimed stays reclaimed either way.
    pub(super) fn squeeze(&self, name: &str, limit_bytes: u64, deadline: std::time::Instant) -> Result<(), CgroupError> {
        let dir = self.memory_dir(name);
        let usage = || read_u64(&dir.join("memory.usage_in_bytes")).unwrap_or(0);
        write_file(&dir.join("memory.swappiness"), "100")?;
        let mut squeezed;
        let mut last = usage();
        let mut progress_at = std::time::Instant::now();
        // At least one attempt (it drops page cache even without swap).
        loop {
            squeezed = write_file(&dir.join("memory.limit_in_bytes"), &super::SQUEEZE_BYTES.to_string());
            let busy = matches!(&squeezed, Err(CgroupError::Io { source, .. }) if source.raw_os_error() == Some(libc::EBUSY));
            if !busy {
                break;
            }
            let now = usage();
            if now + (1 << 20) <= last {
                progress_at = std::time::Instant::now();
                last = now;
                continue;
            }
            // No MiB gained: pages may still be on their way to swap (they
            // are freed once written). Wait for them, but not forever.
            if progress_at.elapsed() >= SQUEEZE_PATIENCE || std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Limit reclaim drains only this CPU's batches of new pages and can
        // give up on pages not yet aged; when much is left, force_empty
        // (drains every CPU, reclaims until nothing more goes) finishes.
        // Pages briefly off the LRU (isolated by compaction or migration
        // elsewhere on the host) escape one pass: a few more, while there is
        // time.
        for _ in 0..5 {
            if usage() <= 2 * super::SQUEEZE_BYTES || std::time::Instant::now() >= deadline {
                break;
            }
            let _ = write_file(&dir.join("memory.force_empty"), "0");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let restored = self.set_memory_limit(name, limit_bytes);
        let _ = write_file(&dir.join("memory.swappiness"), "0");
        match squeezed {
            Err(CgroupError::Io { source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {}
            other => other?,
        }
        restored
    }
}

/// Writes a sandbox's limits into its directory `dir` of a hierarchy that
/// carries `ctrls`.
pub(super) fn write_limits(dir: &Path, ctrls: &[String], l: &CgroupLimits) -> Result<(), CgroupError> {
    for ctrl in ctrls {
        match ctrl.as_str() {
            "memory" => write_file(&dir.join("memory.limit_in_bytes"), &l.memory_bytes.to_string())?,
            "cpu" => {
                write_file(&dir.join("cpu.cfs_quota_us"), &l.cpu_quota_us.to_string())?;
                write_v1_qos(dir, l.qos)?;
            }
            "pids" => write_file(&dir.join("pids.max"), &l.pids.to_string())?,
            _ => {}
        }
    }
    Ok(())
}

/// Writes the class's weight into cpu directory `dir`. Where the kernel
/// has v1 `cpu.idle` (5.15), a best-effort group is made idle too: the
/// kernel then preempts it at once when a task of a non-idle group wakes
/// (shares alone only weigh it), and reports its `cpu.shares` as the idle
/// weight, 3. The kernel refuses `cpu.shares` while `cpu.idle` is 1 and
/// resets it to 1024 when `cpu.idle` goes back to 0: hence the order, and
/// nothing written for a group idle already.
fn write_v1_qos(dir: &Path, class: QosClass) -> Result<(), CgroupError> {
    let idle = dir.join("cpu.idle");
    let has_idle = idle.exists();
    let shares = || write_file(&dir.join("cpu.shares"), &class.v1_shares().to_string());
    match class {
        QosClass::LatencySensitive => {
            if has_idle {
                write_file(&idle, "0")?;
            }
            shares()
        }
        QosClass::BestEffort => {
            // Already idle: its shares cannot be written, nor need be.
            if has_idle && std::fs::read_to_string(&idle).is_ok_and(|v| v.trim() == "1") {
                return Ok(());
            }
            shares()?;
            if has_idle {
                write_file(&idle, "1")?;
            }
            Ok(())
        }
    }
}

/// How long a squeeze goes on without reclaiming anything more.
const SQUEEZE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(root: &Path, comounted: bool) -> V1Cgroups {
        let mut m = CgroupMounts::default();
        for c in ["memory", "pids", "freezer"] {
            m.v1.insert(c.into(), root.join(c));
        }
        if comounted {
            m.v1.insert("cpu".into(), root.join("cpu,cpuacct"));
            m.v1.insert("cpuacct".into(), root.join("cpu,cpuacct"));
        } else {
            m.v1.insert("cpu".into(), root.join("cpu"));
            m.v1.insert("cpuacct".into(), root.join("cpuacct"));
        }
        V1Cgroups::new(&m, "dsec/n1").unwrap()
    }

    /// Creates `sb1` with fixed limits and checks they were written.
    fn create_sb1_and_check_its_limits(cg: &V1Cgroups, root: &Path) {
        let l = CgroupLimits { memory_bytes: 64 << 20, cpu_quota_us: 50_000, pids: 100, qos: QosClass::BestEffort };
        cg.create("sb1", &l).unwrap();
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
        assert_eq!(read("memory/dsec/n1/sb1/memory.limit_in_bytes"), (64u64 << 20).to_string());
        assert_eq!(read("cpu,cpuacct/dsec/n1/sb1/cpu.cfs_quota_us"), "50000");
        assert_eq!(read("cpu,cpuacct/dsec/n1/sb1/cpu.shares"), "2", "best effort: the smallest weight");
        assert_eq!(read("pids/dsec/n1/sb1/pids.max"), "100");
    }

    #[test]
    fn writes_limits_into_each_hierarchy() {
        let t = tempfile::tempdir().unwrap();
        let cg = fake(t.path(), true);
        cg.init().unwrap();
        assert_eq!(cg.parents.len(), 4, "cpu and cpuacct share one directory");
        create_sb1_and_check_its_limits(&cg, t.path());
        let read = |p: &str| std::fs::read_to_string(t.path().join(p)).unwrap();
        cg.attach("sb1", 42).unwrap();
        assert_eq!(read("freezer/dsec/n1/sb1/cgroup.procs"), "42");
        assert_eq!(cg.list(), vec!["sb1".to_string()]);
    }

    #[test]
    fn killing_an_empty_cgroup_leaves_it_thawed() {
        let t = tempfile::tempdir().unwrap();
        let cg = fake(t.path(), true);
        cg.init().unwrap();
        create_sb1_and_check_its_limits(&cg, t.path());
        cg.kill_all("sb1");
        let state = std::fs::read_to_string(t.path().join("freezer/dsec/n1/sb1/freezer.state")).unwrap();
        assert_eq!(state, "THAWED", "a later process attached to it must run");
    }

    #[test]
    fn a_pooled_cgroup_is_renamed_into_place_and_the_pool_is_invisible() {
        let t = tempfile::tempdir().unwrap();
        let cg = fake(t.path(), true);
        cg.init().unwrap();
        cg.start_pool(2).unwrap();
        let pooled = || list_dirs(&t.path().join("memory/dsec/n1")).into_iter().filter(|n| n.starts_with("pool-")).count();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while pooled() < 2 {
            assert!(std::time::Instant::now() < deadline, "the pool never filled");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        // An earlier run's pool directory is a stray like any other.
        for h in ["memory", "cpu,cpuacct", "pids", "freezer"] {
            std::fs::create_dir(t.path().join(h).join("dsec/n1/pool-dead-0")).unwrap();
        }
        assert_eq!(cg.list(), vec!["pool-dead-0".to_string()], "this run's pool is not listed");
        create_sb1_and_check_its_limits(&cg, t.path());
        assert!(t.path().join("freezer/dsec/n1/sb1").is_dir());
        assert_eq!(cg.list(), vec!["pool-dead-0".to_string(), "sb1".to_string()]);
        for h in ["memory", "cpu,cpuacct", "pids", "freezer"] {
            std::fs::remove_dir(t.path().join(h).join("dsec/n1/pool-dead-0")).unwrap();
        }
        // Shutdown removes the pool's ready directories before the parent.
        cg.remove_parent();
        assert_eq!(pooled(), 0);
    }

    /// The class's shares are written and a task listed in the cgroup (a
    /// real child process) is switched to SCHED_IDLE and back.
    #[test]
    fn qos_class_changes_shares_and_task_policies() {
        let t = tempfile::tempdir().unwrap();
        let v1 = fake(t.path(), true);
        v1.init().unwrap();
        let cg = Cgroups::V1(v1);
        let l = CgroupLimits { memory_bytes: 64 << 20, cpu_quota_us: 50_000, pids: 100, qos: QosClass::LatencySensitive };
        cg.create("sb1", &l).unwrap();
        let dir = t.path().join("cpu,cpuacct/dsec/n1/sb1");
        let shares = || std::fs::read_to_string(dir.join("cpu.shares")).unwrap();
        assert_eq!(shares(), "1024");
        let mut child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let pid = child.id() as i32;
        std::fs::write(dir.join("tasks"), format!("{pid}\n")).unwrap();
        cg.set_qos("sb1", QosClass::BestEffort).unwrap();
        let idle = (shares(), scheduler_of(pid).unwrap());
        cg.set_qos("sb1", QosClass::LatencySensitive).unwrap();
        let back = (shares(), scheduler_of(pid).unwrap());
        // A kernel with v1 cpu.idle: the group is made idle too, and back.
        std::fs::write(dir.join("cpu.idle"), "0").unwrap();
        cg.set_qos("sb1", QosClass::BestEffort).unwrap();
        // The kernel refuses cpu.shares while the group is idle: setting
        // the class again must not write it.
        std::fs::remove_file(dir.join("cpu.shares")).unwrap();
        cg.set_qos("sb1", QosClass::BestEffort).unwrap();
        assert!(!dir.join("cpu.shares").exists(), "shares written to an idle group");
        let idle_group = std::fs::read_to_string(dir.join("cpu.idle")).unwrap();
        cg.set_qos("sb1", QosClass::LatencySensitive).unwrap();
        let back_group = std::fs::read_to_string(dir.join("cpu.idle")).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(idle, ("2".to_string(), libc::SCHED_IDLE));
        assert_eq!(back, ("1024".to_string(), libc::SCHED_OTHER));
        assert_eq!((idle_group.as_str(), back_group.as_str()), ("1", "0"));
        assert!(matches!(cg.set_qos("gone", QosClass::BestEffort), Err(CgroupError::Gone(_))));
    }

    #[test]
    fn missing_required_controller_is_an_error() {
        let mut m = CgroupMounts::default();
        m.v1.insert("memory".into(), PathBuf::from("/x"));
        let err = V1Cgroups::new(&m, "dsec").unwrap_err();
        assert!(err.to_string().contains("cpu"), "{err}");
    }
}
