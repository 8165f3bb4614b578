//! The edge against the real kernel: namespaces, cgroups, EROFS + overlay,
//! the real guest agent. Needs root (CI runs as root).
//!
//! All tests share one busybox image (built once into a temp store) and
//! each starts its own edge with a unique node name, so cgroups never
//! collide; every test checks it leaves nothing behind.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dsec_agent_proto::{Command, ExecSpec, Stdin};
use dsec_edge::cgroup::CgroupMode;
use dsec_edge::{Caller, Edge, EdgeConfig, EdgeError, ImageLayers, ListFilter, SandboxRequest, State};

struct Fixture {
    dir: tempfile::TempDir,
    images: PathBuf,
}

static FIXTURE: OnceLock<Fixture> = OnceLock::new();

/// One image store with the busybox image, for the whole test binary.
fn images() -> &'static Path {
    &FIXTURE
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let images = dir.path().join("images");
            let store = dsec_image::ImageStore::open(&images).unwrap();
            dsec_image::build_default_image(&store, dsec_image::DefaultImage::Busybox, &dsec_image::NoProgress, "").unwrap();
            // A static is never dropped, and neither would its TempDir be:
            // the store is removed when the test binary exits instead.
            // SAFETY: registers a plain `extern "C"` function with no
            // arguments, which is all atexit asks for.
            unsafe { libc::atexit(remove_fixture) };
            Fixture { dir, images }
        })
        .images
}

extern "C" fn remove_fixture() {
    if let Some(f) = FIXTURE.get() {
        let _ = std::fs::remove_dir_all(f.dir.path());
    }
}

fn agent_path() -> PathBuf {
    if let Some(p) = std::env::var_os("DSEC_AGENT") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/this-test -> target/<profile>/dsec-agent
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("dsec-agent")
}

struct TestEdge {
    edge: Edge,
    state: tempfile::TempDir,
    node: String,
}

impl TestEdge {
    async fn start(tweak: impl FnOnce(&mut EdgeConfig)) -> TestEdge {
        let state = tempfile::tempdir().unwrap();
        let node = format!("t{}", &hex_id()[..10]);
        let layers = Arc::new(ImageLayers::open(images(), &state.path().join("layers")).unwrap());
        let mut cfg = EdgeConfig::for_host(&node, state.path().join("edge"), agent_path());
        cfg.cgroup_mode = CgroupMode::Auto;
        cfg.cgroup_parent = format!("dsec-test/{node}");
        cfg.stop_sandboxes_on_shutdown = true;
        cfg.sweep_interval = Duration::from_millis(100);
        tweak(&mut cfg);
        let edge = Edge::start(cfg, layers).await.expect("edge starts");
        TestEdge { edge, state, node }
    }

    /// Stops everything and asserts nothing is left: no cgroup, no agent
    /// process, no mount under the edge's state dir but the node's layer
    /// cache (the layers directory and its layer mounts).
    async fn finish(self) {
        self.edge.shutdown().await;
        let cg = format!("/sys/fs/cgroup/memory/dsec-test/{}", self.node);
        let leftovers: Vec<_> = std::fs::read_dir(&cg)
            .map(|rd| rd.filter_map(|e| e.ok()).filter(|e| e.path().is_dir()).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(leftovers.is_empty(), "cgroups left behind: {leftovers:?}");
        let layers = self.state.path().join("layers").display().to_string();
        let ours: Vec<String> = state_mounts(self.state.path()).into_iter().filter(|m| !m.starts_with(&layers)).collect();
        assert!(ours.is_empty(), "mounts left behind: {ours:?}");
    }
}

/// Whatever a test leaves (a failed assertion included) is removed here:
/// processes in the node's cgroups, the cgroups, and every mount under the
/// edge's state dir.
impl Drop for TestEdge {
    fn drop(&mut self) {
        const CONTROLLERS: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "freezer"];
        let parent = |ctrl: &str| PathBuf::from(format!("/sys/fs/cgroup/{ctrl}/dsec-test/{}", self.node));
        let children = |ctrl: &str| -> Vec<PathBuf> {
            std::fs::read_dir(parent(ctrl)).map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect()).unwrap_or_default()
        };
        // Kill everything first (in every hierarchy: a paused sandbox's
        // processes act on SIGKILL only once thawed)...
        for ctrl in CONTROLLERS {
            for child in children(ctrl) {
                let _ = std::fs::write(child.join("freezer.state"), "THAWED");
                let procs = std::fs::read_to_string(child.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    // SAFETY: kill(2) of processes in this test's own cgroups.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        // ...then remove the cgroups, waiting for the dying processes (and
        // for an edge that may still be removing some itself), the node's
        // own level, and the shared top level if this was the last test.
        for ctrl in CONTROLLERS {
            for _ in 0..400 {
                let left = children(ctrl);
                if left.is_empty() {
                    break;
                }
                for child in left {
                    let _ = std::fs::remove_dir(child);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = std::fs::remove_dir(parent(ctrl));
            let _ = std::fs::remove_dir(format!("/sys/fs/cgroup/{ctrl}/dsec-test"));
        }
        // Host swap is never left on, even when a test failed half-way.
        let _ = dsec_edge::pause::swap::disable_path(&self.state.path().join("swapfile"));
        // An edge that never shut down (a failed test) leaves its node lock.
        let _ = std::fs::remove_file(format!("/run/dsec/node-{}.lock", self.node));
        let mut mounts = state_mounts(self.state.path());
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mp in mounts {
            let c = std::ffi::CString::new(mp).unwrap();
            // SAFETY: umount2 of a mount point under this test's temp dir.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Mount points under `dir`, from /proc/self/mountinfo.
fn state_mounts(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|mp| mp.starts_with(&prefix))
        .collect()
}

fn hex_id() -> String {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b)).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn busybox() -> SandboxRequest {
    SandboxRequest { image: "busybox".into(), memory_mb: Some(64), cpu_cores: Some(0.5), ..Default::default() }
}

fn sh(cmd: &str) -> ExecSpec {
    ExecSpec {
        command: Command::Shell(cmd.into()),
        env: vec![],
        cwd: None,
        user: None,
        stdin: Stdin::Null,
        stream_output: false,
        timeout_ms: Some(10_000),
        kill_grace_ms: 500,
        max_output_bytes: 1 << 20,
        session: None,
    }
}

async fn out(edge: &Edge, id: &str, cmd: &str) -> String {
    let r = edge.exec(&Caller::tenant("t"), id, sh(cmd)).await.expect("exec");
    assert_eq!(r.exit_code, Some(0), "{cmd}: {}", String::from_utf8_lossy(&r.stderr));
    String::from_utf8(r.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_exec_isolate_stop_delete() {
    let t = TestEdge::start(|_| {}).await;
    let me = Caller::tenant("t");
    let sb = t.edge.create(&me, busybox()).await.expect("create");
    assert_eq!(sb.state, State::Running);
    assert!(sb.id.starts_with(&format!("{}.", t.node)));

    assert_eq!(out(&t.edge, &sb.id, "echo hello world").await, "hello world\n");
    // Its own hostname, pid namespace (the agent is PID 1), and loopback only.
    assert_eq!(out(&t.edge, &sb.id, "hostname").await.trim(), dsec_edge::ids::short_id(&sb.id));
    assert!(out(&t.edge, &sb.id, "cat /proc/1/cmdline").await.contains("dsec-agent"));
    let ifaces = out(&t.edge, &sb.id, "ls /sys/class/net").await;
    assert_eq!(ifaces.split_whitespace().collect::<Vec<_>>(), vec!["lo"]);
    // The root is an overlay whose writes land in the sandbox's own upper.
    out(&t.edge, &sb.id, "echo x > /etc/written && cat /etc/written").await;
    assert!(out(&t.edge, &sb.id, "cat /proc/mounts").await.contains("overlay / overlay"));
    // Masked and read-only paths.
    assert_eq!(out(&t.edge, &sb.id, "wc -c < /proc/kpagecgroup").await.trim(), "0");
    let r = t.edge.exec(&me, &sb.id, sh("echo 1 > /proc/sys/kernel/core_pattern")).await.unwrap();
    assert_ne!(r.exit_code, Some(0), "/proc/sys must be read-only");

    // Root in the sandbox cannot make device nodes (no CAP_MKNOD), and the
    // root filesystem would not honour one anyway (nodev).
    let r = t.edge.exec(&me, &sb.id, sh("mknod /tmp/disk b 8 0")).await.unwrap();
    assert_ne!(r.exit_code, Some(0), "mknod must fail");
    assert!(out(&t.edge, &sb.id, "grep ' / / ' /proc/self/mountinfo").await.contains("nodev"));
    // Masked directories are empty and read-only.
    assert_eq!(out(&t.edge, &sb.id, "ls -A /sys/firmware | wc -l").await.trim(), "0");
    let r = t.edge.exec(&me, &sb.id, sh("touch /sys/firmware/x")).await.unwrap();
    assert_ne!(r.exit_code, Some(0));
    // Few filesystems of its own (each costs kernel memory in every memory
    // cgroup of the host): the writable tmpfs, the overlay, proc, sysfs,
    // devpts, and the mqueue of its IPC namespace (not mounted, but there).
    let fs = out(&t.edge, &sb.id, "awk '{print $3}' /proc/self/mountinfo | sort -u | wc -l").await;
    assert!(fs.trim().parse::<u32>().unwrap() <= 5, "distinct superblocks mounted: {fs}");

    // Limits are in the sandbox's cgroup.
    let pid = sb.pid.unwrap();
    // The agent is the edge's child (the spawn helper cloned it with
    // CLONE_PARENT) and is named for what it is.
    assert_eq!(std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap().trim(), "dsec-agent");
    let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let ppid: i32 = ppid.rsplit(')').next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(ppid, std::process::id() as i32);
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cg.contains(&sb.id), "{cg}");
    let lim = std::fs::read_to_string(format!("/sys/fs/cgroup/memory/dsec-test/{}/{}/memory.limit_in_bytes", t.node, sb.id)).unwrap();
    assert_eq!(lim.trim(), (64u64 << 20).to_string());

    // Another tenant cannot see it.
    let other = Caller::tenant("other");
    assert!(matches!(t.edge.get(&other, &sb.id), Err(EdgeError::SandboxNotFound(_))));
    assert!(t.edge.list(&other, &ListFilter::default()).is_empty());

    let stopped = t.edge.stop(&me, &sb.id, "test").await.unwrap();
    assert_eq!(stopped.state, State::Stopped);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map(|c| !c.contains(&sb.id)).unwrap_or(true)
    );
    let err = t.edge.exec(&me, &sb.id, sh("true")).await.unwrap_err();
    assert!(matches!(err, EdgeError::NotRunning { .. }), "{err}");
    t.edge.delete(&me, &sb.id).await.unwrap();
    assert!(matches!(t.edge.get(&me, &sb.id), Err(EdgeError::SandboxNotFound(_))));
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_and_leave_nothing() {
    let t = TestEdge::start(|c| c.max_sandboxes = 1).await;
    let me = Caller::tenant("t");
    let e = t.edge.create(&me, SandboxRequest { image: "no-such-image".into(), ..busybox() }).await.unwrap_err();
    assert!(matches!(e, EdgeError::ImageNotFound(_)), "{e}");
    let e = t.edge.create(&me, SandboxRequest { memory_mb: Some(1), ..busybox() }).await.unwrap_err();
    assert!(matches!(e, EdgeError::InvalidLimits(_)), "{e}");
    // A user the image lacks: refused at creation, with the code the API
    // reports as user_not_found, and the failed record says why.
    let e = t.edge.create(&me, SandboxRequest { init_user: Some("nosuchuser".into()), ..busybox() }).await.unwrap_err();
    assert_eq!(e.code(), dsec_api::ErrorCode::UserNotFound, "{e}");
    let failed = t.edge.list(&me, &ListFilter { state: Some(State::Failed), ..Default::default() });
    assert_eq!(failed.len(), 1);
    assert!(failed[0].reason.as_deref().unwrap_or("").contains("nosuchuser"), "{:?}", failed[0].reason);
    t.edge.delete(&me, &failed[0].id).await.unwrap();
    // A non-root user of the image works.
    let u = t.edge.create(&me, SandboxRequest { init_user: Some("user".into()), ..busybox() }).await.unwrap();
    assert_eq!(out(&t.edge, &u.id, "id -u").await, "1000\n");
    t.edge.delete(&me, &u.id).await.unwrap();

    let a = t.edge.create(&me, busybox()).await.unwrap();
    let e = t.edge.create(&me, busybox()).await.unwrap_err();
    assert!(matches!(e, EdgeError::NoCapacity(_)), "{e}");
    t.edge.delete(&me, &a.id).await.unwrap();
    // The slot is free again.
    let b = t.edge.create(&me, busybox()).await.unwrap();
    t.edge.delete(&me, &b.id).await.unwrap();
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_ttl_stops_and_agent_death_fails_with_a_reason() {
    let t = TestEdge::start(|_| {}).await;
    let me = Caller::tenant("t");
    let idle = t.edge.create(&me, SandboxRequest { idle_ttl_s: Some(1), ..busybox() }).await.unwrap();
    let victim = t.edge.create(&me, busybox()).await.unwrap();
    // SAFETY: kill(2) of the agent we just started.
    unsafe { libc::kill(victim.pid.unwrap(), libc::SIGKILL) };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let a = t.edge.get(&me, &idle.id).unwrap();
        let b = t.edge.get(&me, &victim.id).unwrap();
        if a.state == State::Stopped && b.state == State::Failed {
            assert!(a.reason.unwrap().contains("idle"));
            assert!(b.reason.unwrap().contains("exited unexpectedly"));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "states: {:?} {:?}", a.state, b.state);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaper_removes_stray_cgroups_and_their_processes() {
    let t = TestEdge::start(|_| {}).await;
    // A cgroup that no sandbox owns, with a process in it.
    let stray = "stray.zzzzzzzzzzzz";
    let dir = format!("/sys/fs/cgroup/memory/dsec-test/{}/{stray}", t.node);
    std::fs::create_dir(&dir).unwrap();
    let mut child = std::process::Command::new("sleep").arg("600").spawn().unwrap();
    std::fs::write(format!("{dir}/cgroup.procs"), child.id().to_string()).unwrap();
    let report = t.edge.reap_once().await;
    assert_eq!(report.cgroups, 1);
    assert_eq!(report.processes, 1);
    assert!(!Path::new(&dir).exists());
    let status = child.wait().unwrap();
    assert!(!status.success(), "the stray process was killed");
    t.finish().await;
}

/// Loop devices whose backing file lies under `dir`.
fn loops_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter_map(|d| std::fs::read_to_string(d.path().join("loop/backing_file")).ok().map(|b| (d.file_name(), b)))
        .filter(|(_, b)| b.starts_with(&prefix))
        .map(|(n, _)| n.to_string_lossy().into_owned())
        .collect()
}

/// The writable layer on the node's disk (the default): a subvolume per
/// sandbox, bounded by its disk limit (EDQUOT inside), larger than its
/// memory, kept through a pause and gone with the sandbox; a stray one is
/// reaped; the edge's shutdown leaves no mount and no loop device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writable_layer_lives_on_disk_bounded_by_its_limit() {
    let t = TestEdge::start(|_| {}).await;
    let me = Caller::tenant("t");
    let disk = t.state.path().join("edge").join("writable");
    assert_eq!(loops_under(t.state.path()).len(), 1, "the node's image is loop-mounted");
    let req = SandboxRequest { memory_mb: Some(64), disk_mb: Some(256), ..busybox() };
    let sb = t.edge.create(&me, req).await.unwrap();
    let layer = disk.join("sandboxes").join(&sb.id);
    assert!(layer.is_dir(), "{} is the sandbox's layer", layer.display());
    // More than its memory holds: the layer is not in it.
    let n = out(&t.edge, &sb.id, "dd if=/dev/zero of=/root/big bs=1M count=160 2>/dev/null && sync && wc -c < /root/big").await;
    assert_eq!(n.trim(), (160u64 << 20).to_string());
    // Past its limit, the write fails inside.
    let r = t.edge.exec(&me, &sb.id, sh("dd if=/dev/zero of=/root/more bs=1M count=200")).await.unwrap();
    assert_ne!(r.exit_code, Some(0));
    assert!(String::from_utf8_lossy(&r.stderr).contains("Disk quota exceeded"), "{}", String::from_utf8_lossy(&r.stderr));
    // A pause keeps the layer as it was.
    t.edge.pause(&me, &sb.id).await.unwrap();
    assert_eq!(out(&t.edge, &sb.id, "wc -c < /root/big").await.trim(), (160u64 << 20).to_string());
    t.edge.stop(&me, &sb.id, "test").await.unwrap();
    assert!(!layer.exists(), "the layer goes with its sandbox");
    // A layer no sandbox owns (an edge crashed before removing it) is reaped.
    let stray = disk.join("sandboxes").join("stray.zzzzzzzzzzzz");
    std::process::Command::new("btrfs").args(["subvolume", "create"]).arg(&stray).stdout(std::process::Stdio::null()).status().unwrap();
    assert!(stray.is_dir());
    let report = t.edge.reap_once().await;
    assert!(report.files >= 1 && !stray.exists(), "{report:?}");
    let state = t.state.path().to_path_buf();
    t.finish().await;
    assert_eq!(loops_under(&state), Vec::<String>::new(), "no loop device outlives the edge");
}

fn freezer_state(node: &str, id: &str) -> String {
    std::fs::read_to_string(format!("/sys/fs/cgroup/freezer/dsec-test/{node}/{id}/freezer.state")).unwrap_or_default().trim().to_string()
}

/// Pause on the real kernel: the cgroup freezes, the sandbox's memory (here
/// files in a tmpfs writable layer) goes to the node's swap file,
/// the sandbox stops counting against admission, any request resumes it
/// with its memory intact, and a paused sandbox can be stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_swaps_memory_out_and_a_request_resumes_it() {
    let mut swap_path = PathBuf::new();
    let t = TestEdge::start(|c| {
        swap_path = c.state_dir.parent().unwrap().join("swapfile");
        c.swap = Some(dsec_edge::pause::swap::SwapConfig { path: swap_path.clone(), size_mb: 512 });
        c.writable_layer = dsec_edge::disk::WritableLayer::Tmpfs;
    })
    .await;
    assert!(dsec_edge::pause::swap::is_active(&swap_path), "the edge turned its swap file on");
    let me = Caller::tenant("t");
    let req = SandboxRequest { memory_mb: Some(512), disk_mb: Some(512), ..busybox() };
    let sb = t.edge.create(&me, req).await.unwrap();
    let sum = out(&t.edge, &sb.id, "head -c 200000000 /dev/urandom > /root/blob && md5sum < /root/blob").await;
    assert_eq!(t.edge.stats().running, 1);

    let p = t.edge.pause(&me, &sb.id).await.expect("pause");
    assert!(p.changed);
    assert_eq!(p.record.state, State::Paused);
    assert_eq!(freezer_state(&t.node, &sb.id), "FROZEN");
    assert!(p.memory.before_bytes > 200_000_000, "{:?}", p.memory);
    let stat = std::fs::read_to_string(format!("/sys/fs/cgroup/memory/dsec-test/{}/{}/memory.stat", t.node, sb.id)).unwrap_or_default();
    assert!(p.memory.freed_bytes() * 10 >= p.memory.before_bytes * 9, "less than 90% freed: {:?}\n{stat}", p.memory);
    assert_eq!(t.edge.stats().running, 0, "a paused sandbox does not count against the running quota");
    assert_eq!(t.edge.list(&me, &ListFilter { state: Some(State::Paused), ..Default::default() }).len(), 1);
    let again = t.edge.pause(&me, &sb.id).await.unwrap();
    assert!(!again.changed, "pausing a paused sandbox changes nothing");

    // A request resumes it first, transparently, with its memory intact.
    assert_eq!(out(&t.edge, &sb.id, "md5sum < /root/blob").await, sum);
    assert_eq!(t.edge.get(&me, &sb.id).unwrap().state, State::Running);
    assert_eq!(freezer_state(&t.node, &sb.id), "THAWED");
    assert_eq!(t.edge.stats().running, 1);
    let r = t.edge.resume(&me, &sb.id).await.unwrap();
    assert!(!r.changed, "resuming a running sandbox changes nothing");

    // A paused sandbox stops (on v1 a frozen task needs a thaw to die).
    t.edge.pause(&me, &sb.id).await.unwrap();
    let stopped = t.edge.stop(&me, &sb.id, "test").await.expect("stop a paused sandbox");
    assert_eq!(stopped.state, State::Stopped);
    assert!(matches!(t.edge.resume(&me, &sb.id).await, Err(EdgeError::Ended { .. })));
    assert!(matches!(t.edge.pause(&me, &sb.id).await, Err(EdgeError::Ended { .. })));
    assert!(matches!(t.edge.pause(&me, "nope.x").await, Err(EdgeError::SandboxNotFound(_))));
    t.finish().await;
    assert!(!dsec_edge::pause::swap::is_active(&swap_path) && !swap_path.exists(), "shutdown turns swap off and removes the file");
}

/// Creation backpressure with a tiny bound: one creation at a time, two
/// waiting; the rest are refused with QueueFull, nothing fails otherwise.
/// Then the job-wide pause and resume of what was created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_creation_queue_bounds_and_job_pause_is_idempotent() {
    let t = TestEdge::start(|c| {
        c.max_creating = 1;
        c.max_queued_creations = 2;
    })
    .await;
    let me = Caller::tenant("t");
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (edge, me) = (t.edge.clone(), me.clone());
        set.spawn(async move { edge.create(&me, SandboxRequest { job: Some("j".into()), ..busybox() }).await });
    }
    let (mut ok, mut full) = (0, 0);
    while let Some(r) = set.join_next().await {
        match r.unwrap() {
            Ok(sb) => {
                assert_eq!(sb.state, State::Running);
                ok += 1;
            }
            Err(EdgeError::QueueFull(_)) => full += 1,
            Err(e) => panic!("unexpected creation error {e}"),
        }
    }
    assert!(ok >= 3 && full >= 1 && ok + full == 8, "ok {ok}, refused {full}");

    let p = t.edge.job_action(&me, "j", dsec_edge::JobAction::Pause).await;
    assert_eq!((p.matched, p.changed, p.unchanged, p.failed.len()), (ok, ok, 0, 0));
    assert_eq!(t.edge.stats().running, 0);
    let p = t.edge.job_action(&me, "j", dsec_edge::JobAction::Pause).await;
    assert_eq!((p.changed, p.unchanged), (0, ok), "pausing a paused job changes nothing");
    let r = t.edge.job_action(&me, "j", dsec_edge::JobAction::Resume).await;
    assert_eq!((r.changed, r.unchanged, r.failed.len()), (ok, 0, 0));
    assert_eq!(t.edge.stats().running, ok);
    let other = t.edge.job_action(&Caller::tenant("other"), "j", dsec_edge::JobAction::Pause).await;
    assert_eq!(other.matched, 0, "another tenant's job is invisible");
    t.finish().await;
}

/// The lease: a hard end from now, bounded by the node's cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_can_be_changed() {
    let t = TestEdge::start(|_| {}).await;
    let me = Caller::tenant("t");
    let sb = t.edge.create(&me, busybox()).await.unwrap();
    let huge = dsec_edge::Lease { lifetime_s: Some(365 * 86_400), idle_ttl_s: None };
    assert!(matches!(t.edge.set_lease(&me, &sb.id, huge), Err(EdgeError::InvalidLimits(_))));
    let rec = t.edge.set_lease(&me, &sb.id, dsec_edge::Lease { lifetime_s: Some(1), idle_ttl_s: Some(0) }).unwrap();
    assert_eq!(rec.spec.idle_ttl_s, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = t.edge.get(&me, &sb.id).unwrap();
        if r.state == State::Stopped {
            assert!(r.reason.unwrap_or_default().contains("maximum lifetime"));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not stopped at the end of its lease: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(matches!(t.edge.set_lease(&me, &sb.id, dsec_edge::Lease::default()), Err(EdgeError::Ended { .. })));
    t.finish().await;
}
