//! The full VM backend (`backend="vm"`): QEMU's `q35` machine booting a
//! whole operating system from its own disk, with firmware (SeaBIOS, or
//! OVMF for UEFI), a VGA screen, a PS/2 keyboard and a virtio tablet.
//!
//! Host side, per VM: the sandbox's cgroup (QEMU joins it before it
//! execs), a run directory under the same root as microVMs' (agent socket,
//! QMP socket, console log, OVMF's variable store), and a qcow2 overlay on
//! the image's base disk (`<images>/vm/images/<name>.qcow2`), so every VM
//! starts from the same base and writes only its own blocks. The image
//! starts the same guest agent at boot (`dsec-agent guest`), which finds
//! its virtio-serial port by name; the edge then talks to it exactly as
//! to a microVM's (the QEMU spawn, the agent handshake and re-attachment
//! are the QEMU layer's, `qemu/`).
//!
//! The screen (`screen`, `input`): QMP `screendump` and `input-send-event`.
//! Stop is a SIGKILL to QEMU; the exit watcher's cleanup removes the run
//! directory, the overlay and the cgroup.
//!
//! Suspend, restore and snapshots are the QEMU layer's
//! (`qemu::suspend::suspend_qemu`, `restore_qemu`, `qemu::disk::snapshot_disk`): guest RAM
//! is anonymous memory here, so a suspend image holds all of it (QEMU
//! skips zero pages); shared memory (read-only pmem layers) is left out of
//! it. A snapshot is a copy of the VM's overlay, whose backing file is the
//! image's base disk (or the snapshot the VM started from); a VM started
//! from one boots from a new overlay on it.
//!
//! Network rules (`net`): a virtio-net NIC on QEMU's user-mode network,
//! QEMU in the sandbox's warm namespace and cgroup2 directory, as for a
//! microVM; the guest's addressing is written by the edge through the
//! agent.

pub mod cmdline;
pub mod disk_cap;
pub mod input;
pub mod net;
pub mod pmem;
pub mod screen;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dsec_agent_proto::VmSetup;

use crate::backends::instance::Instance;
use crate::backends::microvm::MicroVmBackend;
use crate::backends::qemu::agent::{self, BootWait};
use crate::backends::qemu::cmdline::{self as qemu_cmdline, Accel, AccelChoice, VmFiles};
use crate::backends::qemu::undo::Undo;
use crate::backends::qemu::{cleanup, disk, net as qemu_net, process, qmp, suspend};
use crate::backends::{Backend, BoxFuture, Durable, NoNetwork, Unavailable};
use crate::cgroup::Cgroups;
use crate::error::EdgeError;
use crate::images::{RootfsPlan, RootfsProvider};
use crate::model::{BackendKind, SandboxSpec};
use cmdline::{Firmware, FullVmLaunch, LayerBus};

/// Host memory a full VM's QEMU needs beyond its guest's RAM: the microVM
/// allowance plus the VGA memory (16 MiB) and the firmware's.
pub const QEMU_OVERHEAD_MB: u64 = 200;
/// A full VM's guest boots a whole distribution: less than this and its
/// initramfs does not fit.
pub const MIN_MEMORY_MB: u64 = 256;

/// The node's full VM settings.
#[derive(Debug, Clone)]
pub struct FullVmConfig {
    /// Where the base images are (`<images>/vm/images`).
    pub images_dir: PathBuf,
    pub firmware: Firmware,
    pub qemu: PathBuf,
    pub accel: AccelChoice,
    /// Root of the VMs' run directories (shared with microVMs).
    pub run_root: PathBuf,
    pub free_page_reporting: bool,
    /// A whole OS boots slower than a microVM's agent-as-init.
    pub boot_timeout: Duration,
    /// How toolkit layers reach the guest.
    pub layer_bus: LayerBus,
    /// TCG's translation cache per VM, MiB (the node's, as microVMs').
    pub tb_size_mb: u32,
}

impl FullVmConfig {
    pub fn new(images_dir: PathBuf) -> Self {
        Self {
            images_dir,
            firmware: Firmware::Seabios,
            qemu: "qemu-system-x86_64".into(),
            accel: AccelChoice::Auto,
            run_root: "/run/dsec/vm".into(),
            free_page_reporting: true,
            boot_timeout: Duration::from_secs(300),
            layer_bus: LayerBus::Pmem,
            tb_size_mb: qemu_cmdline::DEFAULT_TB_SIZE_MB,
        }
    }
}

pub struct FullVmBackend {
    cgroups: Arc<Cgroups>,
    node: String,
    cfg: FullVmConfig,
    qemu: PathBuf,
    overlay_dir: PathBuf,
    /// 2 MiB-aligned copies of layer files for virtio-pmem.
    pmem_dir: PathBuf,
    /// The microVM backend's KVM probe, when that backend runs here (it
    /// boots a kernel once; a full VM has no kernel of the edge's to probe
    /// with). Without it, `auto` means TCG.
    probe: Option<Arc<MicroVmBackend>>,
    /// Where suspend images live (the microVMs' directory).
    suspend_dir: PathBuf,
    /// The node's disk snapshots (the same directory as microVMs').
    pub snapshots: crate::backends::snapshot::SnapshotDir,
    /// Per-sandbox egress, for VMs created with network rules.
    egress: Option<dsec_net::Egress>,
}

impl FullVmBackend {
    /// Finds QEMU and qemu-img; an error names what is missing.
    pub fn new(
        cgroups: Arc<Cgroups>,
        cfg: &FullVmConfig,
        node: &str,
        state_dir: &Path,
        probe: Option<Arc<MicroVmBackend>>,
    ) -> Result<Self, Unavailable> {
        let qemu = process::require_program(&cfg.qemu, "qemu-system-x86")?;
        process::require_program(Path::new("qemu-img"), "qemu-utils")?;
        if cfg.firmware == Firmware::Ovmf && !Path::new(cmdline::OVMF_CODE).is_file() {
            return Err(Unavailable::MissingFile { path: cmdline::OVMF_CODE.into(), package: "ovmf" });
        }
        let vm_state = state_dir.join("vm");
        let (overlay_dir, pmem_dir, suspend_dir) = (vm_state.join("overlays"), vm_state.join("pmem"), vm_state.join("suspend"));
        for d in [&overlay_dir, &suspend_dir, &cfg.run_root] {
            std::fs::create_dir_all(d).map_err(Unavailable::state_dir(d))?;
        }
        let snapshots = crate::backends::snapshot::SnapshotDir::open(vm_state.join("snapshots"))?;
        Ok(Self {
            cgroups,
            node: node.to_string(),
            cfg: cfg.clone(),
            qemu,
            overlay_dir,
            pmem_dir,
            probe,
            suspend_dir,
            snapshots,
            egress: None,
        })
    }

    /// Gives VMs created with network rules the node's egress.
    pub fn with_egress(mut self, egress: dsec_net::Egress) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Whether this node can give a full VM a network under its rules.
    pub(crate) fn network_ready(&self) -> Result<(), NoNetwork> {
        self.egress.as_ref().map(drop).ok_or(NoNetwork::EgressOff)
    }

    /// The suspend image of `id`.
    fn image_path(&self, id: &str) -> PathBuf {
        self.suspend_dir.join(format!("{id}.vmstate"))
    }

    fn launch<'a>(&self, accel: Accel, spec: &SandboxSpec, plan: &'a RootfsPlan, files: &'a VmFiles, incoming: bool) -> FullVmLaunch<'a> {
        FullVmLaunch {
            accel,
            firmware: self.cfg.firmware,
            memory_mb: spec.limits.memory_mb,
            vcpus: qemu_cmdline::vcpus_for(spec.limits.cpu_cores),
            tb_size_mb: self.cfg.tb_size_mb,
            files,
            disk_limit_bytes: spec.limits.disk_mb << 20,
            free_page_reporting: self.cfg.free_page_reporting,
            layers: &plan.layer_files,
            layer_bus: self.cfg.layer_bus,
            incoming,
        }
    }

    async fn restore_vm(&self, id: &str, spec: &SandboxSpec, plan: &RootfsPlan) -> Result<Instance, EdgeError> {
        let files = self.files(id);
        // An overlay suspended before the write cap existed is shorter.
        disk_cap::cap(&files.disk, spec.limits.disk_mb << 20)?;
        let mut args = cmdline::qemu_args(&self.launch(self.accel().await, spec, plan, &files, true));
        // The same NIC as at boot, in the same namespace and cgroup2
        // directory.
        let net = qemu_net::network_of(self.egress.as_ref(), id)?;
        if net.is_some() {
            args.extend(net::qemu_args());
        }
        suspend::restore_qemu(&self.cgroups, &self.qemu, id, args, &files, &self.image_path(id), true, net.as_ref()).await
    }

    pub fn files(&self, id: &str) -> VmFiles {
        VmFiles { run_dir: self.cfg.run_root.join(id), disk: self.overlay_dir.join(format!("{id}.qcow2")) }
    }

    /// The base disk of image `name`, or why there is none.
    pub fn base_image(&self, name: &str) -> Result<PathBuf, EdgeError> {
        dsec_image::vm::base_image::image_path(&self.cfg.images_dir, name).map_err(|e| EdgeError::ImageNotFound(e.to_string()))
    }

    /// The size of image `name`'s disk, MiB (rounded up): a full VM's
    /// disk is at least that (its filesystems fill it).
    pub fn image_disk_mb(&self, name: &str) -> Result<u64, EdgeError> {
        let base = self.base_image(name)?;
        let bytes = crate::backends::snapshot::virtual_size(&base)
            .ok_or_else(|| EdgeError::ImageNotFound(format!("{} is not a qcow2 disk", base.display())))?;
        Ok(bytes.div_ceil(1 << 20))
    }

    /// A full VM's read-only layers: those of each toolkit image (the
    /// request's `toolkits`, last = topmost), mounted in the guest at
    /// `/opt/dsec/layers/<i>`. The base image is the VM image itself.
    pub fn plan(&self, rootfs: &dyn RootfsProvider, spec: &SandboxSpec) -> Result<RootfsPlan, EdgeError> {
        // disk_limit_mb caps what the VM may write (disk_cap); its disk
        // is the image's, larger only if the limit is.
        self.image_disk_mb(&spec.image)?;
        if spec.limits.disk_mb < disk_cap::MIN_LIMIT_MB {
            return Err(EdgeError::InvalidLimits(format!(
                "a full VM needs room for the writes of its boot: disk_limit_mb must be at least {}, not {}",
                disk_cap::MIN_LIMIT_MB,
                spec.limits.disk_mb
            )));
        }
        if spec.workspace.is_some() {
            return Err(EdgeError::Invalid("a full VM has no workspace layer: give the layers it needs as toolkits".into()));
        }
        let mut plan = RootfsPlan::default();
        for toolkit in spec.toolkits.iter().rev() {
            let toolkit = rootfs.plan(toolkit, None, &[])?;
            plan.layer_files.extend(toolkit.layer_files);
            plan.lower_dirs.extend(toolkit.lower_dirs);
        }
        if self.cfg.layer_bus == LayerBus::Pmem {
            if plan.lower_dirs.len() != plan.layer_files.len() {
                return Err(EdgeError::NodeSetup("the toolkit layers are not all mounted on the host".into()));
            }
            let (dir, mounts) = (&self.pmem_dir, &plan.lower_dirs);
            plan.layer_files = plan.layer_files.iter().zip(mounts).map(|(f, m)| pmem::dax_copy(dir, f, m)).collect::<Result<_, _>>()?;
        }
        Ok(plan)
    }

    async fn accel(&self) -> Accel {
        match (self.cfg.accel, &self.probe) {
            (AccelChoice::Kvm, _) => Accel::Kvm,
            (AccelChoice::Tcg, _) | (AccelChoice::Auto, None) => Accel::Tcg,
            (AccelChoice::Auto, Some(m)) => m.accel().await,
        }
    }

    /// How long a full VM may take to boot to its agent.
    fn boot_wait(&self, accel: Accel) -> BootWait {
        BootWait { timeout: self.cfg.boot_timeout, accel, what: "VM", hint: "; does the image start `dsec-agent guest`?" }
    }

    async fn start_vm(&self, id: &str, spec: &SandboxSpec, plan: &RootfsPlan, durable: Durable) -> Result<Instance, EdgeError> {
        let base = self.base_image(&spec.image)?;
        let limits = crate::backends::cgroup_limits(spec, QEMU_OVERHEAD_MB);
        let mut undo = Undo::begin(&self.cgroups, id, &limits, durable).await?;
        // From here on it has files (and maybe a network) too.
        undo.then(|| {
            let _ = self.cleanup(id);
        });
        let files = self.files(id);
        let (f2, firmware) = (files.clone(), self.cfg.firmware);
        // A VM started from a snapshot boots from a disk chained onto it.
        let backing = match &spec.snapshot {
            Some(snap) => Backing::Snapshot(self.snapshots.clone(), snap.clone()),
            None => Backing::Base(base, spec.limits.disk_mb << 20),
        };
        let limit = spec.limits.disk_mb << 20;
        tokio::task::spawn_blocking(move || prepare_files(&f2, backing, limit, firmware))
            .await
            .map_err(EdgeError::task("disk preparation"))??;
        let accel = self.accel().await;
        let launch = self.launch(accel, spec, plan, &files, false);
        let mut args = cmdline::qemu_args(&launch);
        let egress = self.egress.as_ref().filter(|_| !spec.network_rules.is_empty());
        let qemu_net = egress.map(|eg| qemu_net::prepare_network(eg, id, spec)).transpose()?;
        if qemu_net.is_some() {
            args.extend(net::qemu_args());
        }
        let spawned = process::spawn_qemu(&self.cgroups, &self.qemu, id, args, &files.run_dir, None, qemu_net.as_ref());
        if let (Some(eg), Some(n)) = (egress, qemu_net) {
            // The edge holds the namespace for the sandbox's life: a
            // suspended VM has no QEMU to hold it.
            eg.keep_netns(id, n.netns);
        }
        let (pid, pidfd) = spawned?;
        let pidfd = undo.spawned(pid, pidfd);
        let setup = VmSetup {
            sandbox_id: id.to_string(),
            hostname: crate::ids::short_id(id).to_string(),
            // The guest's own disk is its root; only toolkit layers are
            // mounted (read-only, at /opt/dsec/layers/<i>).
            layer_disks: (0..plan.layer_files.len()).map(|i| cmdline::layer_name(self.cfg.layer_bus, i)).collect(),
            writable_disk: String::new(),
            now_ms: crate::model::now_ms(),
            masked_paths: Vec::new(),
            readonly_paths: Vec::new(),
            env: crate::backends::container::merged_env(&[], spec),
            workdir: spec.workdir.clone().unwrap_or_else(|| "/root".into()),
            default_user: spec.init_user.clone(),
            nic: egress.map(|_| net::guest_nic()),
        };
        let resolv_conf = egress.map(|e| e.resolv_conf());
        let agent = agent::boot_to_ready(&files, pidfd, setup, resolv_conf, &self.boot_wait(accel)).await?;
        undo.ready(agent)
    }

    /// The screen of running VM `id`.
    async fn capture_screen(&self, id: &str) -> Result<crate::backends::Screenshot, EdgeError> {
        let files = self.files(id);
        screen::capture(&files.qmp_socket(), &files.run_dir).await
    }

    /// Sends input events (`input::*`) to VM `id`'s keyboard and tablet.
    async fn send_input(&self, id: &str, events: Vec<serde_json::Value>) -> Result<(), EdgeError> {
        let socket = self.files(id).qmp_socket();
        // QEMU takes a batch as one command; very long texts go in slices
        // so no single command holds QMP long.
        for chunk in events.chunks(512) {
            qmp::execute_with(&socket, "input-send-event", serde_json::json!({ "events": chunk })).await?;
        }
        Ok(())
    }
}

/// What a VM's overlay is made over.
enum Backing {
    /// The image's base disk, and the disk size asked for (bytes).
    Base(PathBuf, u64),
    /// A snapshot (by id) of the node's.
    Snapshot(crate::backends::snapshot::SnapshotDir, String),
}

/// The run directory, the overlay (`qemu-img create`: a few KiB, the
/// backing disk's size; capped at `limit` bytes on the host) and, for
/// OVMF, a private copy of its variables.
fn prepare_files(files: &VmFiles, backing: Backing, limit: u64, firmware: Firmware) -> Result<(), EdgeError> {
    std::fs::create_dir_all(&files.run_dir).map_err(EdgeError::io("creating", &files.run_dir))?;
    match backing {
        Backing::Base(base, size) => {
            // Larger than the image only if asked: the guest sees a bigger disk.
            let grow = crate::backends::snapshot::virtual_size(&base).is_some_and(|b| size > b);
            crate::backends::snapshot::create_overlay_of_size(&base, &files.disk, grow.then_some(size))?
        }
        Backing::Snapshot(snaps, id) => snaps.chain_onto(&id, &files.disk)?,
    }
    disk_cap::cap(&files.disk, limit)?;
    if firmware == Firmware::Ovmf {
        let vars = cmdline::ovmf_vars(files);
        std::fs::copy(cmdline::OVMF_VARS, &vars).map_err(EdgeError::io("copying the UEFI variables", Path::new(cmdline::OVMF_VARS)))?;
    }
    Ok(())
}

impl crate::backends::Screen for FullVmBackend {
    fn check_input(&self, action: &crate::backends::ScreenInput) -> Result<(), EdgeError> {
        input::events(action).map(drop).map_err(EdgeError::Invalid)
    }

    fn screenshot<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<crate::backends::Screenshot, EdgeError>> {
        Box::pin(self.capture_screen(id))
    }

    fn input<'a>(&'a self, id: &'a str, action: crate::backends::ScreenInput) -> BoxFuture<'a, Result<(), EdgeError>> {
        Box::pin(async move {
            let mut events = input::events(&action).map_err(EdgeError::Invalid)?;
            if let Some((x, y)) = input::target(&action) {
                // Pixels are relative to the screen as it is now (its mode
                // can change at any time: text console, a desktop's
                // resolution).
                let shot = self.capture_screen(id).await?;
                let mut moves = input::move_events(x, y, shot.width, shot.height).map_err(EdgeError::Invalid)?;
                moves.append(&mut events);
                events = moves;
            }
            self.send_input(id, events).await
        })
    }
}

impl crate::backends::DiskSnapshots for FullVmBackend {
    fn snapshot_disk<'a>(
        &'a self,
        id: &'a str,
        running: bool,
        meta: crate::backends::SnapshotMeta,
    ) -> BoxFuture<'a, Result<(crate::backends::SnapshotMeta, f64), EdgeError>> {
        Box::pin(disk::snapshot_disk(&self.snapshots, self.files(id), running, meta))
    }

    fn disk_dir(&self) -> &Path {
        &self.overlay_dir
    }
}

impl Backend for FullVmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Vm
    }

    fn memory_overhead_mb(&self) -> u64 {
        QEMU_OVERHEAD_MB
    }

    fn default_disk_mb(&self, image: &str) -> Option<u64> {
        self.image_disk_mb(image).ok()
    }

    /// A full VM boots its own disk image: only toolkit layers.
    fn plan(&self, rootfs: &dyn RootfsProvider, spec: &SandboxSpec) -> Result<RootfsPlan, EdgeError> {
        FullVmBackend::plan(self, rootfs, spec)
    }

    fn network_ready(&self) -> Result<(), NoNetwork> {
        FullVmBackend::network_ready(self)
    }

    fn screen(&self) -> Option<&dyn crate::backends::Screen> {
        Some(self)
    }

    fn disk_snapshots(&self) -> Option<&dyn crate::backends::DiskSnapshots> {
        Some(self)
    }

    fn start<'a>(
        &'a self,
        id: &'a str,
        spec: &'a SandboxSpec,
        plan: &'a RootfsPlan,
        durable: Durable,
    ) -> BoxFuture<'a, Result<Instance, EdgeError>> {
        Box::pin(self.start_vm(id, spec, plan, durable))
    }

    fn abort_start(&self, id: &str) -> bool {
        cleanup::abort_boot(&self.cgroups, id)
    }

    fn adopt<'a>(&'a self, id: &'a str, pid: i32) -> BoxFuture<'a, Result<Instance, EdgeError>> {
        Box::pin(async move { agent::reattach(&self.cgroups, self.egress.as_ref(), id, pid, &self.files(id).agent_socket()).await })
    }

    fn cleanup(&self, id: &str) -> Result<(), EdgeError> {
        cleanup::cleanup_vm(&self.cgroups, self.egress.as_ref(), id, &self.files(id), &[self.image_path(id)])
    }

    fn can_suspend(&self) -> bool {
        true
    }

    fn suspend<'a>(
        &'a self,
        id: &'a str,
        pidfd: &'a std::os::fd::OwnedFd,
    ) -> BoxFuture<'a, Result<crate::backends::SuspendOutcome, EdgeError>> {
        Box::pin(suspend::suspend_qemu(&self.cgroups, id, self.files(id).qmp_socket(), self.image_path(id), None, true, pidfd))
    }

    fn restore<'a>(&'a self, id: &'a str, spec: &'a SandboxSpec, plan: &'a RootfsPlan) -> BoxFuture<'a, Result<Instance, EdgeError>> {
        Box::pin(self.restore_vm(id, spec, plan))
    }

    fn has_suspend_image(&self, id: &str) -> bool {
        self.image_path(id).is_file()
    }

    fn before_freeze<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), EdgeError>> {
        Box::pin(async move { qmp::execute(&self.files(id).qmp_socket(), "stop").await.map(drop).map_err(EdgeError::from) })
    }

    fn after_thaw<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), EdgeError>> {
        Box::pin(async move { qmp::execute(&self.files(id).qmp_socket(), "cont").await.map(drop).map_err(EdgeError::from) })
    }

    /// What the VM's overlay holds on the host.
    fn disk_used_bytes(&self, id: &str, _pid: i32) -> Option<u64> {
        disk_cap::held(&self.files(id).disk)
    }

    fn condition(&self, id: &str) -> Option<String> {
        disk_cap::limit_reached(&self.files(id).disk).map(|(held, limit)| disk_cap::reason(held, limit))
    }

    fn reap_files(&self, live: &HashSet<String>) -> usize {
        let prefix = format!("{}.", self.node);
        let ours = |id: &str| id.starts_with(&prefix) && !live.contains(id);
        cleanup::reap_dir(&self.overlay_dir, ".qcow2", ours)
            + cleanup::reap_dir(&self.suspend_dir, ".vmstate", ours)
            + pmem::reap(&self.pmem_dir)
    }
}
