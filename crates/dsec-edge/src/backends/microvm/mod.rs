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
pub mod qmp;
pub mod standby;
pub(crate) mod suspend;
pub mod template;

use std::collections::HashSet;
use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dsec_agent_proto::client::AgentClient;
use dsec_agent_proto::{AgentState, Op, Reply, VmSetup};
use dsec_image::vm::VmKernel;

use crate::backends::container::spawn::{pidfd_kill, pidfd_open, reap};
use crate::backends::instance::Instance;
use crate::backends::snapshot;
use crate::backends::{Backend, BoxFuture, Durable};
use crate::cgroup::Cgroups;
use crate::error::EdgeError;
use crate::images::RootfsPlan;
use crate::model::{BackendKind, SandboxSpec};
use cmdline::{Accel, AccelChoice, VmFiles, VmLaunch};

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
            tb_size_mb: cmdline::DEFAULT_TB_SIZE_MB,
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
    ) -> Result<Self, String> {
        let qemu = find_program(&cfg.qemu).ok_or_else(|| format!("{} not found (Debian package qemu-system-x86)", cfg.qemu.display()))?;
        let kernel = dsec_image::vm::find_kernel(&cfg.vm_dir).map_err(|e| e.to_string())?;
        let vm_state = state_dir.join("vm");
        let initramfs = dsec_image::vm::build_initramfs(&kernel, agent, &vm_state).map_err(|e| format!("building the initramfs: {e}"))?;
        let guest_nic = !kernel.net_modules.is_empty();
        let disk_dir = vm_state.join("disks");
        let (ram_dir, suspend_dir) = (vm_state.join("ram"), vm_state.join("suspend"));
        for d in [&disk_dir, &ram_dir, &suspend_dir] {
            std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        }
        std::fs::create_dir_all(&cfg.run_root).map_err(|e| format!("creating {}: {e}", cfg.run_root.display()))?;
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
    pub(crate) fn network_ready(&self) -> Result<(), String> {
        if self.egress.is_none() {
            return Err("outbound network is not enabled on this node".into());
        }
        if !self.guest_nic {
            return Err(format!(
                "the microVM kernel in {} has no NIC driver (virtio_net): run `dsec image setup` again to fetch it",
                self.kernel.dir.display()
            ));
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
            vcpus: cmdline::vcpus_for(spec.limits.cpu_cores),
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

    async fn start_vm(&self, id: &str, spec: &SandboxSpec, plan: &RootfsPlan, durable: Durable) -> Result<Instance, EdgeError> {
        self.cgroups.create(id, &crate::backends::cgroup_limits(spec, QEMU_OVERHEAD_MB)).map_err(|e| EdgeError::Internal(e.to_string()))?;
        if let Err(e) = durable.await {
            let _ = self.cgroups.remove(id);
            return Err(EdgeError::Internal(format!("edge database: {e}")));
        }
        let files = self.files(id);
        let (tdir, disk_mb, f2) = (self.template_dir.clone(), spec.limits.disk_mb.max(16), files.clone());
        // A fork's disk chains onto its snapshot, a fresh one onto the
        // empty template of its size.
        let (snaps, from_snapshot) = (self.snapshots.clone(), spec.snapshot.clone());
        let prepared = tokio::task::spawn_blocking(move || -> Result<(), EdgeError> {
            std::fs::create_dir_all(&f2.run_dir).map_err(|e| EdgeError::Internal(format!("creating {}: {e}", f2.run_dir.display())))?;
            match from_snapshot {
                Some(snap) => snaps.chain_onto(&snap, &f2.disk),
                None => snapshot::create_overlay(&disk::template(&tdir, disk_mb)?, &f2.disk),
            }
        })
        .await
        .map_err(|e| EdgeError::Internal(e.to_string()))
        .and_then(|r| r);
        if let Err(e) = prepared {
            let _ = self.cleanup(id);
            return Err(e);
        }
        let accel = self.accel().await;
        let ram = self.ram_path(id);
        let net = match self.egress.as_ref().filter(|_| !spec.network_rules.is_empty()) {
            None => None,
            Some(eg) => match prepare_network(eg, id, spec) {
                Ok(n) => Some(n),
                Err(e) => {
                    let _ = self.cleanup(id);
                    return Err(e);
                }
            },
        };
        let mut launch = self.launch(accel, spec, plan, &files, ram.as_deref());
        let args = net::with_nic(&mut launch, net.is_some());
        let setup = VmSetup {
            sandbox_id: id.to_string(),
            hostname: crate::ids::short_id(id).to_string(),
            layer_disks: (0..plan.layer_files.len()).map(cmdline::layer_serial).collect(),
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
            return match self.start_from_memory_snapshot(id, &launch, &snap).await {
                Ok(instance) => Ok(instance),
                Err(e) => {
                    let _ = self.cleanup(id);
                    Err(e)
                }
            };
        }
        // A fork's disk holds what its snapshot wrote: only fresh disks
        // match a template's.
        let mut booted = None;
        if self.templates.is_some() && spec.snapshot.is_none() && net.is_none() {
            match self.start_from_template(id, &launch, disk_mb, &setup).await {
                Ok(instance) => return Ok(instance),
                Err(template::Miss::Running(pid, pidfd)) => booted = Some((pid, pidfd)),
                Err(template::Miss::ColdBoot(why)) => {
                    tracing::warn!(%id, %why, "no template: booting cold");
                    // A failed restore's sockets: the cold QEMU makes its own.
                    for stale in [files.agent_socket(), files.qmp_socket()] {
                        let _ = std::fs::remove_file(stale);
                    }
                }
                Err(template::Miss::Failed(e)) => {
                    let _ = self.cleanup(id);
                    return Err(e);
                }
            }
        }
        let spawned = booted.map(Ok).unwrap_or_else(|| spawn_qemu(&self.cgroups, &self.qemu, id, args, &files.run_dir, None, net.as_ref()));
        if let (Some(eg), Some(n)) = (&self.egress, net) {
            // The edge holds the namespace for the sandbox's life: a
            // suspended VM has no QEMU to hold it.
            eg.keep_netns(id, n.netns);
        }
        let (pid, pidfd) = match spawned {
            Ok(p) => p,
            Err(e) => {
                let _ = self.cleanup(id);
                return Err(e);
            }
        };
        let resolv_conf = self.egress.as_ref().filter(|_| !spec.network_rules.is_empty()).map(|e| e.resolv_conf());
        let booted = async {
            let agent = boot_agent(&files.agent_socket(), &pidfd, setup).await?;
            if let Some(conf) = resolv_conf {
                net::write_resolv_conf(&agent, conf).await?;
            }
            Ok::<_, EdgeError>(agent)
        };
        let outcome = tokio::time::timeout(self.boot_timeout, booted).await;
        let failure = match outcome {
            Ok(Ok(agent)) => return Ok(Instance::new(pid, pidfd, agent)),
            Ok(Err(EdgeError::Agent(a))) if a.kind == dsec_agent_proto::ErrorKind::UnknownUser => EdgeError::Agent(a),
            Ok(Err(e)) => EdgeError::SetupFailed(format!("{e}{}", console_tail(&files))),
            Err(_) => EdgeError::Timeout(format!(
                "the microVM did not boot to its agent within {:?} ({} acceleration){}",
                self.boot_timeout,
                accel.as_str(),
                console_tail(&files)
            )),
        };
        let _ = pidfd_kill(&pidfd, libc::SIGKILL);
        reap(&pidfd);
        let _ = self.cleanup(id);
        Err(failure)
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
        let (pid, pidfd, times) = tokio::task::spawn_blocking(move || standbys.take_over(sb, &to2))
            .await
            .map_err(|e| EdgeError::Internal(format!("standby takeover task failed: {e}")))??;
        let t1 = Instant::now();
        let files = self.files(&to.id);
        match attach_ready(&to.id, &pidfd, &files.agent_socket()).await {
            Ok(agent) => {
                tracing::info!(id = %to.id, standby = true, attach_ms = times.attach_ms, devices_ms = times.devices_ms, machine_ms = times.machine_ms, load_ms = times.load_ms, agent_ms = ms_since(t1), "restored a VM");
                let _ = std::fs::remove_file(&to.image);
                Ok(Instance::new(pid, pidfd, agent))
            }
            Err(e) => {
                let _ = pidfd_kill(&pidfd, libc::SIGKILL);
                reap(&pidfd);
                Err(EdgeError::SetupFailed(format!("restoring {} in a standby QEMU: {e}{}", to.id, console_tail(&files))))
            }
        }
    }
}

/// Copies the writable disk `files.disk` of a VM into a new snapshot in
/// `snaps` (shared by both VM backends). `running`: its vCPUs are stopped
/// for the copy (the caller synced the guest; QEMU's `stop` flushes its
/// own caches to the image); otherwise it is suspended and its disk
/// quiet. Returns the snapshot and how long the vCPUs were stopped.
pub(crate) async fn snapshot_disk(
    snaps: &snapshot::SnapshotDir,
    files: VmFiles,
    running: bool,
    mut meta: snapshot::SnapshotMeta,
) -> Result<(snapshot::SnapshotMeta, f64), EdgeError> {
    meta.parent = snapshot::backing_file(&files.disk).and_then(|b| snaps.id_of_layer(&b));
    let qmp = files.qmp_socket();
    if running {
        qmp::execute(&qmp, "stop").await?;
    }
    let t0 = Instant::now();
    let snaps = snaps.clone();
    let copied = tokio::task::spawn_blocking(move || snaps.write(&files.disk, meta))
        .await
        .map_err(|e| EdgeError::Internal(format!("snapshot task failed: {e}")))
        .and_then(|r| r);
    let frozen_ms = t0.elapsed().as_secs_f64() * 1000.0;
    if running {
        qmp::execute(&qmp, "cont").await?;
    }
    copied.map(|m| (m, frozen_ms))
}

/// Suspends VM `id` (QEMU `pidfd`, QMP at `qmp`) to `image` and ends its
/// QEMU (shared by both VM backends; `suspend::save` says what
/// `ram` and `ignore_shared` mean).
pub(crate) async fn suspend_qemu(
    cgroups: &Cgroups,
    id: &str,
    qmp: PathBuf,
    image: PathBuf,
    ram: Option<PathBuf>,
    ignore_shared: bool,
    pidfd: &std::os::fd::OwnedFd,
) -> Result<crate::backends::SuspendOutcome, EdgeError> {
    let before = cgroups.memory_usage(id).unwrap_or(0);
    let pidfd = pidfd.try_clone().map_err(|e| EdgeError::Internal(e.to_string()))?;
    let mut out = tokio::task::spawn_blocking(move || suspend::save(&qmp, &image, ram.as_deref(), ignore_shared, &pidfd))
        .await
        .map_err(|e| EdgeError::Internal(format!("suspend task failed: {e}")))??;
    out.memory_before_bytes = before;
    out.memory_after_bytes = cgroups.memory_usage(id).unwrap_or(0);
    Ok(out)
}

/// Starts VM `id` anew from its suspend `image`: QEMU with `args` (its
/// usual command line plus `-incoming defer`) loads the image, continues,
/// and its agent greets as ready (shared by both VM backends). The image
/// is deleted once the VM runs; on failure it is kept and no QEMU is left.
/// With `net`, QEMU is placed in a networked sandbox's namespace and
/// cgroup2 directory.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn restore_qemu(
    cgroups: &Cgroups,
    qemu: &Path,
    id: &str,
    args: Vec<String>,
    files: &VmFiles,
    image: &Path,
    ignore_shared: bool,
    net: Option<&net::QemuNet>,
) -> Result<Instance, EdgeError> {
    let state =
        std::fs::File::open(image).map_err(|e| EdgeError::Internal(format!("the suspend image of {id} ({}): {e}", image.display())))?;
    // Sockets of the previous QEMU: the new one makes its own.
    for stale in [files.agent_socket(), files.qmp_socket()] {
        let _ = std::fs::remove_file(stale);
    }
    let state = std::os::fd::OwnedFd::from(state);
    let t0 = Instant::now();
    let (pid, pidfd) = spawn_qemu(cgroups, qemu, id, args, &files.run_dir, Some(&state), net)?;
    drop(state);
    let spawn_ms = ms_since(t0);
    let restored = async {
        let times = load_incoming(files, &pidfd, ignore_shared).await?;
        let t1 = Instant::now();
        let agent = attach_ready(id, &pidfd, &files.agent_socket()).await?;
        tracing::info!(%id, spawn_ms, qmp_ready_ms = times.qmp_ready_ms, load_ms = times.load_ms, agent_ms = ms_since(t1), "restored a VM");
        Ok::<_, EdgeError>(agent)
    };
    match restored.await {
        Ok(agent) => {
            // The image is spent (with a RAM file, that is live memory again).
            let _ = std::fs::remove_file(image);
            Ok(Instance::new(pid, pidfd, agent))
        }
        Err(e) => {
            let _ = pidfd_kill(&pidfd, libc::SIGKILL);
            reap(&pidfd);
            Err(EdgeError::SetupFailed(format!("restoring {id}: {e}{}", console_tail(files))))
        }
    }
}

/// Has a QEMU started with `-incoming defer` (`pidfd`) load its state
/// and continue (`suspend::finish_restore`, on a blocking thread).
pub(crate) async fn load_incoming(
    files: &VmFiles,
    pidfd: &std::os::fd::OwnedFd,
    ignore_shared: bool,
) -> Result<suspend::RestoreTimes, EdgeError> {
    let (qmp, fd) = (files.qmp_socket(), pidfd.try_clone().map_err(|e| EdgeError::Internal(e.to_string()))?);
    tokio::task::spawn_blocking(move || suspend::finish_restore(&qmp, &fd, ignore_shared))
        .await
        .map_err(|e| EdgeError::Internal(format!("restore task failed: {e}")))?
}

fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1000.0
}

/// The last lines QEMU and the guest printed, for an error message.
pub(crate) fn console_tail(files: &VmFiles) -> String {
    let mut out = String::new();
    for (what, path) in [("console", files.console_log()), ("qemu", files.run_dir.join("qemu.log"))] {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        // The agent's own words first (why it gave up), else the end
        // (a kernel's last messages).
        let agent: Vec<&str> = text.lines().filter(|l| l.contains("dsec-agent")).collect();
        let lines: Vec<&str> = if agent.is_empty() { text.lines().filter(|l| !l.trim().is_empty()).collect() } else { agent };
        let tail = &lines[lines.len().saturating_sub(6)..];
        if !tail.is_empty() {
            out.push_str(&format!("; {what}: {}", tail.join(" | ")));
        }
    }
    out
}

/// Starts `qemu args` inside the cgroup of sandbox `id`, in a session of
/// its own, its output to `run_dir/qemu.log` (shared by both VM backends).
/// `incoming`, if given, becomes QEMU's fd `suspend::INCOMING_FD` (a
/// restore's saved state). With `net`, QEMU also joins the sandbox's
/// cgroup2 directory and network namespace before it execs (so no socket
/// of it is ever opened outside the sandbox's allowlist).
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn_qemu(
    cgroups: &Cgroups,
    qemu: &Path,
    id: &str,
    args: Vec<String>,
    run_dir: &Path,
    incoming: Option<&std::os::fd::OwnedFd>,
    net: Option<&net::QemuNet>,
) -> Result<(i32, std::os::fd::OwnedFd), EdgeError> {
    let fds: Vec<(&std::os::fd::OwnedFd, i32)> = incoming.map(|f| (f, suspend::INCOMING_FD)).into_iter().collect();
    spawn_qemu_fds(cgroups, qemu, id, args, run_dir, &fds, net)
}

/// `spawn_qemu` with descriptors QEMU inherits: each `(fd, n)` becomes
/// its fd `n` (at most 4 of them).
pub(crate) fn spawn_qemu_fds(
    cgroups: &Cgroups,
    qemu: &Path,
    id: &str,
    args: Vec<String>,
    run_dir: &Path,
    fds: &[(&std::os::fd::OwnedFd, i32)],
    net: Option<&net::QemuNet>,
) -> Result<(i32, std::os::fd::OwnedFd), EdgeError> {
    use std::os::fd::AsRawFd;
    if fds.len() > 4 {
        return Err(EdgeError::Internal("QEMU inherits at most 4 descriptors".into()));
    }
    // Fixed-size and copied before the fork: the child only reads it.
    let mut inherit = [(-1i32, -1i32); 4];
    for (slot, (fd, n)) in inherit.iter_mut().zip(fds) {
        *slot = (fd.as_raw_fd(), *n);
    }
    let netns = net.map(|n| n.netns.as_raw_fd());
    let procs: Vec<CString> = cgroups
        .procs_files(id)
        .iter()
        .chain(net.map(|n| &n.procs))
        .filter_map(|p| CString::new(p.as_os_str().as_encoded_bytes()).ok())
        .collect();
    let log_path = run_dir.join("qemu.log");
    let log = std::fs::File::create(&log_path).map_err(|e| EdgeError::Internal(format!("creating {}: {e}", log_path.display())))?;
    let log2 = log.try_clone().map_err(|e| EdgeError::Internal(e.to_string()))?;
    let mut cmd = std::process::Command::new(qemu);
    cmd.args(args).stdin(std::process::Stdio::null()).stdout(log).stderr(log2);
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (setsid, dup2, open, write, close, setns) on data
    // prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // First every source out of the way of the targets (one may
            // sit on another's number), then onto its target; dup2 clears
            // close-on-exec on the copy.
            let mut high = [-1i32; 4];
            for (h, &(fd, _)) in high.iter_mut().zip(&inherit) {
                if fd >= 0 {
                    *h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 16);
                    if *h < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            for (&h, &(_, n)) in high.iter().zip(&inherit) {
                if h >= 0 && libc::dup2(h, n) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for p in &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                libc::close(fd);
                if !ok {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(ns) = netns {
                if libc::setns(ns, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| EdgeError::Internal(format!("starting {}: {e}", qemu.display())))?;
    let pid = child.id() as i32;
    // Dropping the Child neither kills nor reaps: the exit watcher
    // reaps through the pidfd.
    drop(child);
    let pidfd = pidfd_open(pid).map_err(|e| EdgeError::Internal(format!("pidfd_open(QEMU {pid}): {e}")))?;
    Ok((pid, pidfd))
}

/// What is left of VM `id` once its QEMU is gone: stray processes of its
/// cgroup, its run directory, its disk and the backend's `extra` files
/// (missing ones are fine), the cgroup (shared by both VM backends).
pub(crate) fn cleanup_vm(cgroups: &Cgroups, id: &str, files: &VmFiles, extra: &[PathBuf]) -> Result<(), EdgeError> {
    cgroups.kill_all(id);
    let _ = std::fs::remove_dir_all(&files.run_dir);
    for f in std::iter::once(&files.disk).chain(extra) {
        match std::fs::remove_file(f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(EdgeError::Internal(format!("removing {}: {e}", f.display()))),
        }
    }
    cgroups.remove(id).map_err(|e| EdgeError::Internal(e.to_string()))
}

/// Connects to a fresh guest agent and has it set the sandbox up (shared
/// by both VM backends).
pub(crate) async fn boot_agent(socket: &Path, qemu: &std::os::fd::OwnedFd, setup: VmSetup) -> Result<AgentClient, EdgeError> {
    let stream = connect_agent(socket, qemu).await?;
    let (agent, hello) = AgentClient::answer(stream).await?;
    if hello.state != AgentState::Fresh {
        return Err(EdgeError::SetupFailed(format!("the guest agent greeted with {:?}", hello.state)));
    }
    match agent.call(Op::SetupVm(setup)).await? {
        Reply::Ready => Ok(agent),
        other => Err(EdgeError::SetupFailed(format!("unexpected reply to setup: {other:?}"))),
    }
}

/// `Backend::abort_start` of both VM backends: a boot takes seconds (a
/// minute for a full VM under TCG), its QEMU is in the sandbox's cgroup
/// from its exec on, and the boot fails as soon as it is gone.
pub(crate) fn abort_boot(cgroups: &Cgroups, id: &str) -> bool {
    cgroups.kill_all(id);
    true
}

/// Re-attaches to the running VM `id` whose QEMU is `pid` (after an edge
/// restart; shared by both VM backends).
pub(crate) async fn reattach(cgroups: &Cgroups, id: &str, pid: i32, socket: &Path) -> Result<Instance, EdgeError> {
    if !cgroups.contains(id, pid) {
        return Err(EdgeError::Internal(format!("pid {pid} is no longer the QEMU of {id}")));
    }
    let pidfd = pidfd_open(pid).map_err(|e| EdgeError::Internal(format!("pidfd_open({pid}): {e}")))?;
    let agent = attach_ready(id, &pidfd, socket).await?;
    Ok(Instance::new(pid, pidfd, agent))
}

/// Connects to the agent of a VM that was set up before (re-adoption,
/// restore): it greets as ready, with its sandbox id.
async fn attach_ready(id: &str, pidfd: &std::os::fd::OwnedFd, socket: &Path) -> Result<AgentClient, EdgeError> {
    let attach = async {
        let stream = connect_agent(socket, pidfd).await?;
        let (agent, hello) = AgentClient::connect(stream).await?;
        match hello.state {
            AgentState::Ready { sandbox_id } if sandbox_id == id => Ok(agent),
            other => Err(EdgeError::Internal(format!("the agent of {id} answered re-attach with {other:?}"))),
        }
    };
    tokio::time::timeout(REATTACH_WAIT, attach).await.map_err(|_| EdgeError::Timeout(format!("re-attaching to the VM {id}")))?
}

/// How long re-adoption waits for a guest agent to greet.
const REATTACH_WAIT: Duration = Duration::from_secs(10);

/// Connects to the agent's socket, which QEMU creates while it starts;
/// gives up if QEMU exits first.
pub(crate) async fn connect_agent(path: &Path, qemu: &std::os::fd::OwnedFd) -> Result<tokio::net::UnixStream, EdgeError> {
    let t0 = Instant::now();
    loop {
        match tokio::net::UnixStream::connect(path).await {
            Ok(s) => return Ok(s),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => {
                if process_exited(qemu) {
                    return Err(EdgeError::SetupFailed("QEMU exited during start".into()));
                }
                if t0.elapsed() > Duration::from_secs(10) {
                    return Err(EdgeError::Timeout(format!("QEMU made no agent socket at {}", path.display())));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => return Err(EdgeError::Internal(format!("connecting to {}: {e}", path.display()))),
        }
    }
}

/// Removes the files `<id><suffix>` in `dir` whose id is `ours` (the
/// reaper's pass over a VM backend's files); returns how many.
pub(crate) fn reap_dir(dir: &Path, suffix: &str, mut ours: impl FnMut(&str) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut gone = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.strip_suffix(suffix).is_some_and(&mut ours) && std::fs::remove_file(e.path()).is_ok() {
            gone += 1;
        }
    }
    gone
}

/// True once the process behind `pidfd` has exited.
pub fn process_exited(pidfd: &std::os::fd::OwnedFd) -> bool {
    suspend::wait_exit(pidfd, Duration::ZERO)
}

pub(crate) fn find_program(p: &Path) -> Option<PathBuf> {
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(p)).find(|c| c.is_file())
}

/// The node's egress if VM `id` has a network (taken back from its
/// persisted state after an edge restart). Shared by both VM backends.
pub(crate) fn egress_of<'a>(egress: Option<&'a dsec_net::Egress>, id: &str) -> Option<&'a dsec_net::Egress> {
    let eg = egress?;
    (eg.is_networked(id) || eg.adopt(id).unwrap_or(false)).then_some(eg)
}

/// The namespace and cgroup2 directory a restored QEMU of VM `id` joins:
/// those of its boot. None for a VM without a network.
pub(crate) fn network_of(egress: Option<&dsec_net::Egress>, id: &str) -> Result<Option<net::QemuNet>, EdgeError> {
    match egress_of(egress, id) {
        None => Ok(None),
        Some(eg) => Ok(Some(net::QemuNet { netns: eg.netns_of(id)?, procs: eg.cgroup_procs(id) })),
    }
}

/// A warm namespace and the allowlist of sandbox `id`, ready for its QEMU
/// to join (nothing is left on error).
pub(crate) fn prepare_network(eg: &dsec_net::Egress, id: &str, spec: &SandboxSpec) -> Result<net::QemuNet, EdgeError> {
    let warm = eg.take()?;
    let procs = match eg.prepare(id, warm.slot, &spec.network_rules) {
        Ok(p) => p,
        Err(e) => {
            drop(warm.netns); // `prepare` released the slot
            return Err(e.into());
        }
    };
    Ok(net::QemuNet { netns: warm.netns, procs })
}

/// After an edge restart, the namespace of a networked VM's running QEMU
/// (`pid`): QEMU holds it; the edge keeps it too, for a later suspend.
pub(crate) fn keep_netns_of(eg: &dsec_net::Egress, id: &str, pid: i32) -> Result<(), EdgeError> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|e| EdgeError::Internal(format!("the network namespace of {id}: {e}")))?;
    eg.keep_netns(id, ns.into());
    Ok(())
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

    fn network_ready(&self) -> Result<(), String> {
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
        Box::pin(async move {
            let instance = reattach(&self.cgroups, id, pid, &self.files(id).agent_socket()).await?;
            if let Some(eg) = egress_of(self.egress.as_ref(), id) {
                keep_netns_of(eg, id, pid)?;
            }
            Ok(instance)
        })
    }

    fn cleanup(&self, id: &str) -> Result<(), EdgeError> {
        // The RAM file whatever the node's setting now (it may have
        // changed across a restart), and any suspend image.
        let done = cleanup_vm(&self.cgroups, id, &self.files(id), &[self.ram_dir.join(format!("{id}.ram")), self.image_path(id)]);
        if let Some(eg) = &self.egress {
            eg.release(id);
        }
        done
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
        Box::pin(async move { qmp::execute(&self.files(id).qmp_socket(), "stop").await.map(drop) })
    }

    fn after_thaw<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), EdgeError>> {
        Box::pin(async move { qmp::execute(&self.files(id).qmp_socket(), "cont").await.map(drop) })
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
