//! The edge: one per node. It owns every sandbox on the node, from admission
//! to cleanup, and is the only component that touches the host for them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::backends::instance::Instance;
use crate::backends::Backends;
use crate::cgroup::{CgroupMode, Cgroups};
use crate::error::EdgeError;
use crate::images::RootfsProvider;
use crate::lifecycle::admission::{Admission, Capacity, Usage};
use crate::model::{now_ms, Caller, SandboxRecord, State};
use crate::spec::SpecPolicy;
use crate::store::Store;

#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// This node's name; every sandbox id starts with it.
    pub node: String,
    /// The edge's own state: its database and scratch mount point.
    pub state_dir: PathBuf,
    /// The guest agent binary (statically linked).
    pub agent_path: PathBuf,
    pub cgroup_mode: CgroupMode,
    /// Cgroup parent of this node's sandboxes, e.g. `dsec/<node>`.
    pub cgroup_parent: String,
    pub cpu_overcommit: f64,
    pub memory_overcommit: f64,
    pub max_sandboxes: u64,
    pub policy: SpecPolicy,
    /// Creating -> running must finish within this.
    pub create_timeout: Duration,
    /// Stopping -> stopped must finish within this.
    pub stop_timeout: Duration,
    /// Running -> pausing -> paused must finish within this (the freeze).
    pub pause_timeout: Duration,
    /// Paused -> resuming -> running must finish within this.
    pub resume_timeout: Duration,
    /// The node's swap file for paused sandboxes; `None`: pause only
    /// freezes (and drops page cache).
    pub swap: Option<crate::pause::swap::SwapConfig>,
    /// Sandboxes being created at once; more wait in the creation queue.
    /// 0 = no bound and no queue.
    pub max_creating: usize,
    /// Creations that may wait; beyond it creation answers 429.
    pub max_queued_creations: usize,
    /// Stopped and failed records stay listable this long.
    pub retention: Duration,
    pub reap_interval: Duration,
    /// Sweep for idle and expired sandboxes this often.
    pub sweep_interval: Duration,
    /// Stop every sandbox when the edge shuts down (otherwise they keep
    /// running and a restarted edge re-adopts them).
    pub stop_sandboxes_on_shutdown: bool,
    /// Seconds of resource use kept per sandbox and for the node, one
    /// sample a second (0: no sampling).
    pub usage_window_s: usize,
    /// Give every sandbox the system-call filter (seccomp with audited
    /// refusals, no_new_privs). Off only to measure its cost
    /// (`dsec up --no-syscall-filter`).
    pub syscall_filter: bool,
    /// Kernel objects made ahead of demand, per kind: loopback-only network
    /// namespaces for sandboxes without network rules (~0.2 MiB of kernel
    /// memory each) and, on cgroup v1, cgroups (~1 MiB each on a host
    /// with many superblocks); 0 turns both off. Sequential and moderately
    /// parallel creation never makes either; a burst beyond the pool makes
    /// its own, as without one.
    pub prewarm: usize,
    /// Start each container agent with an execve of its own (a fresh
    /// address-space layout per agent) instead of forking it from the spawn
    /// helper, which saves ~0.4 ms of CPU per creation on a VM.
    pub agent_exec: bool,
    /// The microVM backend's settings; `None`: this node runs no microVMs.
    pub vm: Option<crate::backends::MicroVmConfig>,
    /// A microVM must boot to its agent and be set up within this.
    pub vm_boot_timeout: Duration,
    /// Per-sandbox egress (veths, eBPF allowlists, the resolver); `None`:
    /// every sandbox has loopback only.
    pub network: Option<dsec_net::NetConfig>,
    /// The full VM backend's settings; `None`: this node runs no full VMs.
    pub fullvm: Option<crate::backends::FullVmConfig>,
    /// Where containers' writable layers live: the node's disk (a btrfs
    /// subvolume each, bounded by its quota), or a tmpfs in each sandbox's
    /// memory.
    pub writable_layer: crate::disk::WritableLayer,
    /// The address TCP forwards of sandbox ports listen on (each on a port
    /// the kernel picks); loopback unless the operator opens it.
    pub port_forward_addr: std::net::IpAddr,
}

impl EdgeConfig {
    /// Sensible defaults for this host.
    pub fn for_host(node: &str, state_dir: PathBuf, agent_path: PathBuf) -> Self {
        let (cpus, mem_mb) = host_resources();
        Self {
            node: node.to_string(),
            state_dir,
            agent_path,
            cgroup_mode: CgroupMode::Auto,
            cgroup_parent: format!("dsec/{node}"),
            cpu_overcommit: 16.0,
            memory_overcommit: 2.0,
            max_sandboxes: 8192,
            policy: SpecPolicy::for_node(cpus, mem_mb),
            create_timeout: Duration::from_secs(30),
            stop_timeout: Duration::from_secs(10),
            pause_timeout: Duration::from_secs(10),
            resume_timeout: Duration::from_secs(10),
            swap: None,
            max_creating: 64,
            max_queued_creations: 16384,
            retention: Duration::from_secs(3600),
            reap_interval: Duration::from_secs(60),
            sweep_interval: Duration::from_millis(500),
            stop_sandboxes_on_shutdown: false,
            usage_window_s: crate::usage::DEFAULT_WINDOW_S,
            syscall_filter: true,
            prewarm: 16,
            agent_exec: false,
            vm: None,
            vm_boot_timeout: Duration::from_secs(60),
            network: None,
            fullvm: None,
            writable_layer: crate::disk::WritableLayer::Disk(crate::disk::DiskConfig::default()),
            port_forward_addr: std::net::Ipv4Addr::LOCALHOST.into(),
        }
    }
}

/// Online CPUs and total memory (MiB) of this host.
pub fn host_resources() -> (f64, u64) {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
    let mem_mb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("MemTotal:").map(|v| v.trim().trim_end_matches("kB").trim().to_string())))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb / 1024)
        .unwrap_or(1024);
    (cpus, mem_mb)
}

/// Counts requests in flight and the time of the last one, for the idle TTL.
#[derive(Debug)]
pub(crate) struct Activity {
    in_flight: AtomicU32,
    last_ms: AtomicU64,
}

/// Held for the length of one request against a sandbox.
pub struct ActivityGuard {
    entry: Arc<Entry>,
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        self.entry.activity.last_ms.store(now_ms(), Ordering::Relaxed);
        self.entry.activity.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One sandbox in the registry.
pub(crate) struct Entry {
    pub(crate) record: Mutex<SandboxRecord>,
    pub(crate) instance: Mutex<Option<Arc<Instance>>>,
    pub(crate) activity: Activity,
    /// Serialises create and stop of this sandbox.
    pub(crate) op_lock: tokio::sync::Mutex<()>,
    /// The reason of a stop asked for while the sandbox was being created
    /// (`Edge::lock_for_stop`): its creation then ends as `stopped`.
    pub(crate) stop_asked: Mutex<Option<String>>,
    /// Becomes true once the sandbox's processes are gone and cleaned up.
    pub(crate) exited: watch::Sender<bool>,
    /// Whether admission still holds this sandbox's reservation.
    pub(crate) reserved: AtomicBool,
    /// What the sandbox's last `pack_diff` left for the next (in memory: a
    /// restarted edge makes the next pack a full one, still correct).
    pub(crate) pack: Mutex<Option<crate::images::PackState>>,
    /// Held while the trajectory log lists the files a finished step
    /// changed (after its answer went out); the next step waits for it.
    pub(crate) step_gate: Arc<tokio::sync::Mutex<()>>,
    /// Its resource use, second by second (`usage`).
    pub(crate) usage: Mutex<crate::usage::Series>,
}

impl Entry {
    pub(crate) fn new(rec: SandboxRecord, reserved: bool) -> Arc<Self> {
        let last = rec.last_active_ms;
        Arc::new(Entry {
            record: Mutex::new(rec),
            instance: Mutex::new(None),
            activity: Activity { in_flight: AtomicU32::new(0), last_ms: AtomicU64::new(last) },
            op_lock: tokio::sync::Mutex::new(()),
            stop_asked: Mutex::new(None),
            exited: watch::channel(false).0,
            reserved: AtomicBool::new(reserved),
            pack: Mutex::new(None),
            step_gate: Arc::new(tokio::sync::Mutex::new(())),
            usage: Mutex::new(crate::usage::Series::default()),
        })
    }

    pub(crate) fn record(&self) -> SandboxRecord {
        let mut r = lock(&self.record).clone();
        r.last_active_ms = self.activity.last_ms.load(Ordering::Relaxed).max(r.last_active_ms);
        r
    }

    pub(crate) fn state(&self) -> State {
        lock(&self.record).state
    }

    pub(crate) fn stop_asked(&self) -> Option<String> {
        lock(&self.stop_asked).clone()
    }

    pub(crate) fn instance(&self) -> Option<Arc<Instance>> {
        lock(&self.instance).clone()
    }

    pub(crate) fn begin(self: &Arc<Self>) -> ActivityGuard {
        self.activity.in_flight.fetch_add(1, Ordering::Relaxed);
        self.activity.last_ms.store(now_ms(), Ordering::Relaxed);
        ActivityGuard { entry: self.clone() }
    }

    pub(crate) fn idle_since_ms(&self) -> Option<u64> {
        (self.activity.in_flight.load(Ordering::Relaxed) == 0).then(|| self.activity.last_ms.load(Ordering::Relaxed))
    }
}

/// Poison-tolerant lock: a panic elsewhere must not wedge the edge.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) struct EdgeInner {
    pub(crate) config: EdgeConfig,
    /// Held for the edge's life: one edge per node name per host.
    node_lock: crate::lifecycle::node_lock::NodeLock,
    pub(crate) registry: RwLock<HashMap<String, Arc<Entry>>>,
    pub(crate) store: Store,
    pub(crate) admission: Admission,
    pub(crate) cgroups: Arc<Cgroups>,
    pub(crate) backends: Arc<Backends>,
    pub(crate) rootfs: Arc<dyn RootfsProvider>,
    pub(crate) shutdown: watch::Sender<bool>,
    pub(crate) swap: Option<crate::pause::swap::NodeSwap>,
    pub(crate) create_queue: Arc<crate::lifecycle::create_queue::CreateQueue>,
    pub(crate) events: tokio::sync::broadcast::Sender<crate::events::SandboxEvent>,
    /// Trajectory logs and idempotency keys (`journal.db`).
    pub(crate) journal: crate::trajectory::journal::Journal,
    pub(crate) counters: crate::metrics::Counters,
    /// The node's resource use, second by second.
    pub(crate) node_usage: crate::usage::NodeSeries,
    /// Per-sandbox egress, when the node has a network configuration.
    pub(crate) egress: Option<dsec_net::Egress>,
}

/// Handle to a node's edge. Cheap to clone.
#[derive(Clone)]
pub struct Edge {
    pub(crate) inner: Arc<EdgeInner>,
}

/// Load and capacity of a node, for the watcher and placement.
#[derive(Debug, Clone)]
pub struct NodeStats {
    pub node: String,
    /// Sandboxes holding resources (starting, running or stopping; not
    /// paused ones).
    pub running: u64,
    /// Sandboxes being created now, and waiting in the creation queue.
    pub creating: u64,
    pub queued: u64,
    pub capacity: Capacity,
    pub used: Usage,
    pub cgroup_version: u8,
}

impl Edge {
    /// Opens the edge's state, re-adopts or cleans up what an earlier edge
    /// left, reaps strays, and starts the background loops.
    pub async fn start(config: EdgeConfig, rootfs: Arc<dyn RootfsProvider>) -> Result<Edge, EdgeError> {
        // A start that fails half-way must not leave the node's mounts
        // (layer mounts, the shared sysfs) behind.
        let mut undo = StartUndo { rootfs: Some(rootfs.clone()), cgroups: None, backends: None, egress: None };
        let host = Self::open_host(&config, &mut undo)?;
        let assembled = Self::assemble(config, rootfs, host)?;
        undo.disarm();
        Ok(assembled.bring_up().await)
    }

    /// [`Edge::start`] on host parts the caller made: a fake backend over
    /// a temporary cgroup tree (`backends::fake`), so that the lifecycle is
    /// tested without root.
    #[cfg(test)]
    pub(crate) async fn start_on(config: EdgeConfig, rootfs: Arc<dyn RootfsProvider>, host: Host) -> Result<Edge, EdgeError> {
        Ok(Self::assemble(config, rootfs, host)?.bring_up().await)
    }

    /// Takes the node's lock and opens what the edge takes from the host:
    /// its cgroups, its egress and its backends.
    fn open_host(config: &EdgeConfig, undo: &mut StartUndo) -> Result<Host, EdgeError> {
        crate::ids::validate_node_name(&config.node).map_err(EdgeError::Invalid)?;
        std::fs::create_dir_all(&config.state_dir).map_err(EdgeError::io("creating", &config.state_dir))?;
        raise_fd_limit();
        let lock_dir = std::path::Path::new(crate::lifecycle::node_lock::LOCK_DIR);
        let node_lock = crate::lifecycle::node_lock::lock(lock_dir, &config.node)?;
        crate::lifecycle::node_lock::sweep_stale(lock_dir, &config.node);
        let cgroups = Arc::new(Cgroups::open(config.cgroup_mode, &config.cgroup_parent)?);
        undo.cgroups = Some(cgroups.clone());
        // Said once, so an operator knows what latency_sensitive gets here.
        match crate::cgroup::core_sched::support() {
            crate::cgroup::core_sched::Support::Available => {
                tracing::info!("core scheduling: each latency-sensitive sandbox gets a cookie of its own")
            }
            crate::cgroup::core_sched::Support::Unavailable(why) => {
                tracing::info!("core scheduling unavailable ({why}): QoS classes map to CPU weights and policies only")
            }
        }
        if let Err(e) = cgroups.start_pool(config.prewarm) {
            tracing::warn!(error = %e, "no pool of cgroups; sandboxes make their own");
        }
        let (egress, denials) = match &config.network {
            Some(net) => {
                let (e, rx) = start_egress(net, config, &cgroups)?;
                undo.egress = Some(e.clone());
                (Some(e), Some(rx))
            }
            None => (None, None),
        };
        // Mounts the node's sysfs last: nothing between here and the undo
        // registration below can fail.
        let (backends, masked) = Backends::open(crate::backends::BackendsSetup { config, cgroups: &cgroups, egress: egress.as_ref() })?;
        let backends = Arc::new(backends);
        undo.backends = Some(backends.clone());
        Ok(Host { node_lock, cgroups, backends, egress, denials, masked })
    }

    /// Builds the edge on its host parts; the sandbox records it found are
    /// recovered by [`Assembled::bring_up`] once nothing can fail any more.
    fn assemble(config: EdgeConfig, rootfs: Arc<dyn RootfsProvider>, host: Host) -> Result<Assembled, EdgeError> {
        let Host { node_lock, cgroups, backends, egress, denials, masked } = host;
        let (store, records) = Store::open(&config.state_dir.join("edge.db"))?;
        let journal = crate::trajectory::journal::Journal::open(&config.state_dir.join("journal.db"))?;
        let (cpus, mem_mb) = host_resources();
        let admission = Admission::new(Capacity {
            cpu_cores: cpus * config.cpu_overcommit,
            memory_mb: (mem_mb as f64 * config.memory_overcommit) as u64,
            sandboxes: config.max_sandboxes,
        });
        let swap = match &config.swap {
            Some(cfg) => Some(crate::pause::swap::NodeSwap::enable(cfg)?),
            None => None,
        };
        let create_queue = crate::lifecycle::create_queue::CreateQueue::new(config.max_creating, config.max_queued_creations);
        let inner = Arc::new(EdgeInner {
            swap,
            create_queue,
            events: crate::events::channel(),
            journal,
            counters: Default::default(),
            node_usage: crate::usage::NodeSeries::new(config.usage_window_s),
            egress,
            config,
            node_lock,
            registry: RwLock::new(HashMap::new()),
            store,
            admission,
            cgroups,
            backends,
            rootfs,
            shutdown: watch::channel(false).0,
        });
        Ok(Assembled { edge: Edge { inner }, records, denials, masked })
    }

    pub fn node(&self) -> &str {
        &self.inner.config.node
    }

    pub fn config(&self) -> &EdgeConfig {
        &self.inner.config
    }

    pub fn stats(&self) -> NodeStats {
        // Placement asks on every creation: read counters, never walk the
        // registry (thousands of entries).
        let used = self.inner.admission.usage();
        let (creating, queued) = self.inner.create_queue.counts();
        NodeStats {
            node: self.inner.config.node.clone(),
            running: used.sandboxes,
            creating: creating as u64,
            queued: queued as u64,
            capacity: self.inner.admission.capacity(),
            used,
            cgroup_version: self.inner.cgroups.version(),
        }
    }

    /// Scratch space on the node's writable-layer filesystem, when it has
    /// one: where the node's own work makes many small files (packs'
    /// copies, unpacked build contexts) at the cost the sandboxes' own
    /// writes have.
    pub fn scratch_dir(&self) -> Option<PathBuf> {
        self.inner.backends.disk().map(|d| d.scratch_dir().to_path_buf())
    }

    /// The backends this node runs (`container`, and `microvm`, `vm` when
    /// they started), as placement matches them.
    pub fn backends(&self) -> Vec<String> {
        self.inner.backends.names()
    }

    /// Live (not ended) sandboxes per backend (`container`, `microvm`,
    /// `vm`, `fncall`). Walks the registry: for status pages and the
    /// watcher, not for placement.
    pub fn sandboxes_by_backend(&self) -> std::collections::BTreeMap<String, u64> {
        let reg = self.inner.registry.read().unwrap_or_else(|p| p.into_inner());
        let mut counts = std::collections::BTreeMap::new();
        for e in reg.values() {
            let rec = e.record.lock().unwrap_or_else(|p| p.into_inner());
            if !rec.state.is_terminal() {
                let name = match rec.spec.backend {
                    crate::model::BackendKind::Container => "container",
                    crate::model::BackendKind::Microvm => "microvm",
                    crate::model::BackendKind::Vm => "vm",
                    crate::model::BackendKind::Fncall => "fncall",
                };
                *counts.entry(name.to_string()).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Paused sandboxes on this node (walks the registry: for status
    /// pages, not for placement).
    pub fn paused_count(&self) -> u64 {
        let reg = self.inner.registry.read().unwrap_or_else(|p| p.into_inner());
        reg.values().filter(|e| e.state().is_paused()).count() as u64
    }

    pub(crate) fn entry(&self, caller: &Caller, id: &str) -> Result<Arc<Entry>, EdgeError> {
        let reg = self.inner.registry.read().unwrap_or_else(|p| p.into_inner());
        match reg.get(id) {
            Some(e) if caller.may_see(&lock(&e.record).tenant) => Ok(e.clone()),
            _ => Err(EdgeError::SandboxNotFound(id.to_string())),
        }
    }

    /// Stops background loops; stops every sandbox too if configured so.
    pub async fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
        if self.inner.config.stop_sandboxes_on_shutdown {
            let ids: Vec<String> = self.inner.registry.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
            let mut set = tokio::task::JoinSet::new();
            for id in ids {
                let edge = self.clone();
                set.spawn(async move {
                    let _ = edge.stop(&Caller::admin(), &id, "edge shut down").await;
                });
            }
            while set.join_next().await.is_some() {}
            // What a stop could not remove (a process that took longer to
            // die than its cleanup waited, a stop that timed out) would
            // otherwise wait for the next start's reaper: every sandbox is
            // settled now, so the reaper removes all of it.
            self.reap_once().await;
        }
        let _ = self.inner.store.sync().await;
        let rootfs = self.inner.rootfs.clone();
        let _ = tokio::task::spawn_blocking(move || rootfs.release()).await;
        // Before the parent cgroup goes: a backend's own processes (microVM
        // standby QEMUs) have cgroups under it.
        for b in self.inner.backends.all() {
            b.release();
        }
        // Empty once every sandbox is gone (it fails harmlessly otherwise:
        // sandboxes left running for re-adoption keep it).
        self.inner.cgroups.remove_parent();
        // Host swap is never left on behind the edge. Paused sandboxes that
        // stay (no --stop-sandboxes-on-exit) get their pages back in RAM
        // from swapoff: nothing is lost, they just hold memory again.
        if let Some(swap) = &self.inner.swap {
            if let Err(e) = swap.disable() {
                tracing::error!(error = %e, "could not turn the swap file off");
            }
        }
        self.inner.node_lock.remove_file();
    }
}

/// Thousands of sandboxes mean thousands of channel and pid fds.
fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// What an edge takes from its host: the node's lock, its cgroups, its
/// backends and its egress, with the receivers of what they refuse.
pub(crate) struct Host {
    pub(crate) node_lock: crate::lifecycle::node_lock::NodeLock,
    pub(crate) cgroups: Arc<Cgroups>,
    pub(crate) backends: Arc<Backends>,
    pub(crate) egress: Option<dsec_net::Egress>,
    pub(crate) denials: Option<tokio::sync::mpsc::Receiver<dsec_net::Denial>>,
    /// Opens of masked paths (None where fanotify is not available).
    pub(crate) masked: Option<tokio::sync::mpsc::Receiver<crate::ops::audit_forward::Refused>>,
}

/// What [`Edge::assemble`] built, for `start` to bring to life.
struct Assembled {
    edge: Edge,
    records: Vec<crate::model::SandboxRecord>,
    denials: Option<tokio::sync::mpsc::Receiver<dsec_net::Denial>>,
    /// Opens of masked paths (None where fanotify is not available).
    masked: Option<tokio::sync::mpsc::Receiver<crate::ops::audit_forward::Refused>>,
}

impl Assembled {
    /// Forwards audit events, recovers the sandboxes an earlier edge left,
    /// reaps strays and starts the background loops.
    async fn bring_up(self) -> Edge {
        let Assembled { edge, records, denials, masked } = self;
        if let Some(rx) = denials {
            edge.spawn_audit_forwarder(rx, "network", "network attempts refused");
        }
        if let Some(rx) = masked {
            edge.spawn_audit_forwarder(rx, "masked_path", "opens of masked paths");
        }
        edge.recover(records).await;
        edge.reap_once().await;
        edge.spawn_background_loops();
        edge.spawn_usage_sampler();
        tracing::info!(node = %edge.inner.config.node, cgroup = edge.inner.cgroups.version(), "edge ready");
        edge
    }
}

/// What a failed [`Edge::start`] undoes: the node-wide mounts made so far.
struct StartUndo {
    rootfs: Option<Arc<dyn RootfsProvider>>,
    /// The node's cgroup levels (removed where empty).
    cgroups: Option<Arc<Cgroups>>,
    /// The node's backends (their node-wide mounts released).
    backends: Option<Arc<Backends>>,
    egress: Option<dsec_net::Egress>,
}

impl StartUndo {
    fn disarm(&mut self) {
        self.rootfs = None;
        self.cgroups = None;
        self.backends = None;
        self.egress = None;
    }
}

impl Drop for StartUndo {
    fn drop(&mut self) {
        if let Some(b) = self.backends.take() {
            for backend in b.all() {
                backend.release();
            }
        }
        if let Some(e) = self.egress.take() {
            e.shutdown();
        }
        if let Some(r) = self.rootfs.take() {
            r.release();
        }
        if let Some(c) = self.cgroups.take() {
            c.remove_parent();
        }
    }
}

/// Starts the node's egress machinery (dsec-net) over the edge's cgroups.
fn start_egress(
    net: &dsec_net::NetConfig,
    config: &EdgeConfig,
    cgroups: &Cgroups,
) -> Result<(dsec_net::Egress, tokio::sync::mpsc::Receiver<dsec_net::Denial>), EdgeError> {
    let mounts = crate::cgroup::find_cgroup_mounts(std::path::Path::new("/proc/self/mountinfo"))?;
    let v2_root = mounts
        .v2
        .ok_or_else(|| EdgeError::NodeSetup("egress needs a cgroup2 mount (on cgroup v1 hosts: /sys/fs/cgroup/unified)".into()))?;
    let layout = dsec_net::CgroupLayout { v2_root, parent: config.cgroup_parent.clone(), hybrid: cgroups.version() == 1 };
    dsec_net::Egress::start(net.clone(), &config.node, layout, &config.state_dir).map_err(|e| EdgeError::Net(Box::new(e)))
}
