//! A fake backend, for unit tests of the lifecycle (create, stop, delete,
//! pause, resume, recovery, the sweeper and the reaper) that need no root.
//!
//! It is a real implementation of [`Backend`]: each sandbox is a harmless
//! child process (`sleep`), so its [`Instance`] has a real pidfd that ends
//! when the sandbox ends, and a real agent channel, a socket pair whose
//! other end a small task serves ([`serve_agent`]: the Hello handshake,
//! `Ping`, and EOF when the process ends, as a real agent's channel ends
//! with it). Its cgroups are made and removed by the edge's own cgroup
//! driver over a temporary cgroup2 tree ([`FakeCgroupFs`]); the fake plays
//! the kernel's part of that tree (the files the kernel fills in, the
//! freezer's answer, the removal of a directory that holds interface
//! files).
//!
//! Tests script it per call, in the manner of youki's recording syscall
//! fake and meilisearch's test breakpoints: the next start, adopt or
//! freeze hook may fail, or stop at a [`Gate`] until the test opens it;
//! and every call is recorded in order ([`FakeBackend::calls`]). No test
//! waits on a timer racing another: each waits for a gate, a recorded
//! call or a sandbox's end.
//!
//! What it cannot show: its processes are not in the cgroups it makes (an
//! unprivileged process cannot join a directory of a temporary tree), so
//! a freeze stops nothing, and the recovery of a paused sandbox, which
//! checks membership through `/proc/<pid>/cgroup`, finds its agent gone;
//! the integration tests run those as root.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dsec_agent_proto::client::AgentClient;
use dsec_agent_proto::codec::{read_frame_async, write_frame_async};
use dsec_agent_proto::{AgentError, AgentHello, AgentState, ErrorKind, FromAgent, Op, Reply, ToAgent};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use crate::backends::instance::Instance;
use crate::backends::{cgroup_limits, Backend, Backends, BoxFuture, Durable};
use crate::cgroup::{Cgroups, V2Cgroups};
use crate::edge::{lock, Edge, EdgeConfig, Host};
use crate::error::EdgeError;
use crate::images::{RootfsPlan, RootfsProvider};
use crate::model::{BackendKind, Caller, SandboxRecord, SandboxSpec};
use crate::spec::SandboxRequest;

/// How long a test waits for anything before it fails (nothing it waits
/// for takes more than milliseconds, or a sweeper's second).
pub(crate) const PATIENCE: Duration = Duration::from_secs(5);

/// Awaits `f`, failing the test after [`PATIENCE`].
pub(crate) async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(PATIENCE, f).await.unwrap_or_else(|_| panic!("{what}: not within {PATIENCE:?}"))
}

/// One call the edge made, in the order it made them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    Start(String),
    AbortStart(String),
    Adopt(String, i32),
    Cleanup(String),
    BeforeFreeze(String),
    AfterThaw(String),
}

impl Call {
    pub(crate) fn id(&self) -> &str {
        match self {
            Call::Start(id)
            | Call::AbortStart(id)
            | Call::Adopt(id, _)
            | Call::Cleanup(id)
            | Call::BeforeFreeze(id)
            | Call::AfterThaw(id) => id,
        }
    }
}

/// What the next call of a scripted kind does.
pub(crate) enum Plan {
    /// Fails with this message.
    Fail(String),
    /// Stops at the gate until the test opens it (a start also ends, as
    /// failed, if its process is killed meanwhile: `abort_start`).
    Wait(Gate),
}

/// The calls a test can script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Scripted {
    Start,
    Adopt,
    BeforeFreeze,
}

/// A breakpoint: a call stops at it until the test opens it, and the test
/// can wait until a call has stopped there.
#[derive(Clone)]
pub(crate) struct Gate(Arc<(watch::Sender<bool>, watch::Sender<bool>)>);

impl Gate {
    pub(crate) fn new() -> Self {
        Gate(Arc::new((watch::Sender::new(false), watch::Sender::new(false))))
    }

    /// Waits until a call has stopped at the gate.
    pub(crate) async fn reached(&self) {
        let _ = within("a call reaching the gate", self.0 .0.subscribe().wait_for(|r| *r)).await;
    }

    pub(crate) fn open(&self) {
        self.0 .1.send_replace(true);
    }

    async fn pass(&self) {
        self.0 .0.send_replace(true);
        let _ = self.0 .1.subscribe().wait_for(|o| *o).await;
    }
}

/// A temporary cgroup2 tree (offering memory, cpu and pids) that the
/// edge's own driver works on, and the kernel's side of it, which the fake
/// backend plays.
pub(crate) struct FakeCgroupFs {
    /// The node's parent cgroup (`dsec/<node>`).
    parent: PathBuf,
}

/// What the kernel reports as a fake sandbox's memory use.
const MEMORY_CURRENT: u64 = 48 << 20;

impl FakeCgroupFs {
    /// The tree at `root` and the driver over it, initialised as
    /// `Cgroups::open` initialises the host's.
    pub(crate) fn new(root: &Path, parent: &str) -> (FakeCgroupFs, Cgroups) {
        std::fs::write(root.join("cgroup.controllers"), "cpuset cpu io memory pids").expect("writing the fake cgroup root");
        let cg = V2Cgroups::new(root.to_path_buf(), parent, true).expect("a driver over the fake tree");
        cg.init().expect("initialising the fake tree");
        (FakeCgroupFs { parent: root.join(parent) }, Cgroups::V2(cg))
    }

    pub(crate) fn dir(&self, name: &str) -> PathBuf {
        self.parent.join(name)
    }

    /// A file of cgroup `name`, or `None` if it does not exist.
    pub(crate) fn read(&self, name: &str, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir(name).join(file)).ok()
    }

    /// What the kernel fills in for a new cgroup with a process in it.
    fn populate(&self, name: &str) {
        let _ = std::fs::write(self.dir(name).join("memory.current"), MEMORY_CURRENT.to_string());
        self.report_frozen(name, false);
    }

    /// The freezer's answer (`cgroup.events`), if the cgroup exists.
    fn report_frozen(&self, name: &str, frozen: bool) {
        if self.dir(name).is_dir() {
            let _ = std::fs::write(self.dir(name).join("cgroup.events"), format!("populated 1\nfrozen {}\n", u8::from(frozen)));
        }
    }

    /// cgroupfs removes a directory that holds only interface files; a
    /// plain directory needs them gone first.
    fn clear(&self, name: &str) {
        let Ok(rd) = std::fs::read_dir(self.dir(name)) else { return };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_file()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// A sandbox's process.
struct Proc {
    pid: i32,
    pidfd: OwnedFd,
}

/// True once the process behind `pidfd` has ended.
fn ended(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll on one valid pollfd, without waiting.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

/// `pidfd`, readable once its process has ended.
fn watch_exit(pidfd: OwnedFd) -> Result<AsyncFd<OwnedFd>, EdgeError> {
    // SAFETY: the AsyncFd owns `pidfd`, so it stays open for as long as
    // it is registered.
    unsafe { AsyncFd::register(pidfd) }.map_err(|e| EdgeError::sys("watch a fake sandbox's pidfd")(e.into()))
}

/// A failure a test scripted for a hook.
fn scripted(why: String) -> EdgeError {
    EdgeError::Command { program: "the fake backend's script", detail: why }
}

pub(crate) struct FakeBackend {
    cgroups: Arc<Cgroups>,
    fs: FakeCgroupFs,
    plans: Mutex<HashMap<Scripted, VecDeque<Plan>>>,
    calls: watch::Sender<Vec<Call>>,
    procs: Mutex<HashMap<String, Proc>>,
    /// Whether `abort_start` cuts a start short (as a VM backend's does)
    /// or says it is not worth it (as the container backend's does).
    abortable: std::sync::atomic::AtomicBool,
    conditions: Mutex<HashMap<String, String>>,
}

impl FakeBackend {
    pub(crate) fn new(cgroups: Arc<Cgroups>, fs: FakeCgroupFs) -> Self {
        FakeBackend {
            cgroups,
            fs,
            plans: Mutex::default(),
            calls: watch::Sender::new(Vec::new()),
            procs: Mutex::default(),
            abortable: false.into(),
            conditions: Mutex::default(),
        }
    }

    pub(crate) fn fs(&self) -> &FakeCgroupFs {
        &self.fs
    }

    /// The next call of `kind` (after those scripted before) follows `plan`;
    /// unscripted calls succeed at once.
    pub(crate) fn script(&self, kind: Scripted, plan: Plan) {
        lock(&self.plans).entry(kind).or_default().push_back(plan);
    }

    pub(crate) fn set_abortable(&self, abortable: bool) {
        self.abortable.store(abortable, std::sync::atomic::Ordering::Relaxed);
    }

    /// What `condition` reports for sandbox `id` from now on.
    pub(crate) fn set_condition(&self, id: &str, note: &str) {
        lock(&self.conditions).insert(id.to_string(), note.to_string());
    }

    /// Every call so far, in order.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.borrow().clone()
    }

    /// The calls about sandbox `id`, in order.
    pub(crate) fn calls_for(&self, id: &str) -> Vec<Call> {
        self.calls.borrow().iter().filter(|c| c.id() == id).cloned().collect()
    }

    /// Waits until `call` has been made.
    pub(crate) async fn called(&self, call: Call) {
        let _ = within(&format!("{call:?}"), self.calls.subscribe().wait_for(|calls| calls.contains(&call))).await;
    }

    /// Sandboxes whose process still runs.
    pub(crate) fn running(&self) -> Vec<String> {
        lock(&self.procs).iter().filter(|(_, p)| !ended(&p.pidfd)).map(|(id, _)| id.clone()).collect()
    }

    /// Kills sandbox `id`'s process from outside the edge (a crash, the
    /// OOM killer); whoever holds its pidfd sees it end.
    /// Kills sandbox `id`'s process and returns once it has died (a
    /// SIGKILL is delivered at once but the exit completes a moment
    /// later: a re-adoption right after must find it gone).
    pub(crate) fn crash(&self, id: &str) {
        if let Some(p) = lock(&self.procs).get(id) {
            let _ = dsec_spawn::pidfd_kill(&p.pidfd, libc::SIGKILL);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !ended(&p.pidfd) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    fn record(&self, call: Call) {
        self.calls.send_modify(|calls| calls.push(call));
    }

    fn plan(&self, kind: Scripted) -> Option<Plan> {
        lock(&self.plans).get_mut(&kind).and_then(|q| q.pop_front())
    }

    /// Follows the scripted plan of a call: `Ok` to go on, or why it fails.
    async fn follow(plan: Option<Plan>) -> Result<(), String> {
        match plan {
            None => Ok(()),
            Some(Plan::Fail(why)) => Err(why),
            Some(Plan::Wait(gate)) => {
                gate.pass().await;
                Ok(())
            }
        }
    }

    async fn start_sandbox(&self, id: &str, spec: &SandboxSpec, durable: Durable) -> Result<Instance, EdgeError> {
        let plan = self.plan(Scripted::Start);
        self.record(Call::Start(id.to_string()));
        self.cgroups.create(id, &cgroup_limits(spec, self.memory_overhead_mb()))?;
        self.fs.populate(id);
        let started = async {
            durable.await?;
            let pid = self.spawn(id)?;
            // A stop cuts the start short by killing its process.
            let exit = watch_exit(self.pidfd(id)?)?;
            tokio::select! {
                outcome = Self::follow(plan) => outcome.map_err(EdgeError::SetupFailed)?,
                _ = exit.readable() => return Err(EdgeError::SetupFailed("the sandbox's process ended while it started".into())),
            }
            self.connect(id, pid, AgentState::Fresh).await
        };
        let out = started.await;
        if out.is_err() {
            let _ = self.remove(id);
        }
        out
    }

    async fn adopt_sandbox(&self, id: &str, pid: i32) -> Result<Instance, EdgeError> {
        let plan = self.plan(Scripted::Adopt);
        self.record(Call::Adopt(id.to_string(), pid));
        Self::follow(plan).await.map_err(scripted)?;
        let alive = lock(&self.procs).get(id).is_some_and(|p| p.pid == pid && !ended(&p.pidfd));
        if !alive {
            return Err(EdgeError::ProcessReplaced { id: id.to_string(), pid, what: "agent" });
        }
        self.connect(id, pid, AgentState::Ready { sandbox_id: id.to_string() }).await
    }

    /// Starts sandbox `id`'s process: a `sleep` that outlives any test (the
    /// fake kills it when the sandbox or the fake ends).
    fn spawn(&self, id: &str) -> Result<i32, EdgeError> {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(EdgeError::sys("spawning sleep"))?;
        let pid = child.id() as i32;
        // Not reaped yet, so the pid is still this child's.
        let pidfd = match dsec_spawn::pidfd_open(pid) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(EdgeError::SandboxSys { id: id.to_string(), call: "pidfd_open", source: e });
            }
        };
        // Dropping `child` neither kills nor reaps it: the pidfd does both.
        lock(&self.procs).insert(id.to_string(), Proc { pid, pidfd });
        Ok(pid)
    }

    fn pidfd(&self, id: &str) -> Result<OwnedFd, EdgeError> {
        let procs = lock(&self.procs);
        let p = procs.get(id).ok_or_else(|| EdgeError::NoProcess(id.to_string()))?;
        p.pidfd.try_clone().map_err(EdgeError::sandbox_sys(id, "dup the pidfd"))
    }

    /// Opens an agent channel to sandbox `id`, served by a task that ends
    /// it when the process ends, and shakes hands over it.
    async fn connect(&self, id: &str, pid: i32, state: AgentState) -> Result<Instance, EdgeError> {
        let (ours, theirs) = tokio::net::UnixStream::pair().map_err(EdgeError::sys("socketpair for a fake agent"))?;
        tokio::spawn(serve_agent(theirs, state, self.pidfd(id)?));
        let (agent, _hello) = AgentClient::connect(ours).await?;
        match agent.call(Op::Ping).await? {
            Reply::Pong => Ok(Instance::new(pid, self.pidfd(id)?, agent)),
            other => Err(EdgeError::SetupFailed(format!("unexpected reply to ping: {other:?}"))),
        }
    }

    /// Kills and reaps sandbox `id`'s process and removes its cgroup.
    fn remove(&self, id: &str) -> Result<(), EdgeError> {
        if let Some(p) = lock(&self.procs).remove(id) {
            let _ = dsec_spawn::pidfd_kill(&p.pidfd, libc::SIGKILL);
            // ECHILD, harmlessly, if its Instance reaped it first.
            let _ = dsec_spawn::reap(&p.pidfd);
        }
        self.fs.clear(id);
        Ok(self.cgroups.remove(id)?)
    }
}

impl Drop for FakeBackend {
    fn drop(&mut self) {
        let ids: Vec<String> = lock(&self.procs).keys().cloned().collect();
        for id in ids {
            let _ = self.remove(&id);
        }
    }
}

impl Backend for FakeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Container
    }

    fn start<'a>(
        &'a self,
        id: &'a str,
        spec: &'a SandboxSpec,
        _plan: &'a RootfsPlan,
        durable: Durable,
    ) -> BoxFuture<'a, Result<Instance, EdgeError>> {
        Box::pin(self.start_sandbox(id, spec, durable))
    }

    fn abort_start(&self, id: &str) -> bool {
        self.record(Call::AbortStart(id.to_string()));
        if !self.abortable.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        self.crash(id);
        true
    }

    fn adopt<'a>(&'a self, id: &'a str, pid: i32) -> BoxFuture<'a, Result<Instance, EdgeError>> {
        Box::pin(self.adopt_sandbox(id, pid))
    }

    fn cleanup(&self, id: &str) -> Result<(), EdgeError> {
        self.record(Call::Cleanup(id.to_string()));
        self.remove(id)
    }

    /// The fake kernel freezes at once: the cgroup reports frozen as soon
    /// as the edge asks.
    fn before_freeze<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), EdgeError>> {
        Box::pin(async move {
            let plan = self.plan(Scripted::BeforeFreeze);
            self.record(Call::BeforeFreeze(id.to_string()));
            Self::follow(plan).await.map_err(scripted)?;
            self.fs.report_frozen(id, true);
            Ok(())
        })
    }

    fn after_thaw<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), EdgeError>> {
        Box::pin(async move {
            self.record(Call::AfterThaw(id.to_string()));
            self.fs.report_frozen(id, false);
            Ok(())
        })
    }

    fn condition(&self, id: &str) -> Option<String> {
        lock(&self.conditions).get(id).cloned()
    }
}

/// The agent's end of a fake sandbox's channel: answers the Hello with
/// `state` and `Ping` with `Pong`, refuses any other request, and closes
/// the channel when the process behind `pidfd` ends.
async fn serve_agent(stream: tokio::net::UnixStream, state: AgentState, pidfd: OwnedFd) {
    let Ok(exit) = watch_exit(pidfd) else { return };
    let (mut rd, mut wr) = stream.into_split();
    if !matches!(read_frame_async::<_, ToAgent>(&mut rd).await, Ok(Some(ToAgent::Hello(_)))) {
        return;
    }
    let hello = AgentHello::ours("fake", state);
    if write_frame_async(&mut wr, &FromAgent::Hello(hello)).await.is_err() {
        return;
    }
    loop {
        let frame = tokio::select! {
            _ = exit.readable() => return,
            frame = read_frame_async::<_, ToAgent>(&mut rd) => frame,
        };
        let (id, op) = match frame {
            Ok(Some(ToAgent::Request { id, op })) => (id, op),
            Ok(Some(_)) => continue,
            _ => return,
        };
        let result = match op {
            Op::Ping => Ok(Reply::Pong),
            _ => Err(AgentError::new(ErrorKind::InvalidArgument, "the fake agent answers Ping only")),
        };
        if write_frame_async(&mut wr, &FromAgent::Reply { id, result }).await.is_err() {
            return;
        }
    }
}

/// Images of one empty layer.
pub(crate) struct FakeRootfs;

impl RootfsProvider for FakeRootfs {
    fn plan(&self, _image: &str, _workspace: Option<&str>, _toolkits: &[String]) -> Result<RootfsPlan, EdgeError> {
        Ok(RootfsPlan { workdir: "/".into(), user: "root".into(), ..RootfsPlan::default() })
    }

    fn reap(&self) -> usize {
        0
    }

    fn release(&self) {}
}

/// A node for one test: a temporary directory with the edge's state, its
/// node lock and a fake cgroup tree, and one fake backend serving
/// containers. Edges started on it one after the other share them, as
/// edge processes on one host do across a restart.
pub(crate) struct TestNode {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) fake: Arc<FakeBackend>,
    pub(crate) cgroups: Arc<Cgroups>,
    pub(crate) config: EdgeConfig,
}

impl TestNode {
    /// `tune` adjusts the edge's configuration (capacity, intervals).
    pub(crate) fn new(tune: impl FnOnce(&mut EdgeConfig)) -> TestNode {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut config = EdgeConfig::for_host("n1", dir.path().join("state"), dir.path().join("no-agent"));
        config.prewarm = 0;
        tune(&mut config);
        let root = dir.path().join("cgroup");
        std::fs::create_dir(&root).expect("the fake cgroup root");
        let (fs, cgroups) = FakeCgroupFs::new(&root, &config.cgroup_parent);
        let cgroups = Arc::new(cgroups);
        let fake = Arc::new(FakeBackend::new(cgroups.clone(), fs));
        std::fs::create_dir(&config.state_dir).expect("the state directory");
        TestNode { dir, fake, cgroups, config }
    }

    /// Starts an edge on this node (its node lock must be free).
    pub(crate) async fn start(&self) -> Edge {
        let node_lock = crate::lifecycle::node_lock::lock(&self.dir.path().join("locks"), &self.config.node).expect("the node lock");
        let backends = Arc::new(Backends::containers_only(self.fake.clone()));
        let host = Host { node_lock, cgroups: self.cgroups.clone(), backends, egress: None, denials: None, masked: None };
        Edge::start_on(self.config.clone(), Arc::new(FakeRootfs), host).await.expect("an edge on the test node")
    }
}

pub(crate) fn admin() -> Caller {
    Caller::admin()
}

/// A small container request.
pub(crate) fn request() -> SandboxRequest {
    SandboxRequest { image: "base".into(), memory_mb: Some(64), cpu_cores: Some(0.25), ..SandboxRequest::default() }
}

/// Waits until sandbox `id` has ended (its processes gone and cleaned up)
/// and returns its record.
pub(crate) async fn ended_record(edge: &Edge, id: &str) -> SandboxRecord {
    let entry = edge.entry(&Caller::admin(), id).expect("a listed sandbox");
    let _ = within(&format!("{id} ending"), entry.exited.subscribe().wait_for(|e| *e)).await;
    entry.record()
}
