//! What the benchmarks read from the host: /proc/meminfo, CPU time of
//! processes and of the whole machine, smaps_rollup, and the leak counts
//! (processes, mounts, cgroups, namespaces, files, fds).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use serde::Serialize;

/// /proc/meminfo, in kB.
pub fn meminfo() -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let v = v.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some((k.to_string(), v))
        })
        .collect()
}

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of a process (all its threads), in ms.
pub fn proc_cpu_ms(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): utime is field 14, stime field 15.
    let ut: f64 = f.get(11)?.parse().ok()?;
    let st: f64 = f.get(12)?.parse().ok()?;
    Some((ut + st) * 1000.0 / clk_tck())
}

/// Busy and total CPU time of the machine since boot, in ms (from /proc/stat).
pub fn host_cpu_ms() -> (f64, f64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().next() else {
        return (0.0, 0.0);
    };
    let v: Vec<f64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: f64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0.0) + v.get(4).copied().unwrap_or(0.0);
    let k = 1000.0 / clk_tck();
    ((total - idle) * k, total * k)
}

/// CPU used by this process and its waited-for children, in ms.
pub fn self_and_children_cpu_ms() -> (f64, f64) {
    let get = |who| {
        // SAFETY: getrusage fills a plain struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a valid pointer to that local struct.
        unsafe { libc::getrusage(who, &mut ru) };
        let tv = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    };
    (get(libc::RUSAGE_SELF), get(libc::RUSAGE_CHILDREN))
}

/// CPU time counters at one instant, to diff around a phase.
#[derive(Debug, Clone, Copy)]
pub struct CpuMark {
    pub at: std::time::Instant,
    pub server_ms: f64,
    pub self_ms: f64,
    pub children_ms: f64,
    pub host_busy_ms: f64,
}

impl CpuMark {
    pub fn now(server_pid: Option<i32>) -> Self {
        let (self_ms, children_ms) = self_and_children_cpu_ms();
        CpuMark {
            at: std::time::Instant::now(),
            server_ms: server_pid.and_then(proc_cpu_ms).unwrap_or(f64::NAN),
            self_ms,
            children_ms,
            host_busy_ms: host_cpu_ms().0,
        }
    }

    /// CPU spent between `self` and `later`, per operation.
    pub fn per_op(&self, later: &CpuMark, ops: usize) -> CpuPerOp {
        let n = ops.max(1) as f64;
        let wall = later.at.duration_since(self.at).as_secs_f64() * 1000.0;
        CpuPerOp {
            wall_ms: wall,
            server_cpu_ms_per_op: (later.server_ms - self.server_ms) / n,
            generator_cpu_ms_per_op: (later.self_ms - self.self_ms) / n,
            children_cpu_ms_per_op: (later.children_ms - self.children_ms) / n,
            host_busy_cpu_ms_per_op: (later.host_busy_ms - self.host_busy_ms) / n,
            host_busy_cores: (later.host_busy_ms - self.host_busy_ms) / wall.max(1e-9),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CpuPerOp {
    pub wall_ms: f64,
    /// The dsec process (apiserver + edge), if its pid was given.
    pub server_cpu_ms_per_op: f64,
    /// This load generator.
    pub generator_cpu_ms_per_op: f64,
    /// Processes this generator waited for (crun invocations).
    pub children_cpu_ms_per_op: f64,
    /// Everything on the machine (incl. kernel workers such as netns cleanup).
    pub host_busy_cpu_ms_per_op: f64,
    pub host_busy_cores: f64,
}

/// Bytes held by each slab cache (active objects x object size), from
/// /proc/slabinfo (root only).
pub fn slab_bytes() -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string("/proc/slabinfo").unwrap_or_default();
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let active: u64 = f.get(1)?.parse().ok()?;
            let size: u64 = f.get(3)?.parse().ok()?;
            Some((f[0].to_string(), active * size))
        })
        .collect()
}

/// Parent pid and command name of every process.
pub fn process_table() -> HashMap<i32, (i32, String)> {
    let mut out = HashMap::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        let ppid = stat[close + 2..].split_whitespace().nth(1).and_then(|x| x.parse().ok()).unwrap_or(0);
        out.insert(pid, (ppid, comm));
    }
    out
}

/// Every process below `root` (not `root` itself).
pub fn descendants(table: &HashMap<i32, (i32, String)>, root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, (ppid, _)) in table {
        children.entry(*ppid).or_default().push(*pid);
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        if let Some(c) = children.get(&p) {
            for &k in c {
                out.push(k);
                stack.push(k);
            }
        }
    }
    out
}

/// smaps_rollup of one process, in kB (Rss, Pss, Private_Dirty, ...).
pub fn smaps_rollup(pid: i32) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_string(), v.trim().trim_end_matches("kB").trim().parse().ok()?))
        })
        .collect()
}

/// VmRSS etc. from /proc/PID/status, in kB.
pub fn status_kb(pid: i32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// What a create/destroy cycle could leave behind.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Counts {
    /// Every process on the host (other users of the machine add noise).
    pub processes_host: usize,
    /// Processes below the dsec process.
    pub processes_under_dsec: usize,
    /// `dsec-agent` processes anywhere.
    pub agent_processes: usize,
    /// Lines of /proc/self/mountinfo (the host's mount table).
    pub mounts_host: usize,
    /// Lines of /proc/DSEC_PID/mountinfo.
    pub mounts_dsec: usize,
    /// Host mounts whose mount point is under the data dir (the layers).
    pub mounts_data_dir: usize,
    /// Directories under /sys/fs/cgroup/*/dsec* (every node's, recursively).
    pub cgroups_dsec: usize,
    /// Directories under /sys/fs/cgroup/*/dsec/NODE (this node's sandboxes).
    pub cgroups_node: usize,
    pub net_namespaces: usize,
    pub mnt_namespaces: usize,
    pub pid_namespaces: usize,
    /// Files (not directories) under the data dir, databases excluded.
    pub data_dir_files: usize,
    pub data_dir_dirs: usize,
    pub dsec_open_fds: usize,
    /// Of which sockets (TCP connections of API clients, agent channels).
    pub dsec_fds_sockets: usize,
    /// Of which pidfds (one or two per live sandbox).
    pub dsec_fds_pidfds: usize,
    /// Of which network namespaces: the edge keeps up to `--prewarm` (16)
    /// made ahead, refilled in the background, so their number moves
    /// between samples without anything leaking.
    pub dsec_fds_netns: usize,
    /// Of which the platform's SQLite files (`*.db`, `-wal`, `-shm`): a
    /// database's checkpointer opens its own connection the first time
    /// its WAL fills, so these grow once, by a bounded number.
    pub dsec_fds_db: usize,
    pub dsec_threads: usize,
}

fn count_dirs(p: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten().filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false)).map(|e| 1 + count_dirs(&e.path())).sum()
}

/// Like `find -xdev`: mounted file systems under `p` (the edge's layer
/// mounts) are not descended into; their mount points count as directories.
fn count_files(p: &Path, dev: u64, files: &mut usize, dirs: &mut usize) {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(p) else { return };
    for e in rd.flatten() {
        let Ok(t) = e.file_type() else { continue };
        let name = e.file_name().to_string_lossy().to_string();
        if t.is_dir() {
            *dirs += 1;
            if e.metadata().map(|m| m.dev() == dev).unwrap_or(false) {
                count_files(&e.path(), dev, files, dirs);
            }
        } else if !(name.ends_with(".db") || name.ends_with(".db-wal") || name.ends_with(".db-shm") || name.ends_with(".db-journal")) {
            *files += 1;
        }
    }
}

fn distinct_ns(kind: &str) -> usize {
    let mut set = HashSet::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().parse::<i32>().is_err() {
                continue;
            }
            if let Ok(l) = std::fs::read_link(e.path().join("ns").join(kind)) {
                set.insert(l);
            }
        }
    }
    set.len()
}

pub fn counts(dsec_pid: Option<i32>, data_dir: Option<&Path>, node: Option<&str>) -> Counts {
    let table = process_table();
    let under = dsec_pid.map(|p| descendants(&table, p).len()).unwrap_or(0);
    let agents = table.values().filter(|(_, c)| c == "dsec-agent").count();
    let lines = |p: &str| std::fs::read_to_string(p).map(|t| t.lines().count()).unwrap_or(0);
    let mut cg_all = 0;
    let mut cg_node = 0;
    if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
        for h in rd.flatten() {
            if let Ok(rd2) = std::fs::read_dir(h.path()) {
                for e in rd2.flatten() {
                    let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
                    if is_dir && e.file_name().to_string_lossy().starts_with("dsec") {
                        cg_all += 1 + count_dirs(&e.path());
                    }
                }
            }
            if let Some(n) = node {
                cg_node += count_dirs(&h.path().join("dsec").join(n));
            }
        }
    }
    let (mut files, mut dirs) = (0, 0);
    if let Some(d) = data_dir {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata(d) {
            count_files(d, m.dev(), &mut files, &mut dirs);
        }
    }
    let (mut fds, mut sockets, mut pidfds, mut netns, mut db) = (0, 0, 0, 0, 0);
    if let Some(rd) = dsec_pid.and_then(|p| std::fs::read_dir(format!("/proc/{p}/fd")).ok()) {
        for e in rd.flatten() {
            fds += 1;
            let l = std::fs::read_link(e.path()).map(|l| l.to_string_lossy().to_string()).unwrap_or_default();
            if l.starts_with("socket:") {
                sockets += 1;
            } else if l.contains("pidfd") {
                pidfds += 1;
            } else if l.starts_with("net:[") {
                netns += 1;
            } else if [".db", ".db-wal", ".db-shm"].iter().any(|s| l.ends_with(s)) {
                db += 1;
            }
        }
    }
    let threads = dsec_pid.and_then(|p| status_kb(p, "Threads")).unwrap_or(0) as usize;
    Counts {
        processes_host: table.len(),
        processes_under_dsec: under,
        agent_processes: agents,
        mounts_host: lines("/proc/self/mountinfo"),
        mounts_dsec: dsec_pid.map(|p| lines(&format!("/proc/{p}/mountinfo"))).unwrap_or(0),
        mounts_data_dir: data_dir
            .map(|d| {
                let d = d.to_string_lossy().to_string();
                std::fs::read_to_string("/proc/self/mountinfo")
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.split(' ').nth(4).map(|mp| mp.starts_with(&d)).unwrap_or(false))
                    .count()
            })
            .unwrap_or(0),
        cgroups_dsec: cg_all,
        cgroups_node: cg_node,
        net_namespaces: distinct_ns("net"),
        mnt_namespaces: distinct_ns("mnt"),
        pid_namespaces: distinct_ns("pid"),
        data_dir_files: files,
        data_dir_dirs: dirs,
        dsec_open_fds: fds,
        dsec_fds_sockets: sockets,
        dsec_fds_pidfds: pidfds,
        dsec_fds_netns: netns,
        dsec_fds_db: db,
        dsec_threads: threads,
    }
}

impl Counts {
    /// The counts only this platform can change (host-wide ones also move
    /// with other users of a shared machine).
    /// dsec_threads is here so the count waits for the runtime's idle
    /// blocking threads (used by the exit watchers) to time out (10 s).
    pub fn own(&self) -> [usize; 8] {
        [
            self.dsec_threads,
            self.processes_under_dsec,
            self.mounts_data_dir,
            self.cgroups_node,
            self.data_dir_files,
            self.data_dir_dirs,
            // The made-ahead namespaces and the database files are
            // bounded and checked apart.
            self.dsec_open_fds - self.dsec_fds_netns - self.dsec_fds_db,
            self.dsec_fds_pidfds,
        ]
    }
}
