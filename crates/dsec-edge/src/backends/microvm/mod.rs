//! The microVM backend: QEMU's `microvm` machine (virtio-mmio, no PCI, no
//! firmware) booting Debian's cloud kernel with the project's initramfs,
//! whose `/init` is the same guest agent containers run.
//!
//! Host side, per VM: a cgroup (QEMU joins it before it execs, so no
//! thread of it ever runs outside), a run directory with the agent's
//! virtio-serial socket, the QMP socket and the console log, and a sparse
//! ext4 disk for the writable layer. The image's EROFS layers are
//! read-only virtio-blk disks of the layer files themselves (shared page
//! cache on the host). The agent's port is a QEMU socket chardev in server
//! mode: the edge connects as its client, and a restarted edge simply
//! connects again (the guest agent greets whoever connects next).
//!
//! Stop is a SIGKILL to QEMU (the writable disk is deleted with the
//! sandbox, so nothing in the guest needs flushing); pause is QMP `stop`
//! and then the same cgroup freeze and push-out as a container.

mod accel;
pub mod cmdline;
pub mod disk;
pub mod net;
pub mod standby;
pub mod template;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dsec_agent_proto::VmSetup;
use dsec_image::vm::VmKernel;

use crate::backends::instance::Instance;
use crate::backends::qemu::agent::{attach_ready, boot_to_ready, reattach, BootWait};
use crate::backends::qemu::cleanup::{abort_boot, cleanup_vm, reap_dir};
use crate::backends::qemu::cmdline::{Accel, AccelChoice, VmFiles};
use crate::backends::qemu::net::{network_of, prepare_network};
use crate::backends::qemu::process::{console_tail, require_program, spawn_qemu};
use crate::backends::qemu::suspend::{restore_qemu, suspend_qemu};
use crate::backends::qemu::undo::Undo;
use crate::backends::qemu::{disk::snapshot_disk, qmp, suspend};
use crate::backends::snapshot;
use crate::backends::{Backend, BoxFuture, Durable, NoNetwork, Unavailable};
use crate::cgroup::Cgroups;
use crate::error::EdgeError;
use crate::images::RootfsPlan;
use crate::model::{BackendKind, SandboxSpec};
use cmdline::VmLaunch;

/// Host memory a VM's QEMU needs beyond its guest's RAM (its own heap,
/// the bounded TCG translation cache, device buffers); the cgroup limit is
/// guest RAM plus this.
pub const QEMU_OVERHEAD_MB: u64 = 160;

/// The node's microVM settings.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// Where setup put the guest kernel (`<images>/vm`).
    pub vm_dir: PathBuf,
    /// The QEMU binary.
    pub qemu: PathBuf,
    pub accel: AccelChoice,
    /// Root of the VMs' run directories (sockets need short paths).
    pub run_root: PathBuf,
    /// Guests report freed pages to the host (virtio-balloon).
    pub free_page_reporting: bool,
    /// Guest RAM is a shared mapping of a file under the edge's state
    /// directory, so a suspend saves device state only (the fast path);
    /// otherwise anonymous memory, and a suspend writes all of it.
    pub ram_file: bool,
    /// TCG translation cache per VM, MiB.
    pub tb_size_mb: u32,
    /// New microVMs restore a memory image of a freshly booted guest of
    /// their shape (template.rs) instead of booting; `false`: every one
    /// boots.
    pub templates: bool,
}

impl VmConfig {
    pub fn new(vm_dir: PathBuf) -> Self {
        Self {
            vm_dir,
            qemu: "qemu-system-x86_64".into(),
            accel: AccelChoice::Auto,
            run_root: "/run/dsec/vm".into(),
            free_page_reporting: true,
            ram_file: true,
            tb_size_mb: crate::backends::qemu::cmdline::DEFAULT_TB_SIZE_MB,
            templates: true,
        }
    }
}

pub struct MicroVmBackend {
    cgroups: Arc<Cgroups>,
    node: String,
    qemu: PathBuf,
    kernel: VmKernel,
    initramfs: PathBuf,
    choice: AccelChoice,
    accel: tokio::sync::OnceCell<Accel>,
    run_root: PathBuf,
    disk_dir: PathBuf,
    template_dir: PathBuf,
    boot_timeout: Duration,
    tsc_khz: Option<u64>,
    free_page_reporting: bool,
    /// Where guest RAM files live.
    ram_dir: PathBuf,
    /// Guest RAM is file-backed (else anonymous).
    ram_file: bool,
    tb_size_mb: u32,
    /// Where suspend images live.
    suspend_dir: PathBuf,
    /// The node's disk snapshots.
    pub snapshots: snapshot::SnapshotDir,
    /// Per-sandbox egress, for microVMs created with network rules.
    egress: Option<dsec_net::Egress>,
    /// The guest kernel has the NIC's modules.
    guest_nic: bool,
    /// Memory images new microVMs start from (`None`: boot every one).
    templates: Option<template::ImageCache>,
    /// Memory snapshots' images, loaded for their forks.
    snapshot_images: template::ImageCache,
    /// QEMUs started ahead for resumes (standby.rs).
    standbys: Arc<standby::Standbys>,
}

impl MicroVmBackend {
    /// Finds QEMU and the kernel and builds the initramfs for `agent`.
    /// An error names what is missing (the node then refuses microVMs with
    /// that reason).
    pub fn new(
        cgroups: Arc<Cgroups>,
        cfg: &VmConfig,
        node: &str,
        agent: &Path,
        state_dir: &Path,
        boot_timeout: Duration,
    ) -> Result<Self, Unavailable> {
        let qemu = require_program(&cfg.qemu, "qemu-system-x86")?;
        let kernel =
            dsec_image::vm::find_kernel(&cfg.vm_dir).map_err(|source| Unavailable::Image { what: "the microVM kernel", source })?;
        let vm_state = state_dir.join("vm");
        let initramfs = dsec_image::vm::build_initramfs(&kernel, agent, &vm_state)
            .map_err(|source| Unavailable::Image { what: "building the initramfs", source })?;
        let guest_nic = !kernel.net_modules.is_empty();
        let disk_dir = vm_state.join("disks");
        let (ram_dir, suspend_dir) = (vm_state.join("ram"), vm_state.join("suspend"));
        for d in [&disk_dir, &ram_dir, &suspend_dir] {
            std::fs::create_dir_all(d).map_err(Unavailable::state_dir(d))?;
        }
        std::fs::create_dir_all(&cfg.run_root).map_err(Unavailable::state_dir(&cfg.run_root))?;
        let standbys = Arc::new(standby::Standbys::new(cgroups.clone(), qemu.clone(), cfg.run_root.clone(), node));
        Ok(Self {
            standbys,
            cgroups,
            node: node.to_string(),
            qemu,
            kernel,
            initramfs,
            choice: cfg.accel,
            accel: tokio::sync::OnceCell::new(),
            run_root: cfg.run_root.clone(),
            disk_dir,
            template_dir: vm_state.join("templates"),
            boot_timeout,
            tsc_khz: cmdline::host_tsc_khz(),
            free_page_reporting: cfg.free_page_reporting,
            ram_dir,
            ram_file: cfg.ram_file,
            tb_size_mb: cfg.tb_size_mb,
            suspend_dir,
            snapshots: snapshot::SnapshotDir::open(vm_state.join("snapshots"))?,
            egress: None,
            guest_nic,
            templates: cfg.templates.then(template::ImageCache::default),
            snapshot_images: template::ImageCache::default(),
        })
    }

    /// Gives microVMs created with network rules the node's egress.
    pub fn with_egress(mut self, egress: dsec_net::Egress) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Whether this node can give a microVM a network under its rules;
    /// if not, why.
    pub(crate) fn network_ready(&self) -> Result<(), NoNetwork> {
        if self.egress.is_none() {
            return Err(NoNetwork::EgressOff);
        }
        if !self.guest_nic {
            return Err(NoNetwork::NoNicDriver(self.kernel.dir.clone()));
        }
        Ok(())
    }

    /// The guest RAM file of `id` (when guest RAM is file-backed).
    fn ram_path(&self, id: &str) -> Option<PathBuf> {
        self.ram_file.then(|| self.ram_dir.join(format!("{id}.ram")))
    }

    /// The suspend image of `id` (device state, and RAM without a RAM file).
    fn image_path(&self, id: &str) -> PathBuf {
        self.suspend_dir.join(format!("{id}.vmstate"))
    }

    /// The command line's inputs for `id`.
    fn launch<'a>(
        &'a self,
        accel: Accel,
        spec: &SandboxSpec,
        plan: &'a RootfsPlan,
        files: &'a VmFiles,
        ram: Option<&'a Path>,
    ) -> VmLaunch<'a> {
        VmLaunch {
            accel,
            kernel: &self.kernel.vmlinuz,
            initramfs: &self.initramfs,
            memory_mb: spec.limits.memory_mb,
            vcpus: crate::backends::qemu::cmdline::vcpus_for(spec.limits.cpu_cores),
            layers: &plan.layer_files,
            files,
            tsc_khz: self.tsc_khz,
            extra_append: "",
            free_page_reporting: self.free_page_reporting,
            ram_file: ram,
            ram_private: false,
            incoming_fd: None,
            tb_size_mb: self.tb_size_mb,
        }
    }

    pub(crate) fn files(&self, id: &str) -> VmFiles {
        VmFiles { run_dir: self.run_root.join(id), disk: self.disk_dir.join(format!("{id}.qcow2")) }
    }

    /// The accelerator: forced, or probed once by booting the guest kernel
    /// under KVM (an open /dev/kvm is not enough: a KVM that cannot run
    /// this kernel, like PVM, fails only once the guest runs).
    pub async fn accel(&self) -> Accel {
        *self
            .accel
            .get_or_init(|| async {
                let a = match self.choice {
                    AccelChoice::Kvm => Accel::Kvm,
                    AccelChoice::Tcg => Accel::Tcg,
                    AccelChoice::Auto => accel::probe_kvm(&self.qemu, &self.kernel.vmlinuz, &self.initramfs, &self.run_root).await,
                };
                tracing::info!(accel = a.as_str(), "microVM acceleration");
                a
            })
            .await
    }

    /// How long a microVM may take to boot to its agent.
    pub(super) fn boot_wait(&self, accel: Accel) -> BootWait {
        BootWait { timeout: self.boot_timeout, accel, what: "microVM", hint: "" }
    }

    async fn start_vm(&self, id: &str, spec: &SandboxSpec, plan: &RootfsPlan, durable: Durable) -> Result<Instance, EdgeError> {
        let limits = crate::backends::cgroup_limits(spec, QEMU_OVERHEAD_MB);
        let mut undo = Undo::begin(&self.cgroups, id, &limits, durable).await?;
        // From here on it has files (and maybe a network) too.
        undo.then(|| {
            let _ = self.cleanup(id);
        });
        let files = self.files(id);
        let (tdir, disk_mb, f2) = (self.template_dir.clone(), spec.limits.disk_mb.max(16), files.clone());
        // A fork's disk chains onto its snapshot, a fresh one onto the
        // empty template of its size.
        let (snaps, from_snapshot) = (self.snapshots.clone(), spec.snapshot.clone());
        tokio::task::spawn_blocking(move || -> Result<(), EdgeError> {
            std::fs::create_dir_all(&f2.run_dir).map_err(EdgeError::io("creating", &f2.run_dir))?;
            match from_snapshot {
                Some(snap) => snaps.chain_onto(&snap, &f2.disk),
                None => snapshot::create_overlay(&disk::template(&tdir, disk_mb)?, &f2.disk),
            }
        })
        .await
        .map_err(EdgeError::task("disk preparation"))??;
        let accel = self.accel().await;
        let ram = self.ram_path(id);
        let egress = self.egress.as_ref().filter(|_| !spec.network_rules.is_empty());
        let net = egress.map(|eg| prepare_network(eg, id, spec)).transpose()?;
        let mut launch = self.launch(accel, spec, plan, &files, ram.as_deref());
        let args = net::with_nic(&mut launch, net.is_some());
        let setup = VmSetup {
            sandbox_id: id.to_string(),
            hostname: crate::ids::short_id(id).to_string(),
            layer_disks: (0..plan.layer_files.len()).map(crate::backends::qemu::cmdline::layer_serial).collect(),
            writable_disk: cmdline::WRITABLE_SERIAL.to_string(),
            now_ms: crate::model::now_ms(),
            masked_paths: crate::backends::container::policy::MASKED_PATHS.iter().map(|s| s.to_string()).collect(),
            readonly_paths: crate::backends::container::policy::READONLY_PATHS.iter().map(|s| s.to_string()).collect(),
            env: crate::backends::container::merged_env(&plan.env, spec),
            workdir: spec.workdir.clone().unwrap_or_else(|| plan.workdir.clone()),
            default_user: spec.init_user.clone(),
            // Its addressing is on the kernel command line (`dsec.net=`).
            nic: None,
        };
        // A networked VM boots cold: its NIC and addresses are not in any
        // memory image (a fork of one with rules boots from the disk
        // snapshot alone).
        let memory_snapshot = spec.snapshot.as_ref().and_then(|s| self.snapshots.get(s)).filter(|m| m.memory.is_some() && net.is_none());
        if let Some(snap) = memory_snapshot {
            let instance = self.start_from_memory_snapshot(id, &launch, &snap).await?;
            undo.disarm();
            return Ok(instance);
        }
        // A fork's disk holds what its snapshot wrote: only fresh disks
        // match a template's.
        let mut booted = None;
        if self.templates.is_some() && spec.snapshot.is_none() && net.is_none() {
            match self.start_from_template(id, &launch, disk_mb, &setup).await {
                Ok(instance) => {
                    undo.disarm();
                    return Ok(instance);
                }
                Err(template::Miss::Running(pid, pidfd)) => booted = Some((pid, pidfd)),
                Err(template::Miss::ColdBoot(why)) => {
                    tracing::warn!(%id, %why, "no template: booting cold");
                    // A failed restore's sockets: the cold QEMU makes its own.
                    for stale in [files.agent_socket(), files.qmp_socket()] {
                        let _ = std::fs::remove_file(stale);
                    }
                }
                Err(template::Miss::Failed(e)) => return Err(e),
            }
        }
        let spawned = booted.map(Ok).unwrap_or_else(|| spawn_qemu(&self.cgroups, &self.qemu, id, args, &files.run_dir, None, net.as_ref()));
        if let (Some(eg), Some(n)) = (egress, net) {
            // The edge holds the namespace for the sandbox's life: a
            // suspended VM has no QEMU to hold it.
            eg.keep_netns(id, n.netns);
        }
        let (pid, pidfd) = spawned?;
        let pidfd = undo.spawned(pid, pidfd);
        let resolv_conf = egress.map(|e| e.resolv_conf());
        let agent = boot_to_ready(&files, pidfd, setup, resolv_conf, &self.boot_wait(accel)).await?;
        undo.ready(agent)
    }

    async fn suspend_vm(&self, id: &str, pidfd: &std::os::fd::OwnedFd) -> Result<crate::backends::SuspendOutcome, EdgeError> {
        // A VM restored from a template has no RAM file of its own (its
        // RAM is a private mapping of the template): its RAM goes into
        // the stream.
        let ram = self.ram_path(id).filter(|p| p.exists());
        let ignore_shared = ram.is_some();
        suspend_qemu(&self.cgroups, id, self.files(id).qmp_socket(), self.image_path(id), ram, ignore_shared, pidfd).await
    }

    async fn restore_vm(&self, id: &str, spec: &SandboxSpec, plan: &RootfsPlan) -> Result<Instance, EdgeError> {
        let files = self.files(id);
        let accel = self.accel().await;
        let ram = self.ram_path(id);
        // Without its own RAM file (a template's VM), the image holds the
        // RAM: QEMU makes the file and loads the pages into it, and the
        // VM has a RAM file of its own from then on.
        let own_ram = ram.as_ref().is_some_and(|p| p.exists());
        if let Some(ram) = ram.as_ref().filter(|_| own_ram) {
            // The suspend dropped the RAM file from the page cache: start
            // reading it back now, while QEMU starts, rather than one guest
            // page fault at a time once it runs.
            if let Ok(f) = std::fs::File::open(ram) {
                let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::WillNeed);
            }
        }
        let mut launch = self.launch(accel, spec, plan, &files, ram.as_deref());
        launch.incoming_fd = Some(suspend::INCOMING_FD);
        // The same devices as at boot, in the same namespace and cgroup2
        // directory.
        let net = network_of(self.egress.as_ref(), id)?;
        // The fast path (a RAM file of its own, no network) continues in
        // a standby QEMU when one of its shape waits (standby.rs).
        let standby_ok = own_ram && net.is_none();
        if let (true, Some(ram_file)) = (standby_ok, ram.as_ref()) {
            let limits = crate::backends::cgroup_limits(spec, QEMU_OVERHEAD_MB);
            let taken = self.standbys.take(&standby::Standbys::shape(&launch));
            self.standbys.refill(&launch, limits, standby::REFILL_DELAY);
            if let Some(sb) = taken {
                let to = standby::Takeover {
                    id: id.to_string(),
                    run_dir: files.run_dir.clone(),
                    memory_mb: launch.memory_mb,
                    blockdevs: cmdline::standby_blockdevs(&launch),
                    ram: ram_file.clone(),
                    image: self.image_path(id),
                };
                match self.resume_on_standby(sb, &to).await {
                    Ok(instance) => return Ok(instance),
                    Err(e) => tracing::warn!(%id, error = %e, "resuming in a standby QEMU failed; starting a QEMU of its own"),
                }
            }
        }
        let args = net::with_nic(&mut launch, net.is_some());
        let restored = restore_qemu(&self.cgroups, &self.qemu, id, args, &files, &self.image_path(id), own_ram, net.as_ref()).await;
        if let (Err(_), Some(ram), false) = (&restored, &ram, own_ram) {
            // Half loaded: the image still holds the RAM.
            let _ = std::fs::remove_file(ram);
        }
        restored
    }
}

impl MicroVmBackend {
    /// Resumes sandbox `to.id` in standby QEMU `sb`: the takeover, then
    /// the agent's greeting. Leaves no QEMU on error; before the guest ran
    /// (the takeover failed) its RAM file and image are untouched.
    async fn resume_on_standby(&self, sb: standby::Standby, to: &standby::Takeover) -> Result<Instance, EdgeError> {
        let (standbys, to2) = (self.standbys.clone(), to.clone());
        let (pid, pidfd, times) =
            tokio::task::spawn_blocking(move || standbys.take_over(sb, &to2)).await.map_err(EdgeError::task("standby takeover"))??;
        let mut undo = Undo::qemu_only();
        let pidfd = undo.spawned(pid, pidfd);
        let t1 = Instant::now();
        let files = self.files(&to.id);
        let agent = attach_ready(&to.id, pidfd, &files.agent_socket())
            .await
            .map_err(|e| EdgeError::SetupFailed(format!("restoring {} in a standby QEMU: {e}{}", to.id, console_tail(&files))))?;
        tracing::info!(id = %to.id, standby = true, attach_ms = times.attach_ms, devices_ms = times.devices_ms, machine_ms = times.machine_ms, load_ms = times.load_ms, agent_ms = ms_since(t1), "restored a VM");
        let _ = std::fs::remove_file(&to.image);
        undo.ready(agent)
    }
}

fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1000.0
}

impl crate::backends::DiskSnapshots for MicroVmBackend {
    fn snapshot_disk<'a>(
        &'a self,
        id: &'a str,
        running: bool,
        meta: snapshot::SnapshotMeta,
    ) -> BoxFuture<'a, Result<(snapshot::SnapshotMeta, f64), EdgeError>> {
        Box::pin(snapshot_disk(&self.snapshots, self.files(id), running, meta))
    }

    fn disk_dir(&self) -> &Path {
        &self.disk_dir
    }

    fn memory(&self) -> Option<&dyn crate::backends::MemorySnapshots> {
        Some(self)
    }
}

impl crate::backends::MemorySnapshots for MicroVmBackend {
    /// One restored from a memory image maps that image privately instead.
    fn has_own_ram_file(&self, id: &str) -> bool {
        self.ram_path(id).is_some_and(|p| p.is_file())
    }

    fn memory_files(&self, id: &str) -> (PathBuf, PathBuf) {
        (self.ram_dir.join(format!("{id}.ram")), self.image_path(id))
    }

    fn forget_snapshot(&self, snapshot_id: &str) {
        self.forget_snapshot_image(snapshot_id);
    }
}

impl Backend for MicroVmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Microvm
    }

    fn memory_overhead_mb(&self) -> u64 {
        QEMU_OVERHEAD_MB
    }

    fn network_ready(&self) -> Result<(), NoNetwork> {
        MicroVmBackend::network_ready(self)
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
        abort_boot(&self.cgroups, id)
    }

    fn adopt<'a>(&'a self, id: &'a str, pid: i32) -> BoxFuture<'a, Result<Instance, EdgeError>> {
        Box::pin(async move { reattach(&self.cgroups, self.egress.as_ref(), id, pid, &self.files(id).agent_socket()).await })
    }

    fn cleanup(&self, id: &str) -> Result<(), EdgeError> {
        // The RAM file whatever the node's setting now (it may have
        // changed across a restart), and any suspend image.
        let extra = [self.ram_dir.join(format!("{id}.ram")), self.image_path(id)];
        cleanup_vm(&self.cgroups, self.egress.as_ref(), id, &self.files(id), &extra)
    }

    fn can_suspend(&self) -> bool {
        true
    }

    fn suspend<'a>(
        &'a self,
        id: &'a str,
        pidfd: &'a std::os::fd::OwnedFd,
    ) -> BoxFuture<'a, Result<crate::backends::SuspendOutcome, EdgeError>> {
        Box::pin(self.suspend_vm(id, pidfd))
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

    fn reserved(&self) -> HashSet<String> {
        self.standbys.names()
    }

    fn release(&self) {
        self.standbys.end_all();
    }

    fn reap_files(&self, live: &HashSet<String>) -> usize {
        let prefix = format!("{}.", self.node);
        let mut gone = 0;
        let standbys = self.standbys.names();
        let mut ours = |name: &str| name.starts_with(&prefix) && !live.contains(name) && !standbys.contains(name);
        if let Ok(dir) = std::fs::read_dir(&self.run_root) {
            for e in dir.flatten() {
                if ours(&e.file_name().to_string_lossy()) && std::fs::remove_dir_all(e.path()).is_ok() {
                    gone += 1;
                }
            }
        }
        for (dir, suffix) in
            [(&self.disk_dir, ".qcow2"), (&self.disk_dir, ".ext4"), (&self.ram_dir, ".ram"), (&self.suspend_dir, ".vmstate")]
        {
            gone += reap_dir(dir, suffix, &mut ours);
        }
        gone
    }
}
