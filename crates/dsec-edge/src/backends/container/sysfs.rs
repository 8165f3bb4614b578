//! One read-only sysfs per node, shared by every sandbox.
//!
//! A sysfs shows the network devices of the namespace that mounted it, and
//! mounting one scans every sysfs already mounted on the host (so the cost
//! grows with the sandboxes on the node) and adds a filesystem, whose
//! shrinker costs memory in every memory cgroup. So the edge mounts one
//! sysfs, from a thread that first entered a network namespace of its own
//! (holding only a loopback, like every sandbox's), and sandboxes bind it
//! read-only at /sys. The host's devices never show.

use std::path::{Path, PathBuf};

use crate::error::EdgeError;

const SYSFS_MAGIC: i64 = 0x6265_6572;

fn is_sysfs(dir: &Path) -> bool {
    // `as`: `f_type`'s type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    let is = rustix::fs::statfs(dir).map(|s| s.f_type as i64 == SYSFS_MAGIC).unwrap_or(false);
    is
}

/// The node's sysfs, and the network namespace it shows.
pub struct SharedSysfs {
    pub dir: PathBuf,
    /// Keeps the namespace alive: a sysfs mount alone does not, and a dead
    /// namespace's sysfs lists no network devices at all.
    _netns: std::os::fd::OwnedFd,
}

/// Mounts the node's sysfs at `dir`. One an earlier edge left there is
/// replaced: its namespace may be gone.
pub fn ensure(dir: &Path) -> Result<SharedSysfs, EdgeError> {
    std::fs::create_dir_all(dir).map_err(EdgeError::io("creating", dir))?;
    release_mounts(dir);
    let target = dir.to_path_buf();
    // unshare(CLONE_NEWNET) changes only the calling thread's namespace, so
    // a short-lived thread of its own does it; the mount lands in the
    // process's (host) mount namespace, tagged with the new network
    // namespace, which the mount keeps alive.
    let mounted = std::thread::spawn(move || -> Result<std::os::fd::OwnedFd, EdgeError> {
        // SAFETY: unshare(2) of the network namespace for this thread only;
        // it touches no memory and no fd of the process.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(EdgeError::Sys { call: "unshare(CLONE_NEWNET) for the node's sysfs", source: std::io::Error::last_os_error() });
        }
        let netns = std::fs::File::open("/proc/thread-self/ns/net").map_err(EdgeError::sys("open the sysfs thread's netns"))?;
        rustix::mount::mount(
            "sysfs",
            &target,
            "sysfs",
            rustix::mount::MountFlags::RDONLY
                | rustix::mount::MountFlags::NOSUID
                | rustix::mount::MountFlags::NODEV
                | rustix::mount::MountFlags::NOEXEC,
            None::<&std::ffi::CStr>,
        )
        .map_err(|e| EdgeError::Io { action: "mounting sysfs at", path: target.clone(), source: e.into() })?;
        Ok(netns.into())
    })
    .join()
    .map_err(|_| EdgeError::Invariant("the sysfs thread does not panic"))??;
    Ok(SharedSysfs { dir: dir.to_path_buf(), _netns: mounted })
}

/// Unmounts it when the edge shuts down (sandboxes left running keep theirs).
pub fn release(dir: &Path) {
    release_mounts(dir);
    let _ = std::fs::remove_dir(dir);
}

fn release_mounts(dir: &Path) {
    while is_sysfs(dir) {
        if rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH).is_err() {
            break;
        }
    }
}
