//! The cgroup v2 driver against the real cgroup2 mount of this host.
//!
//! The development machines are hybrid: the controllers are bound to v1
//! hierarchies and the cgroup2 mount at /sys/fs/cgroup/unified carries none.
//! The v2 mechanics that do not depend on controllers (the tree, attaching,
//! listing, membership through /proc, cgroup.kill, removal) are still real
//! there, so they are tested for real with a driver that does not require
//! controllers; what does depend on them is asserted as it is on this host
//! (no limit files, no memory accounting, `Cgroups::open` refusing v2).
//! Needs root. Every test works in its own top-level cgroup, removed in Drop
//! with whatever is in it.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dsec_edge::cgroup::{find_cgroup_mounts, CgroupError, CgroupLimits, CgroupMode, Cgroups, V2Cgroups};

const ROOT: &str = "/sys/fs/cgroup/unified";
const NEEDED: [&str; 3] = ["memory", "cpu", "pids"];

fn hex_id() -> String {
    let mut b = [0u8; 6];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b)).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Controllers the cgroup2 root offers.
fn available() -> Vec<String> {
    std::fs::read_to_string(Path::new(ROOT).join("cgroup.controllers")).unwrap().split_whitespace().map(str::to_string).collect()
}

fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// This test's own top-level cgroup (`dsec-test-v2-<random>`) and the
/// processes it started; Drop kills them (by PID, then through cgroup.kill
/// of every cgroup below the top) and removes the whole subtree.
struct Scratch {
    top: PathBuf,
    children: Vec<Child>,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch { top: Path::new(ROOT).join(format!("dsec-test-v2-{}", hex_id())), children: Vec::new() }
    }

    /// The driver's parent, relative to the root: two levels, like `dsec/<node>`.
    fn parent_rel(&self) -> String {
        format!("{}/node", self.top.file_name().unwrap().to_string_lossy())
    }

    fn parent(&self) -> PathBuf {
        self.top.join("node")
    }

    fn spawn(&mut self, cmd: &mut Command) -> usize {
        self.children.push(cmd.spawn().expect("spawn"));
        self.children.len() - 1
    }

    fn pid(&self, i: usize) -> i32 {
        self.children[i].id() as i32
    }

    /// Every cgroup below `dir`, deepest first, `dir` last.
    fn post_order(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.path().is_dir() {
                    Self::post_order(&e.path(), out);
                }
            }
        }
        if dir.is_dir() {
            out.push(dir.to_path_buf());
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let mut dirs = Vec::new();
        Self::post_order(&self.top, &mut dirs);
        for d in &dirs {
            let _ = std::fs::write(d.join("cgroup.kill"), "1");
        }
        for d in &dirs {
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::fs::remove_dir(d).is_err() && d.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

fn sleeper() -> Command {
    let mut c = Command::new("sleep");
    c.arg("60").stdin(Stdio::null());
    c
}

#[test]
fn the_v2_driver_on_the_real_cgroup2_mount() {
    let mounts = find_cgroup_mounts(Path::new("/proc/self/mountinfo")).unwrap();
    assert_eq!(mounts.v2.as_deref(), Some(Path::new(ROOT)), "the cgroup2 mount this test drives");
    let avail = available();
    let mut s = Scratch::new();

    // init: the parent exists (two levels deep) and gets whatever
    // controllers the root offers delegated down to it; idempotent.
    let v2 = V2Cgroups::new(PathBuf::from(ROOT), &s.parent_rel(), false).unwrap();
    v2.init().unwrap();
    v2.init().unwrap();
    assert!(s.parent().is_dir());
    let delegated = std::fs::read_to_string(s.parent().join("cgroup.subtree_control")).unwrap();
    for c in NEEDED {
        assert_eq!(
            delegated.split_whitespace().any(|d| d == c),
            avail.iter().any(|a| a == c),
            "{c} in {delegated:?} (root offers {avail:?})"
        );
    }
    let cg = Cgroups::V2(v2);
    assert_eq!(cg.version(), 2);
    assert!(cg.list().is_empty());

    // create: a directory; limits written where the controller is delegated,
    // skipped (not an error) where it is not. A leftover is reused.
    let limits = CgroupLimits { memory_bytes: 64 << 20, cpu_quota_us: 50_000, pids: 64, qos: Default::default() };
    cg.create("sb1", &limits).unwrap();
    cg.create("sb1", &limits).unwrap();
    let sb1 = s.parent().join("sb1");
    assert!(sb1.is_dir());
    for (file, ctrl, want) in [("memory.max", "memory", "67108864"), ("cpu.max", "cpu", "50000 100000"), ("pids.max", "pids", "64")] {
        if avail.iter().any(|a| a == ctrl) {
            assert_eq!(std::fs::read_to_string(sb1.join(file)).unwrap().trim(), want);
        } else {
            assert!(!sb1.join(file).exists(), "{file} exists without the {ctrl} controller");
        }
    }
    assert!(sb1.join("cgroup.kill").exists(), "this kernel has no cgroup.kill (5.14+)");

    // attach: a real process moves in; procs, /proc/PID/cgroup and contains agree.
    let sleep = s.spawn(&mut sleeper());
    let pid = s.pid(sleep);
    cg.attach("sb1", pid).unwrap();
    assert_eq!(cg.procs("sb1"), vec![pid]);
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(own.lines().any(|l| l == format!("0::/{}/sb1", s.parent_rel())), "{own}");
    assert!(cg.contains("sb1", pid));
    assert!(!cg.contains("sb2", pid));
    assert!(!cg.contains("sb1", std::process::id() as i32));
    assert!(matches!(cg.attach("missing", pid), Err(CgroupError::Io { .. })));
    assert!(cg.procs("missing").is_empty());

    // Accounting follows the controllers.
    if avail.iter().any(|a| a == "memory") {
        assert!(cg.memory_usage("sb1").is_some());
    } else {
        assert_eq!(cg.memory_usage("sb1"), None, "no memory.current without the memory controller");
    }
    assert_eq!(cg.oom_kills("sb1"), 0);

    // A populated cgroup cannot be removed (the kernel says EBUSY, and the
    // driver reports it after its retries).
    match cg.remove("sb1") {
        Err(CgroupError::Io { source, .. }) => assert_eq!(source.raw_os_error(), Some(libc::EBUSY), "{source}"),
        other => panic!("removing a populated cgroup: {other:?}"),
    }
    assert!(sb1.is_dir());
    assert_eq!(cg.procs("sb1"), vec![pid]);

    // kill_all: the process dies of SIGKILL and the cgroup empties.
    cg.kill_all("sb1");
    let status = s.children[sleep].wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(cg.procs("sb1").is_empty());
    assert!(!cg.contains("sb1", pid));

    // kill_all of a cgroup whose process keeps forking: cgroup.kill takes
    // the whole tree at once, children forked meanwhile included.
    cg.create("sb2", &limits).unwrap();
    let mut forker = Command::new("sh");
    forker
        .args(["-c", "read go; i=0; while [ $i -lt 400 ]; do sleep 60 & i=$((i+1)); done; wait"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
    let f = s.spawn(&mut forker);
    cg.attach("sb2", s.pid(f)).unwrap();
    s.children[f].stdin.take().unwrap().write_all(b"go\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while cg.procs("sb2").len() < 20 {
        assert!(Instant::now() < deadline, "the forking shell did not start forking");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut names = cg.list();
    names.sort();
    assert_eq!(names, vec!["sb1".to_string(), "sb2".to_string()]);
    cg.kill_all("sb2");
    let deadline = Instant::now() + Duration::from_secs(2);
    while !cg.procs("sb2").is_empty() {
        assert!(Instant::now() < deadline, "processes survived kill_all: {:?}", cg.procs("sb2"));
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(cg.procs("sb2").is_empty(), "something forked after kill_all: {:?}", cg.procs("sb2"));
    assert_eq!(s.children[f].wait().unwrap().signal(), Some(libc::SIGKILL));

    // remove: gone, idempotent, and the list is empty again.
    cg.remove("sb1").unwrap();
    cg.remove("sb2").unwrap();
    cg.remove("sb1").unwrap();
    assert!(!sb1.exists() && !s.parent().join("sb2").exists());
    assert!(cg.list().is_empty());
    assert!(procs(&s.parent()).is_empty());
}

#[test]
fn open_in_v2_mode_needs_the_controllers() {
    let s = Scratch::new();
    let avail = available();
    let has_all = NEEDED.iter().all(|c| avail.iter().any(|a| a == c));
    let strict = V2Cgroups::new(PathBuf::from(ROOT), &s.parent_rel(), true).unwrap();
    match (Cgroups::open(CgroupMode::V2, &s.parent_rel()), has_all) {
        (Ok(cg), true) => {
            assert_eq!(cg.version(), 2);
            strict.init().unwrap();
        }
        (Err(CgroupError::NoHierarchy(msg)), false) => {
            // This host: the controllers live in v1 hierarchies, so a v2
            // edge would enforce no limit. It must refuse, creating nothing.
            assert!(msg.contains(ROOT) && msg.contains("memory, cpu and pids are needed"), "{msg}");
            assert!(!s.top.exists(), "a refused open created {}", s.top.display());
            assert!(matches!(strict.init(), Err(CgroupError::NoHierarchy(_))));
            assert!(!s.top.exists());
        }
        (other, _) => panic!("Cgroups::open(V2) with root controllers {avail:?}: {other:?}"),
    }
}
