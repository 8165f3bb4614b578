//! Node templates: microVMs start by restoring a memory image of a freshly
//! booted guest instead of booting.
//!
//! The first creation of a *shape* (accelerator, guest RAM, vCPUs, image
//! layers, disk size, kernel, initramfs: everything the guest saw while it
//! booted) boots its QEMU with guest RAM in a new memfd (`share=on`). The
//! guest agent prints [`BOOTED_MARKER`] on the console once it waits for
//! the host, before any sandbox's data reached it: no disk mounted (the
//! guest only probed the disks' sizes and partition sectors, which every
//! fresh disk of that size has alike: a new overlay of the same empty
//! ext4 template), no identity, no port traffic. The edge then stops it,
//! saves its device state (`x-ignore-shared`: the RAM stays in the memfd)
//! and ends that QEMU; the memfd is sealed against every write
//! (`F_SEAL_WRITE`, `SHRINK`, `GROW`, then `SEAL`). That pair is the
//! template. This creation and every later one of the shape restore from
//! it: a QEMU maps the sealed memfd privately (`share=off`), loads the
//! device state and continues; the guest's agent greets as freshly booted,
//! gets its `SetupVm` (disks, clock, hostname), then `Reidentify` (random
//! generator reseeded with host randomness).
//!
//! Why a sealed memfd and not the RAM file on disk: QEMU 7.2 discards a
//! page the guest's balloon reports free with `fallocate(PUNCH_HOLE)` on
//! the backing file even when its mapping is private, which would zero
//! that page for every VM sharing the file. The seal makes the kernel
//! refuse it (QEMU logs the refusal; the page stays the VM's private
//! copy). The template's pages are shared memory (shmem) of the host,
//! charged to the cgroup of the creation that made it; they live until
//! the edge exits, at most [`MAX_TEMPLATES`] shapes.
//!
//! A failure falls back to a cold boot: if saving fails, the template VM
//! just goes on as the sandbox's; if a restore fails, the sandbox boots.

use std::collections::HashMap;
use std::io::{Seek, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dsec_agent_proto::client::AgentClient;
use dsec_agent_proto::{Op, Reply, VmIdentity, VmSetup};
use rand::RngCore;

use super::cmdline::VmLaunch;
use super::MicroVmBackend;
use crate::backends::container::spawn::{pidfd_kill, reap};
use crate::backends::instance::Instance;
use crate::backends::qemu::agent::{boot_agent, connect_agent};
use crate::backends::qemu::process::{console_tail, process_exited, spawn_qemu_fds};
use crate::backends::qemu::suspend;
use crate::backends::qemu::undo::Undo;
use crate::error::EdgeError;

/// What the agent prints once booted and waiting for the host (kept equal
/// to the agent's `vm_init::BOOTED_MARKER`).
pub const BOOTED_MARKER: &str = "dsec-agent: booted, waiting for the host";
/// The descriptor number a QEMU gets its guest RAM memfd at.
pub const RAM_FD: i32 = 4;
/// Most shapes kept; later shapes boot cold.
pub const MAX_TEMPLATES: usize = 16;

/// A saved guest: RAM in a sealed memfd, device state in memory.
#[derive(Debug)]
pub struct MemImage {
    ram: OwnedFd,
    vmstate: Vec<u8>,
}

impl MemImage {
    /// A descriptor of the device state for one restore (its own offset:
    /// restores may run at once).
    fn vmstate_fd(&self) -> std::io::Result<OwnedFd> {
        let fd = rustix::fs::memfd_create("dsec-vmstate", rustix::fs::MemfdFlags::CLOEXEC)?;
        let mut f = std::fs::File::from(fd);
        f.write_all(&self.vmstate)?;
        f.rewind()?;
        Ok(f.into())
    }
}

/// The path under which QEMU opens its inherited RAM memfd.
fn ram_fd_path() -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{RAM_FD}"))
}

/// A new guest RAM file of `memory_mb` (a memfd that can be sealed).
fn new_ram(memory_mb: u64) -> std::io::Result<OwnedFd> {
    use rustix::fs::MemfdFlags;
    let fd = rustix::fs::memfd_create("dsec-template-ram", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, memory_mb << 20)?;
    Ok(fd)
}

/// Makes `ram` immutable: no write, no size change, no seal removed.
fn seal(ram: &OwnedFd) -> std::io::Result<()> {
    use rustix::fs::SealFlags;
    rustix::fs::fcntl_add_seals(ram, SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(())
}

/// The shape of a launch: what a guest saw while it booted. Two launches
/// with the same shape can share a template.
pub fn shape_key(l: &VmLaunch<'_>, disk_mb: u64) -> String {
    let layers: Vec<String> = l.layers.iter().map(|p| p.display().to_string()).collect();
    format!(
        "{}|{}M|{}cpu|{}|{}|{}|disk{}M|fpr{}|tb{}|tsc{:?}|{}",
        l.accel.as_str(),
        l.memory_mb,
        l.vcpus,
        l.kernel.display(),
        l.initramfs.display(),
        layers.join(":"),
        disk_mb,
        l.free_page_reporting,
        l.tb_size_mb,
        l.tsc_khz,
        l.extra_append
    )
}

/// Memory images in the edge's memory, by key (a shape for templates, a
/// snapshot id for forks): each is made once, by whoever needs it first,
/// while the others wait for it.
#[derive(Debug, Default)]
pub struct ImageCache {
    cells: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Arc<MemImage>>>>>,
}

impl ImageCache {
    /// The slot of `key` (`None`: no room for another image).
    fn cell(&self, key: &str) -> Option<Arc<tokio::sync::OnceCell<Arc<MemImage>>>> {
        let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cells.get(key) {
            return Some(c.clone());
        }
        if cells.len() >= MAX_TEMPLATES {
            return None;
        }
        Some(cells.entry(key.to_string()).or_default().clone())
    }

    /// Drops the image of `key` (VMs restored from it keep their mapping).
    pub fn forget(&self, key: &str) {
        self.cells.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

/// Loads a memory snapshot's RAM file (its data extents) into a sealed
/// memfd, with its device state.
fn load_image(ram: &Path, vmstate: &Path, memory_mb: u64) -> std::io::Result<MemImage> {
    use rustix::fs::{seek, SeekFrom};
    use std::os::unix::fs::FileExt;
    let fd = new_ram(memory_mb)?;
    let src = std::fs::File::open(ram)?;
    let (len, dst) = (src.metadata()?.len().min(memory_mb << 20), std::fs::File::from(fd));
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < len {
        let data = match seek(&src, SeekFrom::Data(pos)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = seek(&src, SeekFrom::Hole(data))?.min(len);
        let mut at = data;
        while at < hole {
            let want = ((hole - at) as usize).min(buf.len());
            let n = src.read_at(&mut buf[..want], at)?;
            if n == 0 {
                break;
            }
            dst.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
        pos = hole.max(data + 1);
    }
    let ram: OwnedFd = dst.into();
    seal(&ram)?;
    Ok(MemImage { ram, vmstate: std::fs::read(vmstate)? })
}

/// Why a template was not used for a creation.
pub(super) enum Miss {
    /// Boot it cold (no template, or the restore failed): nothing runs.
    ColdBoot(String),
    /// The template VM could not be saved and runs on, booted: it becomes
    /// the sandbox's VM.
    Running(i32, OwnedFd),
    /// The guest did not boot: the creation fails as a cold boot would.
    Failed(EdgeError),
}

impl MicroVmBackend {
    /// Starts sandbox `id` from its shape's template, making the template
    /// first if there is none. `launch` is its cold-boot launch; `setup`
    /// what its agent gets.
    pub(super) async fn start_from_template(
        &self,
        id: &str,
        launch: &VmLaunch<'_>,
        disk_mb: u64,
        setup: &VmSetup,
    ) -> Result<Instance, Miss> {
        let key = shape_key(launch, disk_mb);
        let Some(cell) = self.templates.as_ref().and_then(|t| t.cell(&key)) else {
            return Err(Miss::ColdBoot("the node keeps no more templates".into()));
        };
        let image = match cell.get() {
            Some(image) => image.clone(),
            None => cell.get_or_try_init(|| self.make_template(id, launch)).await?.clone(),
        };
        match self.restore_image(id, launch, &image, Some(setup)).await {
            Ok(instance) => Ok(instance),
            Err(e) => Err(Miss::ColdBoot(format!("restoring the template failed: {e}"))),
        }
    }

    /// Starts sandbox `id` from memory snapshot `snap`: it continues the
    /// snapshot's guest (no fallback: a boot would lose that state).
    pub(super) async fn start_from_memory_snapshot(
        &self,
        id: &str,
        launch: &VmLaunch<'_>,
        snap: &crate::backends::snapshot::SnapshotMeta,
    ) -> Result<Instance, EdgeError> {
        let Some(mem) = &snap.memory else { return Err(EdgeError::Invariant("a snapshot started from memory holds memory")) };
        if mem.layer_files != launch.layers
            || mem.memory_mb != launch.memory_mb
            || crate::backends::qemu::cmdline::vcpus_for(mem.cpu_cores) != launch.vcpus
        {
            return Err(EdgeError::Invalid(format!(
                "snapshot {:?} holds the memory of a microVM of {} MiB and {} vCPUs on other image layers: start its sandboxes with the same image and limits",
                snap.name,
                mem.memory_mb,
                crate::backends::qemu::cmdline::vcpus_for(mem.cpu_cores)
            )));
        }
        let (ram, vmstate, memory_mb) = (self.snapshots.ram(&snap.id), self.snapshots.vmstate(&snap.id), mem.memory_mb);
        let load = || async move {
            let ram_path = ram.clone();
            tokio::task::spawn_blocking(move || load_image(&ram, &vmstate, memory_mb))
                .await
                .map_err(EdgeError::task("snapshot memory load"))?
                .map(Arc::new)
                .map_err(EdgeError::io("loading the memory of a snapshot", &ram_path))
        };
        let image = match self.snapshot_images.cell(&snap.id) {
            Some(cell) => cell.get_or_try_init(load).await?.clone(),
            None => load().await?,
        };
        self.restore_image(id, launch, &image, None).await
    }

    /// Drops the loaded memory of snapshot `id` (deleted).
    pub fn forget_snapshot_image(&self, id: &str) {
        self.snapshot_images.forget(id);
    }

    /// Boots the template VM of `launch`'s shape (as sandbox `id`'s QEMU,
    /// in its cgroup, on its fresh disk) and saves it.
    async fn make_template(&self, id: &str, launch: &VmLaunch<'_>) -> Result<Arc<MemImage>, Miss> {
        let t0 = Instant::now();
        let ram = new_ram(launch.memory_mb).map_err(|e| Miss::ColdBoot(format!("guest RAM memfd: {e}")))?;
        let ram_path = ram_fd_path();
        let mut l = launch.clone();
        l.ram_file = Some(&ram_path);
        l.ram_private = false;
        l.incoming_fd = None;
        let files = l.files;
        let args = super::cmdline::qemu_args(&l);
        let (pid, pidfd) =
            spawn_qemu_fds(&self.cgroups, &self.qemu, id, args, &files.run_dir, &[(&ram, RAM_FD)], None).map_err(Miss::Failed)?;
        if let Err(e) = wait_booted(&files.console_log(), &pidfd, self.boot_timeout).await {
            let _ = pidfd_kill(&pidfd, libc::SIGKILL);
            reap(&pidfd);
            return Err(Miss::Failed(match e {
                EdgeError::Timeout(_) => self.boot_wait(l.accel).timed_out(files),
                e => EdgeError::SetupFailed(format!("{e}{}", console_tail(files))),
            }));
        }
        let booted_ms = t0.elapsed().as_millis();
        let (qmp, image) = (files.qmp_socket(), files.run_dir.join("template.vmstate"));
        let fd = pidfd.try_clone().map_err(|e| Miss::ColdBoot(e.to_string()))?;
        let image2 = image.clone();
        let saved = tokio::task::spawn_blocking(move || suspend::save(&qmp, &image2, None, true, &fd))
            .await
            .map_err(EdgeError::task("suspend"))
            .and_then(|r| r);
        if let Err(e) = saved {
            tracing::warn!(%id, error = %e, "saving a microVM template failed; this VM goes on booted cold");
            return Err(Miss::Running(pid, pidfd));
        }
        reap(&pidfd);
        let vmstate = std::fs::read(&image);
        let _ = std::fs::remove_file(&image);
        let vmstate = vmstate.map_err(|e| Miss::ColdBoot(format!("reading the template's device state: {e}")))?;
        seal(&ram).map_err(|e| Miss::ColdBoot(format!("sealing the template's RAM: {e}")))?;
        tracing::info!(%id, booted_ms, total_ms = t0.elapsed().as_millis(), vmstate = vmstate.len(), "made a microVM template");
        Ok(Arc::new(MemImage { ram, vmstate }))
    }

    /// Restores sandbox `id` from `image`: its own QEMU (its cold-boot
    /// `launch` with the image's RAM mapped privately and `-incoming`),
    /// then the agent's setup and new identity. Leaves no QEMU on error.
    /// `setup`: the guest was saved freshly booted (a template) and is set
    /// up as a new sandbox; `None`: it was a sandbox (a memory snapshot)
    /// and greets as one.
    async fn restore_image(
        &self,
        id: &str,
        launch: &VmLaunch<'_>,
        image: &MemImage,
        setup: Option<&VmSetup>,
    ) -> Result<Instance, EdgeError> {
        let files = launch.files;
        for stale in [files.agent_socket(), files.qmp_socket()] {
            let _ = std::fs::remove_file(stale);
        }
        let ram_path = ram_fd_path();
        let mut l = launch.clone();
        l.ram_file = Some(&ram_path);
        l.ram_private = true;
        l.incoming_fd = Some(suspend::INCOMING_FD);
        let state = image.vmstate_fd().map_err(EdgeError::sys("a memfd of the device state"))?;
        let args = super::cmdline::qemu_args(&l);
        let (pid, pidfd) = spawn_qemu_fds(
            &self.cgroups,
            &self.qemu,
            id,
            args,
            &files.run_dir,
            &[(&state, suspend::INCOMING_FD), (&image.ram, RAM_FD)],
            None,
        )?;
        drop(state);
        let mut undo = Undo::qemu_only();
        let pidfd = undo.spawned(pid, pidfd);
        let started = async {
            let times = suspend::load_incoming(files, pidfd, true).await?;
            tracing::debug!(%id, qmp_ready_ms = times.qmp_ready_ms, load_ms = times.load_ms, "restored a memory image");
            let agent = match setup {
                Some(setup) => boot_agent(&files.agent_socket(), pidfd, setup.clone()).await?,
                None => attach_saved(&files.agent_socket(), pidfd).await?,
            };
            reidentify(&agent, id, crate::ids::short_id(id)).await?;
            Ok::<_, EdgeError>(agent)
        };
        let agent = match tokio::time::timeout(self.boot_timeout, started).await {
            Ok(Ok(agent)) => agent,
            Ok(Err(e)) => return Err(EdgeError::SetupFailed(format!("{e}{}", console_tail(files)))),
            Err(_) => return Err(EdgeError::Timeout(format!("restoring {id} from its template"))),
        };
        undo.ready(agent)
    }
}

/// Connects to the agent of a guest restored from a sandbox's memory: it
/// greets as that sandbox's, set up.
async fn attach_saved(socket: &Path, qemu: &OwnedFd) -> Result<AgentClient, EdgeError> {
    let stream = connect_agent(socket, qemu).await?;
    let (agent, hello) = AgentClient::connect(stream).await?;
    match hello.state {
        dsec_agent_proto::AgentState::Ready { .. } => Ok(agent),
        other => Err(EdgeError::SetupFailed(format!("the restored guest agent greeted with {other:?}"))),
    }
}

/// Gives a restored guest the identity of sandbox `id`: its greeting's id,
/// `hostname`, the host's clock, and fresh randomness.
pub(crate) async fn reidentify(agent: &AgentClient, id: &str, hostname: &str) -> Result<(), EdgeError> {
    let mut seed = vec![0u8; 64];
    rand::rng().fill_bytes(&mut seed);
    let who = VmIdentity { sandbox_id: id.to_string(), hostname: hostname.to_string(), now_ms: crate::model::now_ms(), seed };
    match agent.call(Op::Reidentify(who)).await? {
        Reply::Done => Ok(()),
        other => Err(EdgeError::SetupFailed(format!("unexpected reply to reidentify: {other:?}"))),
    }
}

/// Waits until the guest printed [`BOOTED_MARKER`] on its console (error
/// if QEMU exits first or `timeout` passes).
async fn wait_booted(console: &Path, qemu: &OwnedFd, timeout: Duration) -> Result<(), EdgeError> {
    let t0 = Instant::now();
    let mut seen = 0usize;
    let mut text = Vec::new();
    loop {
        if let Ok(all) = std::fs::read(console) {
            // Only what is new since the last look, plus a marker's
            // length of overlap.
            let from = seen.saturating_sub(BOOTED_MARKER.len());
            if all.len() > from {
                text.clear();
                text.extend_from_slice(&all[from..]);
                if text.windows(BOOTED_MARKER.len()).any(|w| w == BOOTED_MARKER.as_bytes()) {
                    return Ok(());
                }
            }
            seen = all.len();
        }
        if process_exited(qemu) {
            return Err(EdgeError::SetupFailed("QEMU exited during boot".into()));
        }
        if t0.elapsed() > timeout {
            return Err(EdgeError::Timeout("boot".into()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::qemu::cmdline::{Accel, VmFiles};

    #[test]
    fn a_sealed_ram_file_refuses_writes_and_hole_punching_but_maps_privately() {
        let ram = new_ram(2).unwrap();
        rustix::io::pwrite(&ram, b"guest", 4096).unwrap();
        seal(&ram).unwrap();
        assert!(rustix::io::pwrite(&ram, b"x", 0).is_err(), "a sealed template took a write");
        let punch = rustix::fs::fallocate(&ram, rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE, 4096, 4096);
        assert!(punch.is_err(), "a sealed template lost a page to a hole punch");
        // A private writable mapping (what a restored QEMU makes) is allowed.
        // SAFETY: a fresh private mapping of 2 MiB of a valid fd, unmapped below.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                2 << 20,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&ram),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let page = p.cast::<u8>().add(4096);
            assert_eq!(std::slice::from_raw_parts(page, 5), b"guest");
            *page = b'G';
            libc::munmap(p, 2 << 20);
        }
        let mut back = [0u8; 5];
        rustix::io::pread(&ram, &mut back, 4096).unwrap();
        assert_eq!(&back, b"guest", "a private write reached the template");
    }

    #[test]
    fn shapes_differ_by_what_the_guest_saw_at_boot() {
        let files = VmFiles { run_dir: "/run/x".into(), disk: "/d/x.qcow2".into() };
        let other = VmFiles { run_dir: "/run/y".into(), disk: "/d/y.qcow2".into() };
        let layers = [PathBuf::from("/blobs/a")];
        let l = |f| VmLaunch {
            accel: Accel::Tcg,
            kernel: Path::new("/k"),
            initramfs: Path::new("/i"),
            memory_mb: 128,
            vcpus: 1,
            layers: &layers,
            files: f,
            tsc_khz: None,
            extra_append: "",
            free_page_reporting: true,
            ram_file: None,
            ram_private: false,
            incoming_fd: None,
            tb_size_mb: 16,
        };
        // Per-sandbox files do not matter; memory and disk size do.
        assert_eq!(shape_key(&l(&files), 64), shape_key(&l(&other), 64));
        assert_ne!(shape_key(&l(&files), 64), shape_key(&l(&files), 128));
        let mut big = l(&files);
        big.memory_mb = 256;
        assert_ne!(shape_key(&big, 64), shape_key(&l(&files), 64));
    }

    #[test]
    fn the_marker_is_the_agents() {
        // The agent crate is a binary: compare against its source.
        let src = include_str!("../../../../dsec-agent/src/vm_init.rs");
        assert!(src.contains(&format!("\"{BOOTED_MARKER}\"")));
    }
}
