//! Harness of the CLI and restart tests: a real `dsec up` (the binary cargo
//! built for this test run, with the guest agent next to it) on a temporary
//! data dir and image store, a unique node name and a port the kernel picks.
//!
//! Everything a test starts is tracked by PID and undone in `Drop`, also
//! when an assertion failed half-way: the `dsec up` process, the guest agents
//! it left (the test process is a child subreaper, so orphaned agents become
//! its children and are reaped here, by PID), the node's cgroups in every
//! hierarchy, and every mount under the temporary directory.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The `dsec` binary under test.
pub const DSEC: &str = env!("CARGO_BIN_EXE_dsec");

/// Bound on any one CLI invocation.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(30);

pub fn hex_id() -> String {
    let mut b = [0u8; 5];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Makes this test process the reaper of orphans among its descendants, so
/// guest agents whose `dsec up` was killed become our children (and can be
/// reaped by PID) instead of waiting for the host's init.
pub fn become_subreaper() {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes plain integers.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(r, 0, "prctl(PR_SET_CHILD_SUBREAPER): {}", std::io::Error::last_os_error());
}

/// What a finished command printed.
#[derive(Debug)]
pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Asserts a zero exit and returns stdout.
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert!(self.status.success(), "command failed ({}): stdout {:?} stderr {:?}", self.status, self.stdout, self.stderr);
        &self.stdout
    }

    /// Asserts a non-zero exit whose stderr mentions `needle`.
    #[track_caller]
    pub fn fails_with(&self, needle: &str) {
        assert!(!self.status.success(), "expected a failure mentioning {needle:?}, got success: {self:?}");
        assert!(self.stderr.contains(needle), "stderr does not mention {needle:?}: {self:?}");
    }
}

/// Runs `cmd` to completion with piped output; SIGKILLs it (by its PID) and
/// panics if it takes longer than `timeout`.
pub fn run_bounded(mut cmd: Command, timeout: Duration) -> Out {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out_t = drain(Box::new(child.stdout.take().unwrap()));
    let err_t = drain(Box::new(child.stderr.take().unwrap()));
    let status = match wait_bounded(&mut child, timeout) {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {timeout:?}: stdout {:?} stderr {:?}", out_t.join().unwrap(), err_t.join().unwrap());
        }
    };
    Out { status, stdout: out_t.join().unwrap(), stderr: err_t.join().unwrap() }
}

/// Waits for `child` up to `timeout`; `None` if it is still running.
pub fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One HTTP/1.0 GET over loopback, without the async client (used for
/// /healthz polling): (status, body).
pub fn http_get(addr: &str, path: &str, token: Option<&str>) -> std::io::Result<(u16, String)> {
    let sa: std::net::SocketAddr = addr.parse().expect("a socket address");
    assert!(sa.ip().is_loopback(), "tests only talk to loopback");
    let mut s = std::net::TcpStream::connect_timeout(&sa, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// Fields of /proc/PID/stat after the command name: (state, ppid, start time).
pub fn proc_stat(pid: i32) -> Option<(char, i32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    // rest[0] is field 3 (state); field 4 is the ppid, field 22 the start time.
    Some((rest[0].chars().next()?, rest[1].parse().ok()?, rest[19].parse().ok()?))
}

/// Whether the process (pid, start time) still exists and is not a zombie.
pub fn alive(pid: i32, start: u64) -> bool {
    matches!(proc_stat(pid), Some((st, _, t)) if t == start && st != 'Z')
}

/// The cgroup hierarchies mounted under /sys/fs/cgroup (v1 controllers and
/// the cgroup2 mount).
pub fn hierarchies() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.join("cgroup.procs").exists()).collect())
        .unwrap_or_default();
    out.sort();
    out
}

/// Subdirectories of `dir` (empty if it does not exist).
pub fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect()).unwrap_or_default()
}

pub fn read_pids(file: &Path) -> Vec<i32> {
    std::fs::read_to_string(file).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// Mount points under `dir`, from /proc/self/mountinfo.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(|m| m.replace("\\040", " ")))
        .filter(|mp| mp == &prefix || mp.starts_with(&format!("{prefix}/")))
        .collect()
}

/// One `dsec up` and everything it needs.
pub struct Platform {
    pub dir: tempfile::TempDir,
    pub node: String,
    child: Option<Child>,
    /// `127.0.0.1:PORT` of the running platform.
    pub addr: String,
    pub token: String,
    /// Everything `dsec up` wrote to stderr, across restarts.
    pub log: Arc<Mutex<String>>,
    /// Guest agents seen (pid, start time), to reap the ones orphaned to us.
    agents: Vec<(i32, u64)>,
    /// More `dsec up` flags.
    extra_args: Vec<String>,
    /// Serving HTTPS: the CA the CLI is told to trust, and the directory
    /// of the CA and the certificate.
    tls: Option<(PathBuf, tempfile::TempDir)>,
}

impl Platform {
    /// A temp dir with a busybox image store, and `dsec up` on it.
    pub fn start(stop_sandboxes_on_exit: bool) -> Platform {
        Platform::start_with(stop_sandboxes_on_exit, &[])
    }

    /// [`Platform::start`] serving HTTPS, its certificate from a CA of its
    /// own that the CLI commands trust (`DSEC_CA_CERT`).
    pub fn start_tls(stop_sandboxes_on_exit: bool) -> Platform {
        let certs = tempfile::Builder::new().prefix("dsec-cli-tls-").tempdir().unwrap();
        let ca = dsec_tls::init_ca(&certs.path().join("ca"), "test CA").unwrap();
        let issued = dsec_tls::issue(&certs.path().join("ca"), "up", &["127.0.0.1".into()], 1, certs.path()).unwrap();
        let (cert, key) = (issued.cert.display().to_string(), issued.key.display().to_string());
        Platform::start_inner(stop_sandboxes_on_exit, &["--tls-cert", &cert, "--tls-key", &key], Some((ca.cert, certs)))
    }

    /// [`Platform::start`] with more `dsec up` flags.
    pub fn start_with(stop_sandboxes_on_exit: bool, extra_args: &[&str]) -> Platform {
        Platform::start_inner(stop_sandboxes_on_exit, extra_args, None)
    }

    fn start_inner(stop_sandboxes_on_exit: bool, extra_args: &[&str], tls: Option<(PathBuf, tempfile::TempDir)>) -> Platform {
        become_subreaper();
        if std::env::var_os("DSEC_AGENT").is_none() {
            let agent = Path::new(DSEC).with_file_name("dsec-agent");
            assert!(
                agent.is_file(),
                "{} is missing: build it with the CLI (cargo test --release -p dsec-cli -p dsec-agent)",
                agent.display()
            );
        }
        let dir = tempfile::Builder::new().prefix("dsec-cli-test-").tempdir().unwrap();
        let store = dsec_image::ImageStore::open(dir.path().join("images")).unwrap();
        dsec_image::build_default_image(&store, dsec_image::DefaultImage::Busybox, &dsec_image::NoProgress, "")
            .expect("building the busybox image");
        let mut p = Platform {
            dir,
            node: format!("cli{}", hex_id()),
            child: None,
            addr: String::new(),
            token: String::new(),
            log: Arc::new(Mutex::new(String::new())),
            agents: Vec::new(),
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            tls,
        };
        p.up(stop_sandboxes_on_exit);
        p
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn images_dir(&self) -> PathBuf {
        self.dir.path().join("images")
    }

    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("dsec up is running").id() as i32
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The `dsec up` command line for this platform.
    pub fn up_command(&self, stop_sandboxes_on_exit: bool) -> Command {
        let mut cmd = Command::new(DSEC);
        cmd.arg("up")
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--images-dir")
            .arg(self.images_dir())
            .args(["--listen", "127.0.0.1:0", "--node", &self.node])
            // No FnCall runner kept warm: tests count the node's sandboxes.
            // A call still starts one on demand.
            .args(["--fncall-pools", "python=0:2,cpp=0:1"]);
        if stop_sandboxes_on_exit {
            cmd.arg("--stop-sandboxes-on-exit");
        }
        cmd.args(&self.extra_args);
        for v in ["DSEC_DATA_DIR", "DSEC_ENDPOINT", "DSEC_TOKEN", "DSEC_TOKEN_FILE", "DSEC_IMAGES_DIR"] {
            cmd.env_remove(v);
        }
        cmd.env("DSEC_LOG", "info").env("NO_COLOR", "1");
        cmd
    }

    /// Starts `dsec up` (again) on this platform's data dir and waits until
    /// it answers /healthz.
    pub fn up(&mut self, stop_sandboxes_on_exit: bool) {
        assert!(self.child.is_none(), "dsec up is already running");
        let mut cmd = self.up_command(stop_sandboxes_on_exit);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawning dsec up");
        let stderr = child.stderr.take().unwrap();
        self.child = Some(child);
        let (tx, rx) = mpsc::channel::<String>();
        let log = self.log.clone();
        let node = self.node.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            let mut line = Vec::new();
            while matches!(r.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                let text = String::from_utf8_lossy(&line).into_owned();
                eprint!("[dsec up {node}] {text}");
                if let Some(rest) = text.split("dsec is up at http://").nth(1).or_else(|| text.split("dsec is up at https://").nth(1)) {
                    let addr: String = rest.chars().take_while(|c| c.is_ascii_digit() || matches!(c, '.' | ':')).collect();
                    let _ = tx.send(addr);
                }
                log.lock().unwrap_or_else(|p| p.into_inner()).push_str(&text);
                line.clear();
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(a) => break a,
                Err(_) => {
                    if let Some(s) = self.child.as_mut().unwrap().try_wait().unwrap() {
                        self.child = None;
                        panic!("dsec up exited ({s}) before it was up:\n{}", self.log());
                    }
                    assert!(Instant::now() < deadline, "dsec up did not come up within 30 s:\n{}", self.log());
                }
            }
        };
        self.addr = addr;
        // Over TLS the line above is the sign: it is printed once the
        // socket is bound, and the CLI's own calls are the test.
        while self.tls.is_none() {
            if matches!(http_get(&self.addr, "/healthz", None), Ok((200, _))) {
                break;
            }
            assert!(Instant::now() < deadline, "dsec up does not answer /healthz:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        self.token = std::fs::read_to_string(self.data_dir().join("admin-token")).expect("admin token").trim().to_string();
    }

    /// Sends `signal` to `dsec up` and waits for it to exit.
    pub fn signal_and_wait(&mut self, signal: i32) -> ExitStatus {
        self.remember_agents();
        let mut child = self.child.take().expect("dsec up is running");
        // SAFETY: kill(2) of the process this harness started.
        unsafe { libc::kill(child.id() as i32, signal) };
        match wait_bounded(&mut child, Duration::from_secs(30)) {
            Some(s) => s,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("dsec up did not exit within 30 s of signal {signal}:\n{}", self.log());
            }
        }
    }

    /// Graceful stop (SIGTERM); asserts a clean exit.
    pub fn stop(&mut self) {
        let status = self.signal_and_wait(libc::SIGTERM);
        assert!(status.success(), "dsec up exited with {status} on SIGTERM:\n{}", self.log());
    }

    /// A `dsec` CLI command against this platform (DSEC_ENDPOINT, DSEC_TOKEN).
    pub fn cli_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(DSEC);
        cmd.args(args);
        for v in ["DSEC_TOKEN_FILE", "DSEC_IMAGES_DIR"] {
            cmd.env_remove(v);
        }
        // Any fallback the CLI takes must land in this test's directory.
        cmd.env("DSEC_DATA_DIR", self.data_dir());
        cmd.env("DSEC_ENDPOINT", self.endpoint()).env("DSEC_TOKEN", &self.token).env("DSEC_LOG", "warn");
        match &self.tls {
            Some((ca, _)) => cmd.env("DSEC_CA_CERT", ca),
            None => cmd.env_remove("DSEC_CA_CERT"),
        };
        cmd
    }

    pub fn dsec(&self, args: &[&str]) -> Out {
        run_bounded(self.cli_command(args), CLI_TIMEOUT)
    }

    /// The sandbox's cgroup directory in the memory hierarchy.
    pub fn cgroup_dir(&self, id: &str) -> PathBuf {
        PathBuf::from(format!("/sys/fs/cgroup/memory/dsec/{}/{id}", self.node))
    }

    /// The cgroup directories of `id` that exist, in every hierarchy.
    pub fn cgroup_dirs_of(&self, id: &str) -> Vec<PathBuf> {
        hierarchies().into_iter().map(|h| h.join("dsec").join(&self.node).join(id)).filter(|p| p.exists()).collect()
    }

    /// Host pid of the sandbox's guest agent: the process of its cgroup
    /// that is PID 1 of its pid namespace.
    pub fn agent_pid(&self, id: &str) -> Option<i32> {
        read_pids(&self.cgroup_dir(id).join("cgroup.procs")).into_iter().find(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status.lines().find_map(|l| l.strip_prefix("NSpid:")).and_then(|v| v.split_whitespace().last()) == Some("1")
        })
    }

    /// Records every agent of this node (pid, start time).
    pub fn remember_agents(&mut self) {
        for sb in subdirs(&PathBuf::from(format!("/sys/fs/cgroup/memory/dsec/{}", self.node))) {
            let id = sb.file_name().unwrap().to_string_lossy().into_owned();
            if let Some(pid) = self.agent_pid(&id) {
                if let Some((_, _, start)) = proc_stat(pid) {
                    if !self.agents.contains(&(pid, start)) {
                        self.agents.push((pid, start));
                    }
                }
            }
        }
    }

    /// Reaps the remembered agents that died as our children (orphaned to
    /// this subreaper), waiting up to `timeout` for them to die.
    pub fn reap_agents(&self, timeout: Duration) {
        let me = std::process::id() as i32;
        let deadline = Instant::now() + timeout;
        loop {
            let mut pending = false;
            for &(pid, start) in &self.agents {
                match proc_stat(pid) {
                    Some((st, ppid, t)) if t == start && ppid == me => {
                        if st == 'Z' {
                            // SAFETY: waitpid of one specific child of ours.
                            unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
                        } else {
                            pending = true;
                        }
                    }
                    _ => {}
                }
            }
            if !pending || Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Everything of this platform still on the host: cgroups below the
    /// node's parent in any hierarchy, processes in them, agents that are
    /// still alive, mounts under the temp dir.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for h in hierarchies() {
            for d in subdirs(&h.join("dsec").join(&self.node)) {
                left.push(format!("cgroup {}", d.display()));
            }
        }
        let needle = format!("/dsec/{}/", self.node);
        if let Ok(rd) = std::fs::read_dir("/proc") {
            for e in rd.flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
                let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
                if let Some(line) = cg.lines().find(|l| l.contains(&needle)) {
                    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                    left.push(format!("process {pid} ({}) in {line}", comm.trim()));
                }
            }
        }
        for &(pid, start) in &self.agents {
            if alive(pid, start) {
                left.push(format!("agent {pid} still running"));
            }
        }
        for m in mounts_under(self.dir.path()) {
            left.push(format!("mount {m}"));
        }
        left
    }

    /// Stops the platform gracefully and asserts nothing is left.
    pub fn finish(mut self) {
        if self.child.is_some() {
            self.stop();
        }
        self.reap_agents(Duration::from_secs(10));
        let left = self.leftovers();
        assert!(left.is_empty(), "left behind after shutdown: {left:#?}\n--- dsec up log ---\n{}", self.log());
    }
}

impl Drop for Platform {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            self.remember_agents();
            let _ = child.kill();
            let _ = child.wait();
        }
        // Processes in this node's cgroups are this test's (agents and
        // what ran in the sandboxes): SIGKILL them by PID.
        let parents: Vec<PathBuf> = hierarchies().into_iter().map(|h| h.join("dsec").join(&self.node)).collect();
        for parent in &parents {
            for d in subdirs(parent) {
                for pid in read_pids(&d.join("cgroup.procs")) {
                    // SAFETY: kill(2) of a process in this test's own cgroup.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                // A paused sandbox's processes act on SIGKILL once thawed
                // (only the freezer hierarchy has this file).
                let _ = std::fs::write(d.join("freezer.state"), "THAWED");
            }
        }
        self.reap_agents(Duration::from_secs(5));
        for parent in &parents {
            for d in subdirs(parent) {
                for _ in 0..200 {
                    if std::fs::remove_dir(&d).is_ok() || !d.exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            // The node's parent; `dsec` above it is shared with other
            // platforms on this host and stays.
            let _ = std::fs::remove_dir(parent);
        }
        // A killed edge leaves its node lock file (a clean shutdown removes
        // it); nothing holds it any more.
        let _ = std::fs::remove_file(format!("/run/dsec/node-{}.lock", self.node));
        let mut mounts = mounts_under(self.dir.path());
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mp in mounts {
            let c = std::ffi::CString::new(mp).unwrap();
            // SAFETY: umount2 of a mount point under this test's temp dir.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// A current-thread runtime and an API client for the platform.
pub struct Api {
    pub rt: tokio::runtime::Runtime,
    pub client: dsec_client::Client,
}

impl Api {
    pub fn new(p: &Platform) -> Api {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = dsec_client::Client::new(&p.endpoint(), Some(&p.token)).unwrap();
        Api { rt, client }
    }

    /// Runs one API call with a deadline.
    pub fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, dsec_client::ClientError>>,
    ) -> Result<T, dsec_client::ClientError> {
        self.rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), f).await.expect("API call timed out") })
    }

    pub fn create_busybox(&self, labels: &[(&str, &str)]) -> dsec_api::Sandbox {
        let req: dsec_api::CreateSandboxRequest = serde_json::from_value(serde_json::json!({
            "image": "busybox",
            "memory_limit_mb": 64,
            "cpu_cores_limit": 0.5,
            "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>(),
        }))
        .unwrap();
        let sb = self.call(self.client.create(&req)).expect("create");
        assert_eq!(sb.state, dsec_api::SandboxState::Running);
        sb
    }

    /// Runs `cmd` with `sh -c` and returns (exit code, stdout, stderr).
    pub fn sh(&self, id: &str, cmd: &str) -> (i32, String, String) {
        let req = dsec_api::ExecRequest { cmd: Some(cmd.into()), timeout: Some(20.0), ..Default::default() };
        let r = self.call(self.client.exec(id, &req)).unwrap_or_else(|e| panic!("exec {cmd:?} in {id}: {e}"));
        (r.exit_code, r.stdout, r.stderr)
    }

    /// `sh -c cmd` must succeed; returns stdout.
    #[track_caller]
    pub fn out(&self, id: &str, cmd: &str) -> String {
        let (code, out, err) = self.sh(id, cmd);
        assert_eq!(code, 0, "{cmd:?} in {id}: stdout {out:?} stderr {err:?}");
        out
    }
}
