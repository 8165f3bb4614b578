//! CPU QoS classes: how much a sandbox's tasks count when the node's CPUs
//! are contended.
//!
//! A `latency_sensitive` sandbox (an agent's rollout the trainer waits on)
//! keeps the kernel's default weight; a `best_effort` one (background
//! builds, batch work) runs only on CPU time the others leave. The class
//! maps to each cgroup version's own mechanism:
//!
//! | class | cgroup v2 | cgroup v1 |
//! |---|---|---|
//! | latency_sensitive | `cpu.idle` 0, `cpu.weight` 100 | `cpu.idle` 0, `cpu.shares` 1024, tasks `SCHED_OTHER` |
//! | best_effort | `cpu.idle` 1 (the weight is then the kernel's minimum) | `cpu.shares` 2, `cpu.idle` 1 (5.15+), tasks `SCHED_IDLE` |
//!
//! On v2 `cpu.idle` makes the whole group an idle entity against its
//! siblings, so no task needs changing. v1 has `cpu.idle` only from 5.15
//! and weights otherwise (`cpu.shares` 2 is the smallest), so each task of
//! a best-effort sandbox is also set to `SCHED_IDLE`: inside its group it
//! then has the idle weight, and every process it forks inherits the
//! policy. Tasks present
//! when the class changes are switched by [`set_task_policies`]; switching
//! back restores `SCHED_OTHER` (a task's nice value is kept).
//!
//! Core scheduling (`prctl(PR_SCHED_CORE)`, Linux 5.14 with SMT) gives
//! each latency-sensitive sandbox a cookie of its own, so its tasks never
//! share a physical core with another sandbox's: see [`core_sched`].

use std::path::Path;

use serde::{Deserialize, Serialize};

/// A sandbox's CPU QoS class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QosClass {
    /// Default weight; a core-scheduling cookie of its own where the
    /// kernel has core scheduling.
    #[default]
    LatencySensitive,
    /// Runs on what latency-sensitive sandboxes leave.
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::LatencySensitive => "latency_sensitive",
            QosClass::BestEffort => "best_effort",
        }
    }

    /// The v1 `cpu.shares` of the class.
    pub fn v1_shares(self) -> u64 {
        match self {
            QosClass::LatencySensitive => 1024,
            // The kernel's minimum (MIN_SHARES).
            QosClass::BestEffort => 2,
        }
    }

    /// The v2 files of the class, in the order they must be written: the
    /// kernel refuses a `cpu.weight` write while `cpu.idle` is 1, and
    /// resets the weight to 100 when `cpu.idle` goes back to 0.
    pub fn v2_files(self) -> &'static [(&'static str, &'static str)] {
        match self {
            QosClass::LatencySensitive => &[("cpu.idle", "0"), ("cpu.weight", "100")],
            QosClass::BestEffort => &[("cpu.idle", "1")],
        }
    }

    /// Whether the class asks for `SCHED_IDLE` tasks (on v1).
    pub fn idle_tasks(self) -> bool {
        self == QosClass::BestEffort
    }
}

impl std::str::FromStr for QosClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "latency_sensitive" => Ok(QosClass::LatencySensitive),
            "best_effort" => Ok(QosClass::BestEffort),
            other => Err(format!("qos_class must be latency_sensitive or best_effort, not {other:?}")),
        }
    }
}

/// Tasks whose policy a pass switched, and those it could not (gone
/// between the listing and the call: ESRCH, not counted).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PolicyPass {
    pub switched: usize,
    pub failed: usize,
}

/// How many listing passes [`set_task_policies`] makes at most: a task
/// forked by one not yet switched can appear after the listing, so passes
/// repeat until one finds nothing left to switch.
const MAX_PASSES: usize = 8;

/// Sets every thread listed in `tasks_file` (v1 `tasks`, v2
/// `cgroup.threads`) to `SCHED_IDLE` (`idle`) or back from it to
/// `SCHED_OTHER`. Passes repeat until one switches nothing, so a process
/// forked during the walk by a task not yet switched is switched too
/// (later forks inherit the policy). A thread with another policy than
/// the two (`SCHED_BATCH` a program chose) is left alone on the way back.
pub fn set_task_policies(tasks_file: &Path, idle: bool) -> std::io::Result<PolicyPass> {
    let mut total = PolicyPass::default();
    for _ in 0..MAX_PASSES {
        let text = match std::fs::read_to_string(tasks_file) {
            Ok(t) => t,
            // The cgroup is gone: its tasks with it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(total),
            Err(e) => return Err(e),
        };
        let mut pass = PolicyPass::default();
        for tid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            match switch_one(tid, idle) {
                Ok(true) => pass.switched += 1,
                Ok(false) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(_) => pass.failed += 1,
            }
        }
        total.switched += pass.switched;
        total.failed = pass.failed;
        if pass.switched == 0 {
            break;
        }
    }
    if total.failed > 0 {
        return Err(std::io::Error::other(format!("{} task(s) of the sandbox refused the scheduling policy", total.failed)));
    }
    Ok(total)
}

/// Switches one thread; `Ok(false)` if it already had the wanted policy.
fn switch_one(tid: i32, idle: bool) -> std::io::Result<bool> {
    let current = scheduler_of(tid)?;
    // SCHED_RESET_ON_FORK is or'ed into the answer; compare the policy.
    let policy = current & !libc::SCHED_RESET_ON_FORK;
    let target = match (idle, policy) {
        (true, libc::SCHED_IDLE) => return Ok(false),
        (true, _) => libc::SCHED_IDLE,
        (false, libc::SCHED_IDLE) => libc::SCHED_OTHER,
        (false, _) => return Ok(false),
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads `param`, which lives across the call.
    if unsafe { libc::sched_setscheduler(tid, target, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(true)
}

/// A thread's scheduling policy (`SCHED_*`).
pub fn scheduler_of(tid: i32) -> std::io::Result<i32> {
    // SAFETY: sched_getscheduler takes a plain id and touches no memory.
    let p = unsafe { libc::sched_getscheduler(tid) };
    if p < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p)
}

pub mod core_sched {
    //! Core-scheduling cookies (`prctl(PR_SCHED_CORE)`): tasks with
    //! different cookies never run on the two hyperthreads of one core at
    //! once, so a latency-sensitive sandbox does not share a core's
    //! execution units with a burner (nor leak through them).
    //!
    //! Needs a kernel built with CONFIG_SCHED_CORE (EINVAL without) on a
    //! CPU with SMT on (ENODEV without: a core runs one task anyway, so
    //! there is nothing to separate). Where it is missing the class still
    //! maps to weights and policies; [`support`] says why.

    use std::path::Path;

    const PR_SCHED_CORE: libc::c_int = 62;
    const GET: libc::c_ulong = 0;
    const CREATE: libc::c_ulong = 1;
    const SHARE_TO: libc::c_ulong = 2;
    const SHARE_FROM: libc::c_ulong = 3;
    /// `PIDTYPE_PID`: the one thread named.
    const SCOPE_THREAD: libc::c_ulong = 0;

    /// Whether cookies can be set on this host, and if not, why.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Support {
        Available,
        Unavailable(String),
    }

    fn prctl(cmd: libc::c_ulong, tid: i32, addr: libc::c_ulong) -> std::io::Result<()> {
        // SAFETY: PR_SCHED_CORE reads its scalar arguments; only GET writes,
        // through `addr`, which its caller points at a live u64.
        let r = unsafe { libc::prctl(PR_SCHED_CORE, cmd, tid as libc::c_ulong, SCOPE_THREAD, addr) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// [`support`], asked once per process.
    pub fn available() -> bool {
        static SUPPORT: std::sync::OnceLock<Support> = std::sync::OnceLock::new();
        *SUPPORT.get_or_init(support) == Support::Available
    }

    /// Asks the kernel for the calling thread's cookie.
    pub fn support() -> Support {
        let mut cookie: u64 = 0;
        match prctl(GET, 0, &mut cookie as *mut u64 as libc::c_ulong) {
            Ok(()) => Support::Available,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                Support::Unavailable("the kernel has no core scheduling (CONFIG_SCHED_CORE)".into())
            }
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
                Support::Unavailable("the CPUs run without SMT (one thread per core: nothing to separate)".into())
            }
            Err(e) => Support::Unavailable(format!("PR_SCHED_CORE_GET failed: {e}")),
        }
    }

    /// Gives every thread in `tasks_file` one new cookie (`Some`), or clears
    /// theirs (`None`). Runs on a thread of its own: sharing a cookie goes
    /// through the caller's thread (SHARE_FROM, then SHARE_TO each), and a
    /// fresh thread has none, which is what SHARE_TO pushes to clear.
    pub fn set_cookie(tasks_file: &Path, cookie: bool) -> std::io::Result<()> {
        let file = tasks_file.to_path_buf();
        std::thread::Builder::new()
            .name("dsec-core-sched".into())
            .spawn(move || {
                let text = match std::fs::read_to_string(&file) {
                    Ok(t) => t,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(e),
                };
                let tids: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
                let Some(&first) = tids.first() else { return Ok(()) };
                if cookie {
                    prctl(CREATE, first, 0)?;
                    prctl(SHARE_FROM, first, 0)?;
                }
                for &tid in tids.iter().skip(usize::from(cookie)) {
                    match prctl(SHARE_TO, tid, 0) {
                        Err(e) if e.raw_os_error() != Some(libc::ESRCH) => return Err(e),
                        _ => {}
                    }
                }
                Ok(())
            })?
            .join()
            .map_err(|_| std::io::Error::other("the core-scheduling thread panicked"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_round_trip_and_bad_ones_are_refused() {
        for c in [QosClass::LatencySensitive, QosClass::BestEffort] {
            assert_eq!(c.as_str().parse::<QosClass>().unwrap(), c);
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{}\"", c.as_str()));
        }
        let err = "realtime".parse::<QosClass>().unwrap_err();
        assert!(err.contains("latency_sensitive or best_effort"), "{err}");
    }

    /// A real child process listed in a fake `tasks` file is switched to
    /// SCHED_IDLE and back; its forks would inherit (checked end to end).
    #[test]
    fn task_policies_switch_to_idle_and_back() {
        let t = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let pid = child.id() as i32;
        let tasks = t.path().join("tasks");
        std::fs::write(&tasks, format!("{pid}\n")).unwrap();
        let pass = set_task_policies(&tasks, true).unwrap();
        assert_eq!(pass.switched, 1);
        assert_eq!(scheduler_of(pid).unwrap(), libc::SCHED_IDLE);
        assert_eq!(set_task_policies(&tasks, true).unwrap().switched, 0, "already idle: nothing to do");
        set_task_policies(&tasks, false).unwrap();
        assert_eq!(scheduler_of(pid).unwrap(), libc::SCHED_OTHER);
        child.kill().unwrap();
        child.wait().unwrap();
        // A cgroup removed meanwhile has no task left to switch.
        assert_eq!(set_task_policies(&t.path().join("gone/tasks"), true).unwrap(), PolicyPass::default());
    }

    /// What `support` says is what setting a cookie does: where it is
    /// unavailable the attempt fails (the edge then does not try), where it
    /// is available a cookie is set and cleared.
    #[test]
    fn core_scheduling_support_matches_what_setting_a_cookie_does() {
        let t = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let tasks = t.path().join("tasks");
        std::fs::write(&tasks, format!("{}\n", child.id())).unwrap();
        match core_sched::support() {
            core_sched::Support::Available => {
                core_sched::set_cookie(&tasks, true).unwrap();
                core_sched::set_cookie(&tasks, false).unwrap();
            }
            core_sched::Support::Unavailable(why) => {
                assert!(why.contains("core scheduling") || why.contains("SMT") || why.contains("PR_SCHED_CORE"), "{why}");
                assert!(core_sched::set_cookie(&tasks, true).is_err(), "{why}, yet a cookie was set");
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
