//! Suspend to disk and restore of one VM, with QEMU's migration (both VM
//! backends; a microVM's guest RAM may be a file of its own, a full VM's
//! never is).
//!
//! Suspend: QMP `stop`, then `migrate` to a file the edge opens and hands
//! over with `getfd` (QEMU may not open files or spawn under its seccomp
//! sandbox). When guest RAM is a shared mapping of a file
//! (`memory-backend-file,share=on`), the migration leaves RAM out
//! (capability `x-ignore-shared`, on both sides) and saves device state only: the RAM
//! file *is* the memory image, flushed to disk and dropped from the page
//! cache once QEMU is gone. Without a RAM file the stream holds all of RAM
//! (QEMU skips zero pages).
//!
//! Restore: a new QEMU with the same command line plus `-incoming defer`
//! and the image inherited at fd 3 gets the same capabilities and
//! `migrate-incoming fd:3`, loads the state, stays stopped because the
//! source was stopped, and is continued with `cont`.
//!
//! The image becomes visible under its final name only once complete
//! (temp + fsync + rename), so a restarted edge can trust its presence.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::cmdline::VmFiles;
use super::process::{console_tail, spawn_qemu, wait_exit};
use super::qmp::Session;
use super::undo::Undo;
use super::{agent, net};
use crate::backends::container::spawn::pidfd_kill;
use crate::backends::instance::Instance;
use crate::backends::SuspendOutcome;
use crate::cgroup::Cgroups;
use crate::error::EdgeError;

/// Longest a migration to disk (or back) may take.
const MIGRATE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long QEMU gets to exit after `quit`.
const QUIT_TIMEOUT: Duration = Duration::from_secs(10);
/// The descriptor a restoring QEMU reads its image from.
pub const INCOMING_FD: i32 = 3;

/// Saves the VM behind `qmp` to `image` and ends its QEMU (`pidfd`).
/// `ram` is the guest RAM file when there is one. `ignore_shared`: leave
/// shared file-backed memory out of the stream (the RAM file, a full VM's
/// read-only pmem layers); the restore must say the same. On error QEMU
/// keeps running (continued again) and no image is left.
pub fn save(qmp: &Path, image: &Path, ram: Option<&Path>, ignore_shared: bool, pidfd: &OwnedFd) -> Result<SuspendOutcome, EdgeError> {
    let t0 = Instant::now();
    let mut s = Session::connect(qmp)?;
    s.call("stop", serde_json::Value::Null)?;
    set_capabilities(&mut s, ignore_shared)?;
    let tmp = image.with_extension("tmp");
    let saved = migrate_out(&mut s, &tmp);
    if let Err(e) = saved {
        let _ = std::fs::remove_file(&tmp);
        let _ = s.call("cont", serde_json::Value::Null);
        return Err(e);
    }
    std::fs::rename(&tmp, image).map_err(EdgeError::io("naming the suspend image", image))?;
    let save_ms = ms(t0);
    // The state is safe on disk: QEMU may go. `quit` lets it close its
    // files cleanly; SIGKILL if it lingers.
    let _ = s.call("quit", serde_json::Value::Null);
    drop(s);
    if !wait_exit(pidfd, QUIT_TIMEOUT) {
        let _ = pidfd_kill(pidfd, libc::SIGKILL);
        wait_exit(pidfd, QUIT_TIMEOUT);
    }
    let t1 = Instant::now();
    if let Some(ram) = ram {
        flush_and_drop(ram)?;
    }
    let disk_bytes = allocated(image) + ram.map(allocated).unwrap_or(0);
    Ok(SuspendOutcome { disk_bytes, save_ms, flush_ms: ms(t1), ..Default::default() })
}

fn migrate_out(s: &mut Session, tmp: &Path) -> Result<(), EdgeError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(tmp)
        .map_err(EdgeError::io("creating", tmp))?;
    s.call_with_fd("getfd", serde_json::json!({ "fdname": "suspend" }), file.as_fd())?;
    s.call("migrate", serde_json::json!({ "uri": "fd:suspend" }))?;
    wait_migration(s)?;
    file.sync_all().map_err(EdgeError::io("flushing", tmp))?;
    // The image is on disk: its page cache (charged to the VM's cgroup,
    // all of RAM when RAM is in the stream) need not stay.
    let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed);
    Ok(())
}

/// Polls `query-migrate` until the migration completed (error if it
/// failed or took too long).
fn wait_migration(s: &mut Session) -> Result<(), EdgeError> {
    let deadline = Instant::now() + MIGRATE_TIMEOUT;
    loop {
        let r = s.call("query-migrate", serde_json::Value::Null)?;
        match r.get("status").and_then(|v| v.as_str()).unwrap_or("") {
            "completed" => return Ok(()),
            st @ ("failed" | "cancelled") => {
                let why = r.get("error-desc").and_then(|v| v.as_str()).unwrap_or("no reason given");
                return Err(EdgeError::Migration { state: st.to_string(), why: why.to_string() });
            }
            _ if Instant::now() > deadline => return Err(EdgeError::Timeout(format!("QEMU migration after {MIGRATE_TIMEOUT:?}"))),
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Leaves shared (file-backed) guest memory out of the stream, or not.
fn set_capabilities(s: &mut Session, ignore_shared: bool) -> Result<(), EdgeError> {
    let caps = serde_json::json!({ "capabilities": [{ "capability": "x-ignore-shared", "state": ignore_shared }] });
    Ok(s.call("migrate-set-capabilities", caps).map(drop)?)
}

/// Where a restore's time went, ms (logged with every resume).
#[derive(Debug, Clone, Copy, Default)]
pub struct RestoreTimes {
    /// From the call until QEMU's QMP socket answered (QEMU's own start:
    /// exec, dynamic linking, machine and device creation).
    pub qmp_ready_ms: f64,
    /// `migrate-incoming` until the device state was loaded and the
    /// guest continued.
    pub load_ms: f64,
}

/// After a restoring QEMU started: has it load the image (inherited at
/// `INCOMING_FD`), then lets the guest run.
pub fn finish_restore(qmp: &Path, pidfd: &OwnedFd, ignore_shared: bool) -> Result<RestoreTimes, EdgeError> {
    let t0 = Instant::now();
    let deadline = t0 + MIGRATE_TIMEOUT;
    let mut s = loop {
        match Session::connect(qmp) {
            Ok(s) => break s,
            Err(e) => {
                if wait_exit(pidfd, Duration::ZERO) {
                    return Err(EdgeError::SetupFailed("QEMU exited while loading the suspend image".into()));
                }
                if Instant::now() > deadline {
                    return Err(e.into());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    };
    let qmp_ready_ms = ms(t0);
    let t1 = Instant::now();
    load_and_continue(&mut s, &format!("fd:{INCOMING_FD}"), ignore_shared)?;
    Ok(RestoreTimes { qmp_ready_ms, load_ms: ms(t1) })
}

/// Loads the state a QEMU waiting with `-incoming defer` reads from `uri`
/// (same capabilities as the save) and lets the guest run.
pub fn load_and_continue(s: &mut Session, uri: &str, ignore_shared: bool) -> Result<(), EdgeError> {
    set_capabilities(s, ignore_shared)?;
    s.call("migrate-incoming", serde_json::json!({ "uri": uri }))?;
    wait_migration(s)?;
    Ok(s.call("cont", serde_json::Value::Null).map(drop)?)
}

/// Suspends VM `id` (QEMU `pidfd`, QMP at `qmp`) to `image` and ends its
/// QEMU (shared by both VM backends; `save` says what
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
    let pidfd = pidfd.try_clone().map_err(EdgeError::sys("dup QEMU's pidfd"))?;
    let mut out = tokio::task::spawn_blocking(move || save(&qmp, &image, ram.as_deref(), ignore_shared, &pidfd))
        .await
        .map_err(EdgeError::task("suspend"))??;
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
    let state = std::fs::File::open(image).map_err(EdgeError::io("opening the suspend image", image))?;
    // Sockets of the previous QEMU: the new one makes its own.
    for stale in [files.agent_socket(), files.qmp_socket()] {
        let _ = std::fs::remove_file(stale);
    }
    let state = std::os::fd::OwnedFd::from(state);
    let t0 = Instant::now();
    let (pid, pidfd) = spawn_qemu(cgroups, qemu, id, args, &files.run_dir, Some(&state), net)?;
    drop(state);
    let mut undo = Undo::qemu_only();
    let pidfd = undo.spawned(pid, pidfd);
    let spawn_ms = ms(t0);
    let restored = async {
        let times = load_incoming(files, pidfd, ignore_shared).await?;
        let t1 = Instant::now();
        let agent = agent::attach_ready(id, pidfd, &files.agent_socket()).await?;
        tracing::info!(%id, spawn_ms, qmp_ready_ms = times.qmp_ready_ms, load_ms = times.load_ms, agent_ms = ms(t1), "restored a VM");
        Ok::<_, EdgeError>(agent)
    };
    let agent = restored.await.map_err(|e| EdgeError::SetupFailed(format!("restoring {id}: {e}{}", console_tail(files))))?;
    // The image is spent (with a RAM file, that is live memory again).
    let _ = std::fs::remove_file(image);
    undo.ready(agent)
}

/// Has a QEMU started with `-incoming defer` (`pidfd`) load its state
/// and continue (`finish_restore`, on a blocking thread).
pub(crate) async fn load_incoming(files: &VmFiles, pidfd: &std::os::fd::OwnedFd, ignore_shared: bool) -> Result<RestoreTimes, EdgeError> {
    let (qmp, fd) = (files.qmp_socket(), pidfd.try_clone().map_err(EdgeError::sys("dup QEMU's pidfd"))?);
    tokio::task::spawn_blocking(move || finish_restore(&qmp, &fd, ignore_shared)).await.map_err(EdgeError::task("restore"))?
}

/// Writes the RAM file's dirty pages to disk and drops its pages from the
/// page cache: the memory is then on disk only.
fn flush_and_drop(ram: &Path) -> Result<(), EdgeError> {
    let f = std::fs::File::open(ram).map_err(EdgeError::io("opening", ram))?;
    f.sync_data().map_err(EdgeError::io("flushing", ram))?;
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).map_err(|e| EdgeError::io("dropping the cache of", ram)(e.into()))
}

/// Bytes a file occupies on disk (its allocated blocks; holes are free).
pub fn allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0)
}

fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1000.0
}
