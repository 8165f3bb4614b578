//! The node's disk for writable layers and volumes: one btrfs filesystem,
//! a subvolume per container's writable layer and per named volume, each
//! bounded by a quota group.
//!
//! Why btrfs: the layer must live on local disk (not in memory), be bounded
//! per sandbox by the kernel, and cost creation almost nothing. A subvolume
//! is made and limited with two ioctls (tens of microseconds) and removed
//! with one, in O(1) whatever it holds (the kernel frees its extents in the
//! background and drops its quota group with them). This kernel builds XFS
//! without quota support and ext4's project quotas need a quota format it
//! lacks; a filesystem image per sandbox would be a mkfs and a loop device
//! per creation. See docs/design.md, "The writable layer on local disk".
//!
//! Where the filesystem comes from (`DiskConfig::source`): by default an
//! image file under the edge's state directory, made with mkfs.btrfs on
//! first use and loop-mounted by the edge at start; or a block device the
//! operator formatted, mounted the same way; or a directory on a btrfs the
//! operator mounted, used as it is. The edge mounts once per node; each
//! sandbox's agent binds its subvolume inside its own mount namespace, so
//! the host's mount table does not grow with sandboxes.

pub mod btrfs;
mod loop_dev;
pub mod service;
pub mod volumes;

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// How a node holds its containers' writable layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WritableLayer {
    /// A size-limited tmpfs in the sandbox's memory (the layer's pages are
    /// charged to its memory cgroup, so the layer is held below the memory
    /// limit): for nodes of tiny sandboxes, or hosts without btrfs.
    Tmpfs,
    /// A btrfs subvolume on the node's disk, bounded by `disk_limit_mb`.
    Disk(DiskConfig),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiskConfig {
    /// An image file, a block device holding a btrfs, or a directory on a
    /// mounted btrfs; `None`: `<state dir>/writable.img`.
    pub source: Option<PathBuf>,
    /// Size of an image file the edge makes (sparse: only what is written
    /// takes room on the host); `None`: half of the free space where it is
    /// made, at most 1 TiB.
    pub image_size_gb: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{action} {}: {source}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("making the node's writable-layer filesystem on {}: {why} (install btrfs-progs, or start the edge with --writable-layer tmpfs)", .path.display())]
    Mkfs { path: PathBuf, why: String },
    #[error("{} is not on btrfs: the writable-layer source must be a btrfs directory, a block device with a btrfs, or an image file", .0.display())]
    NotBtrfs(PathBuf),
    #[error("{0}")]
    Invalid(String),
    #[error("a volume named {0:?} already exists")]
    VolumeExists(String),
    #[error("no volume named {0:?} is visible here")]
    VolumeNotFound(String),
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DiskError + 'a {
    move |source| DiskError::Io { action, path: path.to_path_buf(), source }
}

/// The node's btrfs, as the edge uses it.
pub struct NodeDisk {
    /// Its subvolumes of writable layers, one per sandbox, named by id.
    sandboxes: PathBuf,
    /// Its subvolumes of named volumes.
    volumes: PathBuf,
    /// Scratch space of packs: their copies of a sandbox's changes are
    /// made on the same filesystem as the changes themselves.
    scratch: PathBuf,
    /// `/sys/fs/btrfs/<fsid>/qgroups`: what each subvolume holds.
    qgroups: PathBuf,
    /// The mount the edge made (or found made by an earlier edge), which
    /// `release` takes down once no sandbox is left on it.
    mount: Option<PathBuf>,
    /// Subvolume ids by sandbox id (for the usage sampler's reads).
    ids: Mutex<HashMap<String, u64>>,
}

impl NodeDisk {
    /// Mounts (or finds) the node's filesystem and turns its quotas on.
    pub fn open(config: &DiskConfig, state_dir: &Path) -> Result<NodeDisk, DiskError> {
        let mount_dir = state_dir.join("writable");
        let (root, mount) = match &config.source {
            Some(dir) if dir.is_dir() => {
                if !is_btrfs(dir)? {
                    return Err(DiskError::NotBtrfs(dir.clone()));
                }
                (dir.clone(), None)
            }
            Some(dev) if is_block_device(dev) => {
                mount_once(dev, &mount_dir)?;
                (mount_dir.clone(), Some(mount_dir))
            }
            other => {
                let image = other.clone().unwrap_or_else(|| state_dir.join("writable.img"));
                if !image.exists() {
                    make_image(&image, config.image_size_gb)?;
                }
                mount_once(&image, &mount_dir)?;
                (mount_dir.clone(), Some(mount_dir))
            }
        };
        let opened = Self::prepare(&root, mount.clone());
        if let (Err(_), Some(m)) = (&opened, &mount) {
            unmount(m);
        }
        opened
    }

    fn prepare(root: &Path, mount: Option<PathBuf>) -> Result<NodeDisk, DiskError> {
        let fs = open_dir(root)?;
        btrfs::enable_quota(fs.as_fd()).map_err(io("turning quotas on for", root))?;
        let fsid = btrfs::fsid(fs.as_fd()).map_err(io("reading the filesystem id of", root))?;
        let (sandboxes, volumes, scratch) = (root.join("sandboxes"), root.join("volumes"), root.join("scratch"));
        // What a pack left there when its edge died is nobody's.
        if let Err(e) = crate::disk::remove_tree_if_present(&scratch) {
            tracing::warn!(path = %scratch.display(), error = %e, "could not empty the packs' scratch space");
        }
        for d in [&sandboxes, &volumes, &scratch] {
            std::fs::create_dir_all(d).map_err(io("creating", d))?;
        }
        let qgroups = PathBuf::from(format!("/sys/fs/btrfs/{fsid}/qgroups"));
        Ok(NodeDisk { sandboxes, volumes, scratch, qgroups, mount, ids: Mutex::new(HashMap::new()) })
    }

    /// Where packs gather a sandbox's changes.
    pub fn scratch_dir(&self) -> &Path {
        &self.scratch
    }

    /// Makes sandbox `id`'s writable layer, bounded to `limit_bytes`;
    /// returns its directory. On failure nothing is left.
    pub fn create_layer(&self, id: &str, limit_bytes: u64) -> Result<PathBuf, DiskError> {
        let sid = make_subvolume(&self.sandboxes, id, limit_bytes)?;
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).insert(id.to_string(), sid);
        Ok(self.sandboxes.join(id))
    }

    /// Removes sandbox `id`'s writable layer (none: nothing to do).
    pub fn remove_layer(&self, id: &str) -> Result<(), DiskError> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        remove_subvolume(&self.sandboxes, id)
    }

    /// Bytes sandbox `id`'s layer holds: what the last transaction
    /// committed plus what writes since then have reserved.
    pub fn layer_used_bytes(&self, id: &str) -> Option<u64> {
        let cached = self.ids.lock().unwrap_or_else(|p| p.into_inner()).get(id).copied();
        let sid = match cached {
            Some(s) => s,
            // A sandbox adopted after a restart: looked up once.
            None => {
                let s = btrfs::subvolume_id(open_dir(&self.sandboxes.join(id)).ok()?.as_fd()).ok()?;
                self.ids.lock().unwrap_or_else(|p| p.into_inner()).insert(id.to_string(), s);
                s
            }
        };
        self.used_bytes(sid)
    }

    fn used_bytes(&self, subvolume_id: u64) -> Option<u64> {
        let dir = self.qgroups.join(format!("0_{subvolume_id}"));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok()?.trim().parse::<u64>().ok();
        Some(read("referenced")? + read("rsv_data").unwrap_or(0))
    }

    /// Removes the writable layers of sandboxes not in `live` (left by a
    /// crash of the edge, or by a removal that failed). Returns how many.
    pub fn reap(&self, live: &std::collections::HashSet<String>) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.sandboxes) else { return 0 };
        let mut n = 0;
        for name in entries.flatten().filter_map(|e| e.file_name().into_string().ok()) {
            if live.contains(&name) {
                continue;
            }
            match self.remove_layer(&name) {
                Ok(()) => n += 1,
                Err(e) => tracing::warn!(error = %e, "could not remove a stray writable layer"),
            }
        }
        n
    }

    /// Unmounts the node's filesystem at edge shutdown, unless sandboxes
    /// left running for a restarted edge still have layers on it.
    pub fn release(&self) {
        let Some(mount) = &self.mount else { return };
        let left = std::fs::read_dir(&self.sandboxes).map(|d| d.count()).unwrap_or(0);
        if left > 0 {
            tracing::info!(layers = left, "the node's writable-layer filesystem stays mounted for the sandboxes left running");
            return;
        }
        unmount(mount);
    }
}

/// Makes subvolume `name` of `parent` bounded to `limit_bytes`; returns
/// its id. On failure nothing is left.
fn make_subvolume(parent: &Path, name: &str, limit_bytes: u64) -> Result<u64, DiskError> {
    let cname = CString::new(name).map_err(|_| DiskError::Invalid(format!("name {name:?} contains NUL")))?;
    let pfd = open_dir(parent)?;
    let path = parent.join(name);
    btrfs::create_subvolume(pfd.as_fd(), &cname).map_err(io("creating subvolume", &path))?;
    let limited = open_dir(&path).and_then(|fd| {
        btrfs::limit_subvolume(fd.as_fd(), limit_bytes).map_err(io("limiting subvolume", &path))?;
        btrfs::subvolume_id(fd.as_fd()).map_err(io("reading the id of subvolume", &path))
    });
    if limited.is_err() {
        let _ = btrfs::destroy_subvolume(pfd.as_fd(), &cname);
    }
    limited
}

/// Removes subvolume `name` of `parent`, whatever it holds.
fn remove_subvolume(parent: &Path, name: &str) -> Result<(), DiskError> {
    let cname = CString::new(name).map_err(|_| DiskError::Invalid(format!("name {name:?} contains NUL")))?;
    let path = parent.join(name);
    match btrfs::destroy_subvolume(open_dir(parent)?.as_fd(), &cname) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(io("removing subvolume", &path)(e)),
    }
}

fn open_dir(p: &Path) -> Result<OwnedFd, DiskError> {
    rustix::fs::open(p, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC, 0.into())
        .map_err(|e| io("opening", p)(e.into()))
}

fn is_btrfs(p: &Path) -> Result<bool, DiskError> {
    let st = rustix::fs::statfs(p).map_err(|e| io("statfs", p)(e.into()))?;
    Ok(st.f_type as i64 == btrfs::SUPER_MAGIC)
}

fn is_block_device(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt as _;
    std::fs::metadata(p).map(|m| m.file_type().is_block_device()).unwrap_or(false)
}

/// Whether `dir` is a btrfs mounted there (by an earlier edge whose
/// sandboxes kept it).
fn is_btrfs_mount(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let (Ok(here), Some(Ok(parent))) = (std::fs::metadata(dir), dir.parent().map(std::fs::metadata)) else { return false };
    here.dev() != parent.dev() && is_btrfs(dir).unwrap_or(false)
}

/// Mounts the btrfs on `source` (an image file or a block device) at
/// `dir`, unless an earlier edge's mount is still there.
fn mount_once(source: &Path, dir: &Path) -> Result<(), DiskError> {
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    if is_btrfs_mount(dir) {
        return Ok(());
    }
    // An image file goes through a loop device, dropped (and so cleared
    // by the kernel once unused) right after the mount takes it.
    let looped =
        if is_block_device(source) { None } else { Some(loop_dev::attach(source).map_err(io("attaching a loop device to", source))?) };
    let dev = looped.as_ref().map_or(source, |l| l.path.as_path());
    rustix::mount::mount(
        dev,
        dir,
        "btrfs",
        rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV | rustix::mount::MountFlags::NOATIME,
        None::<&std::ffi::CStr>,
    )
    .map_err(|e| io("mounting the node's writable-layer filesystem on", dir)(e.into()))
}

fn unmount(dir: &Path) {
    use rustix::mount::UnmountFlags;
    // Busy (a shell in it, say): detached, and freed with its loop device
    // once the last user goes.
    if rustix::mount::unmount(dir, UnmountFlags::empty()).is_err() {
        if let Err(e) = rustix::mount::unmount(dir, UnmountFlags::DETACH) {
            tracing::warn!(error = %e, dir = %dir.display(), "could not unmount the node's writable-layer filesystem");
        }
    }
}

/// A sparse image file with a fresh btrfs, made under a temporary name and
/// renamed into place (a crash never leaves a half-made one).
fn make_image(image: &Path, size_gb: Option<u64>) -> Result<(), DiskError> {
    let dir = image.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let size = match size_gb {
        Some(g) => g << 30,
        None => {
            let st = rustix::fs::statvfs(dir).map_err(|e| io("statvfs", dir)(e.into()))?;
            (st.f_bavail.saturating_mul(st.f_frsize) / 2).min(1 << 40)
        }
    };
    // mkfs.btrfs refuses a filesystem under 114 MiB.
    if size < 256 << 20 {
        return Err(DiskError::Invalid(format!("{} has too little free space for the writable-layer image ({size} bytes)", dir.display())));
    }
    let tmp = image.with_extension("img.part");
    let made = (|| {
        let f = std::fs::File::create(&tmp).map_err(io("creating", &tmp))?;
        f.set_len(size).map_err(io("sizing", &tmp))?;
        drop(f);
        // Single copies of data and metadata: a scratch filesystem for
        // throwaway layers, on a disk that is one device anyway.
        let out = std::process::Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-m", "single", "-d", "single", "-L", "dsec-writable"])
            .arg(&tmp)
            .output()
            .map_err(|e| DiskError::Mkfs { path: image.to_path_buf(), why: e.to_string() })?;
        if !out.status.success() {
            return Err(DiskError::Mkfs { path: image.to_path_buf(), why: String::from_utf8_lossy(&out.stderr).trim().to_string() });
        }
        std::fs::rename(&tmp, image).map_err(io("renaming", &tmp))
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    made
}

/// Removes `dir` and everything below it; a missing `dir` is no error.
fn remove_tree_if_present(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}
