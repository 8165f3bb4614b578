//! `dsec up`: the single-node platform in one process: apiserver,
//! placement and one edge, with embedded storage under the data dir.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use dsec_apiserver::auth::{Authenticator, TokenStore};
use dsec_apiserver::nodes::{Node, Nodes};
use dsec_apiserver::{ApiLimits, AppState, FnCallBackend};
use dsec_edge::cgroup::CgroupMode;
use dsec_edge::{Edge, EdgeConfig, ImageLayers};
use dsec_fncall::{FnCallConfig, FnCallService, PoolConfig};
use dsec_store::Database;

use crate::image_cmd::Catalog;
use crate::tls_args::{Bound, ServeTlsArgs};

#[derive(Args, Debug)]
pub struct UpArgs {
    #[command(flatten)]
    pub edge: EdgeArgs,
    /// Address of the HTTP API.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub tls: ServeTlsArgs,
    /// Largest file or archive upload, in MiB.
    #[arg(long, default_value_t = 4096)]
    pub max_upload_mb: u64,
    /// Serve SandboxFusion's `/run_code` without credentials (its client
    /// sends none). Only for a listener that untrusted clients cannot
    /// reach; otherwise use `/sandboxfusion/TOKEN/run_code`.
    #[arg(long)]
    pub sandboxfusion_open: bool,
    /// Serve sandbox ports by host name: a request for the host
    /// `PORT-ID.DOMAIN` goes to PORT of sandbox ID (point a wildcard DNS
    /// name at this listener). Also the domain the E2B routes report.
    #[arg(long, value_parser = parse_sandbox_domain)]
    pub sandbox_domain: Option<String>,
}

/// A DNS name (letters, digits, '-' and '.'), lowercased.
pub fn parse_sandbox_domain(s: &str) -> Result<String, String> {
    let ok = !s.is_empty() && s.split('.').all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if ok {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(format!("{s:?} is not a domain name (labels of letters, digits and '-', joined by '.')"))
    }
}

/// Options of the node's edge, shared by `dsec up` and `dsec edge`.
#[derive(Args, Debug)]
pub struct EdgeArgs {
    /// Where the platform keeps its state (databases, images, admin token).
    #[arg(long, env = "DSEC_DATA_DIR", default_value = crate::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// This node's name (sandbox ids start with it). Default: the host name.
    #[arg(long)]
    pub node: Option<String>,
    /// Image store directory. Default: DATA_DIR/images.
    #[arg(long)]
    pub images_dir: Option<PathBuf>,
    /// An image store many nodes share: a directory (on NFS, CephFS, a
    /// FUSE-mounted 3FS...) or `s3://bucket[/prefix]` (see --s3-endpoint).
    /// Images this node lacks are read from it (`dsec image push` puts
    /// them there).
    #[arg(long, env = "DSEC_SHARED_STORE")]
    pub shared_store: Option<String>,
    /// With --shared-store: `lazy` starts a sandbox at once and fetches
    /// file data in chunks when first read; `eager` copies whole layers
    /// (verified) before the sandbox starts.
    #[arg(long, default_value = "lazy", requires = "shared_store")]
    pub layer_fetch: dsec_edge::LayerFetch,
    #[command(flatten)]
    pub s3: crate::image_cmd::S3Args,
    /// With --shared-store: bound on this node's layer blobs in MiB (least
    /// recently used layers not in use are evicted; they can be fetched again).
    #[arg(long, requires = "shared_store")]
    pub image_cache_mb: Option<u64>,
    /// The guest agent binary. Default: $DSEC_AGENT, else `dsec-agent` next to this binary.
    #[arg(long, env = "DSEC_AGENT")]
    pub agent: Option<PathBuf>,
    /// cgroup version to drive: auto, v1 or v2.
    #[arg(long, default_value = "auto")]
    pub cgroup: CgroupMode,
    /// Schedulable CPU = cores x this (sandboxes mostly wait).
    #[arg(long, default_value_t = 16.0)]
    pub cpu_overcommit: f64,
    /// Schedulable memory = RAM x this.
    #[arg(long, default_value_t = 2.0)]
    pub memory_overcommit: f64,
    #[arg(long, default_value_t = 8192)]
    pub max_sandboxes: u64,
    /// Size of the node's swap file for paused sandboxes, in MiB (0: none;
    /// a pause then only freezes). It is created at start and turned off
    /// and removed at exit.
    #[arg(long, default_value_t = 0)]
    pub swap_file_mb: u64,
    /// Where the swap file lives. Default: DATA_DIR/edge/NODE/swapfile.
    #[arg(long)]
    pub swap_file: Option<PathBuf>,
    /// Sandboxes being created at once; further creations wait in a queue
    /// (fair across jobs). 0: no bound, no queue.
    #[arg(long, default_value_t = 64)]
    pub max_creating: usize,
    /// Creations that may wait in the queue; beyond it creation answers 429.
    #[arg(long, default_value_t = 16384)]
    pub max_queued_creations: usize,
    /// Stop every sandbox when dsec exits (default: keep them running; the
    /// next `dsec up` on this data dir re-adopts them).
    #[arg(long)]
    pub stop_sandboxes_on_exit: bool,
    /// Seconds of resource use kept per sandbox and for the node, one
    /// sample a second (`GET /v1/sandboxes/{id}/metrics`); 0 turns the
    /// sampler off. Each running sandbox's series takes 32 bytes a second.
    #[arg(long, default_value_t = dsec_edge::usage::DEFAULT_WINDOW_S)]
    pub metrics_window_s: usize,
    /// Start sandboxes without the system-call filter (seccomp and
    /// no_new_privs; docs/security.md). For measuring its cost only: refused
    /// calls then fall back to the capability checks and are not audited.
    #[arg(long)]
    pub no_syscall_filter: bool,
    /// Kernel objects kept made ahead of demand, per kind: loopback-only
    /// network namespaces and (cgroup v1) cgroups. Each takes about half a
    /// millisecond and a quarter off a creation's critical path; 0: every
    /// sandbox makes its own while it is created.
    #[arg(long, default_value_t = 16)]
    pub prewarm: usize,
    /// Start each container's guest agent with an execve of its own, for a
    /// fresh address-space layout per agent, instead of forking it from the
    /// spawn helper (which saves ~0.4 ms of CPU per creation on a VM; every
    /// agent then shares the helper's layout: docs/security.md).
    #[arg(long)]
    pub agent_exec: bool,
    /// Where containers' writable layers live: `disk` (a btrfs subvolume
    /// each on the node's disk, bounded by disk_limit_mb and not held in
    /// memory; named volumes live there too) or `tmpfs` (in each sandbox's
    /// memory, held below its memory limit: for nodes of tiny sandboxes).
    #[arg(long, value_enum, default_value_t = WritableLayerKind::Disk)]
    pub writable_layer: WritableLayerKind,
    /// The node's disk for `--writable-layer disk`: an image file (made
    /// with mkfs.btrfs if missing), a block device holding a btrfs, or a
    /// directory on a mounted btrfs. Default: DATA_DIR/edge/NODE/writable.img,
    /// loop-mounted while the edge runs.
    #[arg(long)]
    pub writable_layer_source: Option<PathBuf>,
    /// The address TCP forwards of sandbox ports listen on
    /// (`POST /v1/sandboxes/ID/forwards`, `dsec port ID PORT --tcp`): loopback
    /// by default; give the node's address (or 0.0.0.0) to publish them.
    #[arg(long, default_value = "127.0.0.1")]
    pub port_forward_addr: std::net::IpAddr,
    /// Size of the image file the edge makes (sparse: it takes on the host
    /// what is written). Default: half the free space, at most 1 TiB.
    #[arg(long)]
    pub writable_layer_size_gb: Option<u64>,
    /// FnCall runner pools: LANG=MIN:MAX, comma-separated. Default: python
    /// 2 to 2 per core, bash and cpp 1 to 1 per core, the others (c, java,
    /// javascript, go, rust, php, ruby, perl, lua) 0 to 1 per core.
    #[arg(long)]
    pub fncall_pools: Option<String>,
    /// FnCall calls waiting for a runner, per language; one more gets 429.
    #[arg(long, default_value_t = 4096)]
    pub fncall_queue_limit: usize,
    /// Seconds a runner above its pool's minimum may stay idle before it is
    /// stopped.
    #[arg(long, default_value_t = 60)]
    pub fncall_idle_s: u64,
    /// The image FnCall runners start from.
    #[arg(long, default_value = "judge")]
    pub fncall_image: String,
    /// Python modules the FnCall zygote imports once, before forking calls
    /// (comma-separated; default: a few of the standard library's most used).
    #[arg(long)]
    pub fncall_preload: Option<String>,
    /// Do not serve FnCall on this node.
    #[arg(long)]
    pub no_fncall: bool,
    /// How microVMs run guest code: auto (KVM if a probe boot under it
    /// works, else TCG emulation), kvm or tcg.
    #[arg(long, default_value = "auto")]
    pub vm_accel: dsec_edge::backends::qemu::cmdline::AccelChoice,
    /// The QEMU binary of microVMs.
    #[arg(long, default_value = "qemu-system-x86_64")]
    pub qemu: PathBuf,
    /// MicroVM guests hand the pages they free back to the host (virtio
    /// balloon free page reporting); `false` keeps them resident.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub vm_free_page_reporting: bool,
    /// microVM guest RAM as a file under the state directory (shared
    /// mapping), so a suspend saves device state only; `false`: anonymous
    /// guest RAM, and a suspend writes all of it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub vm_ram_file: bool,
    /// TCG translation cache per microVM and full VM, MiB (each VM's QEMU
    /// keeps up to this much translated code resident; unused under KVM).
    #[arg(long, default_value_t = dsec_edge::backends::qemu::cmdline::DEFAULT_TB_SIZE_MB)]
    pub vm_tb_size_mb: u32,
    /// New microVMs restore a memory image of a freshly booted guest of
    /// their shape (one per shape, made by the first) instead of booting;
    /// `false`: every microVM boots cold.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub vm_templates: bool,
    /// Seconds a microVM may take to boot to its agent.
    #[arg(long, default_value_t = 60)]
    pub vm_boot_timeout_s: u64,
    /// The node's network configuration (JSON: sandbox subnet, warm pool,
    /// DNS upstream, named services; docs/security.md, "Egress"). Default:
    /// `<data-dir>/network.json` if it exists (`dsec network-config init`
    /// writes it). Without one every sandbox has loopback only and allow
    /// rules are refused.
    #[arg(long)]
    pub network_config: Option<PathBuf>,
    /// Where full VM (backend "vm") base images are, as `<name>.qcow2`
    /// (default: `<images-dir>/vm/images`, where `dsec image setup` puts
    /// `debian-vm`).
    #[arg(long)]
    pub vm_images_dir: Option<PathBuf>,
    /// Firmware of full VMs: seabios (BIOS) or ovmf (UEFI, Debian package
    /// ovmf).
    #[arg(long, default_value = "seabios")]
    pub vm_firmware: dsec_edge::backends::fullvm::cmdline::Firmware,
    /// Seconds a full VM may take to boot its OS to the agent.
    #[arg(long, default_value_t = 300)]
    pub full_vm_boot_timeout_s: u64,
    /// How full VMs get their toolkit layers: pmem (virtio-pmem, mapped
    /// with DAX: one copy in the host's page cache for every VM) or blk
    /// (read-only virtio-blk disks).
    #[arg(long, default_value = "pmem")]
    pub vm_layers: dsec_edge::backends::fullvm::cmdline::LayerBus,
}

/// `python=2:8,cpp=0:4` -> pool configs.
pub fn parse_pools(spec: &str) -> anyhow::Result<Vec<PoolConfig>> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let parse = || -> Option<PoolConfig> {
            let (language, range) = item.split_once('=')?;
            let (min, max) = range.split_once(':')?;
            let (min, max): (u32, u32) = (min.trim().parse().ok()?, max.trim().parse().ok()?);
            (!language.trim().is_empty() && max >= 1 && min <= max).then(|| PoolConfig { language: language.trim().to_string(), min, max })
        };
        out.push(parse().with_context(|| format!("--fncall-pools: {item:?} is not LANG=MIN:MAX with 1 <= MAX and MIN <= MAX"))?);
    }
    Ok(out)
}

fn default_node_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String =
        host.trim().to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).take(32).collect();
    let name = name.trim_start_matches('-').to_string();
    if name.is_empty() {
        "node".into()
    } else {
        name
    }
}

fn default_agent() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this executable")?;
    Ok(exe.with_file_name("dsec-agent"))
}

/// One `dsec up` per data dir: a second one would fight the first over the
/// same cgroups, mounts and databases.
fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("dsec.lock"))
        .with_context(|| format!("opening {}/dsec.lock", dir.display()))?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        anyhow::bail!("another dsec is already running on {}", dir.display());
    }
    Ok(f)
}

/// A running edge and the lock that keeps a second one off its data dir.
pub struct StartedEdge {
    pub edge: Edge,
    pub fncall: Option<Arc<FnCallService>>,
    pub images_dir: PathBuf,
    _lock: std::fs::File,
}

impl EdgeArgs {
    pub async fn start(&self) -> anyhow::Result<StartedEdge> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            anyhow::bail!("dsec needs root to run an edge: it creates namespaces, cgroups and mounts");
        }
        std::fs::create_dir_all(&self.data_dir).with_context(|| format!("creating {}", self.data_dir.display()))?;
        let lock = lock_data_dir(&self.data_dir)?;
        let node = self.node.clone().unwrap_or_else(default_node_name);
        let images_dir = self.images_dir.clone().unwrap_or_else(|| self.data_dir.join("images"));
        let agent = match &self.agent {
            Some(p) => p.clone(),
            None => default_agent()?,
        };
        // Whatever a bad flag or file can refuse is read before the layers
        // open: opening mounts them, and a refused start must leave nothing.
        let default_network = dsec_net::defaults::path_in(&self.data_dir);
        let network_config = self.network_config.clone().or_else(|| default_network.exists().then_some(default_network));
        let network = network_config.as_deref().map(dsec_edge::NetConfig::load).transpose()?;
        let pools = self.fncall_pools.as_deref().map(parse_pools).transpose()?;
        let mut layers = ImageLayers::open(&images_dir, &self.data_dir.join("layers").join(&node))?;
        if let Some(shared) = &self.shared_store {
            layers = layers.with_shared_store(shared, &self.s3.options(), self.image_cache_mb, self.layer_fetch)?;
        }
        let layers = Arc::new(layers);
        let state_dir = self.data_dir.join("edge").join(&node);
        let mut config = EdgeConfig::for_host(&node, state_dir.clone(), agent);
        if self.swap_file_mb > 0 {
            let path = self.swap_file.clone().unwrap_or_else(|| state_dir.join("swapfile"));
            config.swap = Some(dsec_edge::pause::swap::SwapConfig { path, size_mb: self.swap_file_mb });
        }
        config.max_creating = self.max_creating;
        config.max_queued_creations = self.max_queued_creations;
        config.cgroup_mode = self.cgroup;
        config.cpu_overcommit = self.cpu_overcommit;
        config.memory_overcommit = self.memory_overcommit;
        config.max_sandboxes = self.max_sandboxes;
        config.stop_sandboxes_on_shutdown = self.stop_sandboxes_on_exit;
        config.usage_window_s = self.metrics_window_s;
        config.syscall_filter = !self.no_syscall_filter;
        config.prewarm = self.prewarm;
        config.agent_exec = self.agent_exec;
        config.port_forward_addr = self.port_forward_addr;
        config.writable_layer = match self.writable_layer {
            WritableLayerKind::Tmpfs => dsec_edge::disk::WritableLayer::Tmpfs,
            WritableLayerKind::Disk => dsec_edge::disk::WritableLayer::Disk(dsec_edge::disk::DiskConfig {
                source: self.writable_layer_source.clone(),
                image_size_gb: self.writable_layer_size_gb,
            }),
        };
        let mut vm = dsec_edge::backends::microvm::VmConfig::new(dsec_image::vm::vm_dir(&images_dir));
        vm.accel = self.vm_accel;
        vm.qemu = self.qemu.clone();
        vm.free_page_reporting = self.vm_free_page_reporting;
        vm.ram_file = self.vm_ram_file;
        vm.tb_size_mb = self.vm_tb_size_mb;
        vm.templates = self.vm_templates;
        let mut fullvm = dsec_edge::backends::fullvm::FullVmConfig::new(
            self.vm_images_dir.clone().unwrap_or_else(|| dsec_image::vm::base_image::images_dir(&dsec_image::vm::vm_dir(&images_dir))),
        );
        fullvm.firmware = self.vm_firmware;
        fullvm.qemu = self.qemu.clone();
        fullvm.accel = self.vm_accel;
        fullvm.run_root = vm.run_root.clone();
        fullvm.free_page_reporting = self.vm_free_page_reporting;
        fullvm.boot_timeout = Duration::from_secs(self.full_vm_boot_timeout_s);
        fullvm.layer_bus = self.vm_layers;
        fullvm.tb_size_mb = self.vm_tb_size_mb;
        config.fullvm = Some(fullvm);
        config.vm = Some(vm);
        config.vm_boot_timeout = Duration::from_secs(self.vm_boot_timeout_s);
        config.network = network;
        let edge = Edge::start(config, layers).await?;
        let fncall = if self.no_fncall {
            None
        } else {
            let mut cfg = FnCallConfig::for_node(dsec_edge::host_resources().0);
            cfg.image = self.fncall_image.clone();
            if let Some(pools) = pools {
                cfg.pools = pools;
            }
            cfg.queue_limit = self.fncall_queue_limit;
            cfg.shrink_after = Duration::from_secs(self.fncall_idle_s);
            if let Some(p) = &self.fncall_preload {
                cfg.preload = p.split(',').map(str::trim).filter(|m| !m.is_empty()).map(String::from).collect();
            }
            Some(FnCallService::start(edge.clone(), cfg).await)
        };
        Ok(StartedEdge { edge, fncall, images_dir, _lock: lock })
    }
}

pub async fn run(a: UpArgs) -> anyhow::Result<u8> {
    let started = a.edge.start().await?;
    let data_dir = &a.edge.data_dir;
    let tokens = TokenStore::open(&Database::Sqlite(data_dir.join("apiserver.db")), &data_dir.join("admin-token")).await?;
    let state = AppState {
        auth: Arc::new(Authenticator::Tokens(tokens)),
        nodes: Arc::new(Nodes::new(vec![Node::Local(started.edge.clone())])),
        images: Some(Arc::new(Catalog::open(&started.images_dir)?)),
        limits: Arc::new(ApiLimits { max_upload_bytes: a.max_upload_mb << 20 }),
        fncall: started.fncall_backend(),
        sandboxfusion_open: a.sandboxfusion_open,
        http_metrics: Default::default(),
        sandbox_domain: a.sandbox_domain.clone(),
        builder: Some(started.builder()?),
    };
    let what = format!("node {}; admin token in {}", started.edge.node(), data_dir.join("admin-token").display());
    serve(a.listen, a.tls.server_config()?, state, &what, Some(started.edge.clone())).await?;
    started.shutdown().await;
    Ok(0)
}

impl StartedEdge {
    /// The Dockerfile builder of this edge (contexts unpack under its
    /// state directory).
    pub fn builder(&self) -> anyhow::Result<Arc<dsec_build::Builder>> {
        let store = dsec_image::ImageStore::open(&self.images_dir).with_context(|| format!("opening {}", self.images_dir.display()))?;
        // Contexts unpack where file creation is cheapest.
        let scratch = self.edge.scratch_dir().unwrap_or_else(|| self.edge.config().state_dir.clone()).join("build");
        Ok(Arc::new(dsec_build::Builder::new(self.edge.clone(), Arc::new(store), scratch)))
    }

    pub fn fncall_backend(&self) -> Option<Arc<FnCallBackend>> {
        self.fncall.clone().map(|s| Arc::new(FnCallBackend::Local(s)))
    }

    /// Removes the FnCall runners, then shuts the edge down.
    pub async fn shutdown(&self) {
        if let Some(f) = &self.fncall {
            tokio::time::timeout(Duration::from_secs(30), f.shutdown()).await.ok();
        }
        tokio::time::timeout(Duration::from_secs(60), self.edge.shutdown()).await.ok();
    }
}

/// Serves the API until SIGINT or SIGTERM. Then requests in flight are
/// answered before this returns; `edge`, the node this process runs, if
/// any, first has its creations in flight cut short, so that none holds the
/// shutdown for a VM's boot.
pub async fn serve(
    listen: SocketAddr,
    tls: Option<Arc<dsec_tls::ServerConfig>>,
    state: AppState,
    what: &str,
    edge: Option<Edge>,
) -> anyhow::Result<()> {
    serve_on(Bound::bind(listen, tls).await?, state, what, edge).await
}

/// Serves on a socket bound earlier: connections made between the bind and
/// this call wait in its backlog and are answered.
pub async fn serve_on(listener: Bound, state: AppState, what: &str, edge: Option<Edge>) -> anyhow::Result<()> {
    state.start_quota_watch();
    eprintln!("dsec is up at {} ({what})", listener.url()?);
    let signalled = async move {
        shutdown_signal().await;
        if let Some(edge) = edge {
            edge.stop_creations("the node shut down");
        }
    };
    listener.serve(dsec_apiserver::router(state), signalled).await.context("serving the API")?;
    eprintln!("dsec is shutting down");
    Ok(())
}

pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// `--writable-layer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WritableLayerKind {
    Disk,
    Tmpfs,
}
