//! Standby QEMUs: resumes from suspend continue in a QEMU that was started
//! ahead, so QEMU's own start is not on the resume path.
//!
//! A restoring QEMU spends most of its start before it reads a byte of the
//! guest's state: exec and dynamic linking of a large binary, option
//! parsing, the accelerator (docs/benchmarks.md measures the parts). A
//! standby is that QEMU, started with the resume's command line for one
//! *shape* (accelerator, guest RAM, vCPUs, number of layers, balloon, TCG
//! cache) minus what belongs to one sandbox, and held before the machine
//! is built (`--preconfig`, `-incoming defer`). A resume of that shape
//! takes it and, over QMP, adds the guest RAM backend on the sandbox's RAM
//! file (`object-add`, `qom-set /machine memory-backend`), its disks
//! (`blockdev-add` under the node names the `-device` lines name), builds
//! the machine (`x-exit-preconfig`) and loads the suspend image as any
//! restore does. Not in a standby: networked VMs (their QEMU joins the
//! sandbox's network namespace before it execs) and VMs without a RAM file
//! of their own (their image holds the RAM): they start a QEMU as before.
//!
//! Ownership: a standby's cgroup is `<node>.standby-<n>` under the node's
//! cgroup (its limits are the shape's), its sockets and logs are in the
//! run directory of that name. The reaper leaves the names in
//! [`Standbys::names`] alone; a standby of an edge that died is an orphan
//! cgroup and run directory like a dead sandbox's and is removed on the
//! next start. A takeover moves the QEMU into the sandbox's cgroup (memory
//! it charged while waiting, a few MB, stays with the node's parent cgroup
//! once the standby cgroup is removed) and renames the standby's run
//! directory to the sandbox's. The edge ends every standby at shutdown.
//!
//! One standby per shape, at most [`MAX_SHAPES`]; a shape gets one after
//! its first resume (a node that never resumes runs none), made again
//! [`REFILL_DELAY`] after each takeover, off the resume's path.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cmdline::{self, VmLaunch};
use crate::backends::container::spawn::{pidfd_kill, reap};
use crate::backends::qemu::cmdline::VmFiles;
use crate::backends::qemu::process::{process_exited, spawn_qemu_fds};
use crate::backends::qemu::qmp::Session;
use crate::backends::qemu::suspend;
use crate::cgroup::{CgroupLimits, Cgroups};
use crate::edge::lock;
use crate::error::EdgeError;

/// Most shapes a node keeps a standby for.
pub const MAX_SHAPES: usize = 4;
/// How long after a takeover the shape's next standby starts: the resumed
/// guest's first requests get the CPU first.
pub const REFILL_DELAY: Duration = Duration::from_secs(1);
/// How long a new standby may take to answer on QMP.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// One started QEMU waiting for a resume.
pub struct Standby {
    /// Its cgroup's and run directory's name.
    pub name: String,
    pub pid: i32,
    pub pidfd: OwnedFd,
    pub run_dir: PathBuf,
}

/// The node's standby QEMUs, by shape.
pub struct Standbys {
    cgroups: Arc<Cgroups>,
    qemu: PathBuf,
    run_root: PathBuf,
    node: String,
    ready: Mutex<HashMap<String, Standby>>,
    /// Shapes with a standby being made.
    making: Mutex<HashSet<String>>,
    /// Names of every standby's cgroup alive or being made (the reaper's
    /// exceptions). A name is added before its cgroup exists.
    names: Mutex<HashSet<String>>,
    next: AtomicU64,
    /// Set at edge shutdown: no standby is made any more.
    closed: AtomicBool,
}

impl Standbys {
    pub fn new(cgroups: Arc<Cgroups>, qemu: PathBuf, run_root: PathBuf, node: &str) -> Self {
        Self {
            cgroups,
            qemu,
            run_root,
            node: node.to_string(),
            ready: Mutex::default(),
            making: Mutex::default(),
            names: Mutex::default(),
            next: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// The shape of a restore launch: its standby's command line with the
    /// per-standby paths left out.
    pub fn shape(l: &VmLaunch<'_>) -> String {
        let files = VmFiles { run_dir: "/standby".into(), disk: "/standby/disk".into() };
        let mut k = l.clone();
        k.files = &files;
        cmdline::standby_args(&k).join(" ")
    }

    /// The names of every standby's cgroup (live, or being made).
    pub fn names(&self) -> HashSet<String> {
        lock(&self.names).clone()
    }

    /// Takes the standby of `shape`, if one waits.
    pub fn take(&self, shape: &str) -> Option<Standby> {
        let sb = lock(&self.ready).remove(shape)?;
        if process_exited(&sb.pidfd) {
            // It died while waiting (killed by hand, OOM): clean up.
            self.discard(sb);
            return None;
        }
        Some(sb)
    }

    /// Makes a standby for `launch`'s shape in the background, `delay`
    /// from now, unless the shape has one (or one is being made) or the
    /// node keeps the most shapes already.
    pub fn refill(self: &Arc<Self>, launch: &VmLaunch<'_>, limits: CgroupLimits, delay: Duration) {
        let shape = Self::shape(launch);
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        {
            let ready = lock(&self.ready);
            let mut making = lock(&self.making);
            if ready.contains_key(&shape) || making.contains(&shape) || ready.len() + making.len() >= MAX_SHAPES {
                return;
            }
            making.insert(shape.clone());
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}.standby-{n}", self.node);
        let run_dir = self.run_root.join(&name);
        let files = VmFiles { run_dir: run_dir.clone(), disk: run_dir.join("disk") };
        let mut l = launch.clone();
        l.files = &files;
        let args = cmdline::standby_args(&l);
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let made = {
                let me = me.clone();
                let name = name.clone();
                tokio::task::spawn_blocking(move || me.start(&name, &run_dir, args, &limits)).await
            };
            lock(&me.making).remove(&shape);
            match made {
                // The edge began shutting down meanwhile.
                Ok(Ok(sb)) if me.closed.load(Ordering::Acquire) => me.discard(sb),
                Ok(Ok(sb)) => {
                    tracing::debug!(standby = %sb.name, pid = sb.pid, "standby QEMU ready");
                    if let Some(old) = lock(&me.ready).insert(shape, sb) {
                        me.discard(old);
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(standby = %name, error = %e, "starting a standby QEMU failed; resumes of its shape start their own")
                }
                Err(e) => tracing::warn!(standby = %name, error = %e, "standby task failed"),
            }
        });
    }

    /// Starts standby `name` (blocking): cgroup, run directory, QEMU, and
    /// waits until it answers on QMP. Leaves nothing behind on error.
    fn start(&self, name: &str, run_dir: &Path, args: Vec<String>, limits: &CgroupLimits) -> Result<Standby, EdgeError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(EdgeError::ShuttingDown);
        }
        lock(&self.names).insert(name.to_string());
        let started = (|| {
            self.cgroups.create(name, limits)?;
            std::fs::create_dir_all(run_dir).map_err(EdgeError::io("creating", run_dir))?;
            let (pid, pidfd) = spawn_qemu_fds(&self.cgroups, &self.qemu, name, args, run_dir, &[], None)?;
            let sb = Standby { name: name.to_string(), pid, pidfd, run_dir: run_dir.to_path_buf() };
            let qmp = run_dir.join("qmp.sock");
            let t0 = Instant::now();
            loop {
                if Session::connect(&qmp).is_ok() {
                    if self.closed.load(Ordering::Acquire) {
                        // The edge shut down while it started.
                        self.discard(sb);
                        return Err(EdgeError::ShuttingDown);
                    }
                    return Ok(sb);
                }
                if process_exited(&sb.pidfd) || t0.elapsed() > READY_TIMEOUT {
                    let why = std::fs::read_to_string(run_dir.join("qemu.log")).unwrap_or_default();
                    self.discard(sb);
                    return Err(EdgeError::StandbyFailed(why.trim().to_string()));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })();
        if started.is_err() {
            self.forget_files(name, run_dir);
        }
        started
    }

    /// Ends a standby that will not be used and removes its files.
    pub fn discard(&self, sb: Standby) {
        let _ = pidfd_kill(&sb.pidfd, libc::SIGKILL);
        reap(&sb.pidfd);
        self.forget_files(&sb.name, &sb.run_dir);
    }

    fn forget_files(&self, name: &str, run_dir: &Path) {
        self.cgroups.kill_all(name);
        let _ = self.cgroups.remove(name);
        let _ = std::fs::remove_dir_all(run_dir);
        lock(&self.names).remove(name);
    }

    /// Ends every standby (edge shutdown).
    pub fn end_all(&self) {
        self.closed.store(true, Ordering::Release);
        let all: Vec<Standby> = lock(&self.ready).drain().map(|(_, sb)| sb).collect();
        for sb in all {
            self.discard(sb);
        }
    }

    /// Makes standby `sb` sandbox `to.id`'s QEMU (blocking): into the
    /// sandbox's cgroup, its run directory renamed to the sandbox's (whose
    /// old contents go), then the RAM file, the disks, the machine, the
    /// suspend image, and `cont`. On error the standby is ended and the
    /// caller may start a QEMU of its own: the guest never ran, so the RAM
    /// file and the image are as they were.
    pub fn take_over(&self, sb: Standby, to: &Takeover) -> Result<(i32, OwnedFd, TakeoverTimes), EdgeError> {
        let t0 = Instant::now();
        let moved = (|| {
            self.cgroups.attach(&to.id, sb.pid)?;
            let _ = std::fs::remove_dir_all(&to.run_dir);
            std::fs::rename(&sb.run_dir, &to.run_dir).map_err(EdgeError::io("renaming the standby's run directory", &sb.run_dir))
        })();
        if let Err(e) = moved {
            self.discard(sb);
            return Err(e);
        }
        // The QEMU is the sandbox's now: its old cgroup and name go.
        let _ = self.cgroups.remove(&sb.name);
        lock(&self.names).remove(&sb.name);
        let attach_ms = ms(t0);
        match load(to) {
            Ok(mut times) => {
                times.attach_ms = attach_ms;
                Ok((sb.pid, sb.pidfd, times))
            }
            Err(e) => {
                let _ = pidfd_kill(&sb.pidfd, libc::SIGKILL);
                reap(&sb.pidfd);
                Err(e)
            }
        }
    }
}

/// What a takeover gives a standby: the sandbox's parts.
#[derive(Debug, Clone)]
pub struct Takeover {
    pub id: String,
    /// The sandbox's run directory (the standby's is renamed to it).
    pub run_dir: PathBuf,
    pub memory_mb: u64,
    /// `blockdev-add` arguments (`cmdline::standby_blockdevs`).
    pub blockdevs: Vec<serde_json::Value>,
    /// The guest RAM file, mapped shared.
    pub ram: PathBuf,
    /// The suspend image (device state).
    pub image: PathBuf,
}

/// Where a takeover's time went, ms.
#[derive(Debug, Clone, Copy, Default)]
pub struct TakeoverTimes {
    /// Cgroup move and run directory rename.
    pub attach_ms: f64,
    /// RAM backend and disks added over QMP.
    pub devices_ms: f64,
    /// `x-exit-preconfig`: the machine and its devices built.
    pub machine_ms: f64,
    /// The suspend image loaded.
    pub load_ms: f64,
}

/// The QMP part of a takeover: RAM backend, disks, machine, image, cont.
fn load(to: &Takeover) -> Result<TakeoverTimes, EdgeError> {
    let t0 = Instant::now();
    let mut s = Session::connect(&to.run_dir.join("qmp.sock"))?;
    let backend = serde_json::json!({
        "qom-type": "memory-backend-file", "id": "ram", "size": to.memory_mb << 20,
        "mem-path": to.ram.display().to_string(), "share": true,
    });
    s.call("object-add", backend)?;
    s.call("qom-set", serde_json::json!({ "path": "/machine", "property": "memory-backend", "value": "ram" }))?;
    for dev in &to.blockdevs {
        s.call("blockdev-add", dev.clone())?;
    }
    let devices_ms = ms(t0);
    let t1 = Instant::now();
    s.call("x-exit-preconfig", serde_json::Value::Null)?;
    let machine_ms = ms(t1);
    let t2 = Instant::now();
    let state = std::fs::File::open(&to.image).map_err(EdgeError::io("opening the suspend image", &to.image))?;
    s.call_with_fd("getfd", serde_json::json!({ "fdname": "incoming" }), state.as_fd())?;
    drop(state);
    suspend::load_and_continue(&mut s, "fd:incoming", true)?;
    Ok(TakeoverTimes { attach_ms: 0.0, devices_ms, machine_ms, load_ms: ms(t2) })
}

fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1000.0
}
