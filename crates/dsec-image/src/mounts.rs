//! Host-side mounts of layer blobs, one per layer per node, shared by every
//! sandbox's overlay as lower directories.
//!
//! Each layer is an EROFS *file-backed* mount: `mount(2)` straight on the
//! blob file (no loop device; util-linux `mount` would make one, so it is
//! never spawned). Mountpoints are `<dir>/<hex digest>`.
//!
//! Propagation: [`LayerMounts::open`] makes `<dir>` a private bind mount of
//! itself. Without that, on a host whose `/` is shared (systemd's default),
//! every layer mount and unmount would propagate into each sandbox mount
//! namespace that is a peer or slave of the host's, an O(sandboxes) cost
//! per layer and a mount table that grows with the node. Private means a
//! sandbox namespace gets the layer mounts that exist when it is created
//! (clone copies them) and nothing afterwards; so mount a sandbox's layers
//! *before* creating its mount namespace, which is the natural order anyway.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use rustix::io::Errno;
use rustix::mount::{mount, mount_bind_recursive, mount_change, unmount, MountFlags, MountPropagationFlags, UnmountFlags};

use crate::digest::Digest;
use crate::erofs::{self, ErofsError, EROFS_MAGIC};
use crate::mountinfo;
use crate::store::ResolvedImage;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("layer blob {path} is not a usable EROFS image: {source}")]
    CorruptBlob {
        path: PathBuf,
        #[source]
        source: ErofsError,
    },
    #[error("mounting layer {digest} from {blob} at {target}: {source}")]
    Mount {
        digest: Digest,
        blob: PathBuf,
        target: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("unmounting {target}: {source}")]
    Unmount {
        target: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{target} is already a mount point of something other than an EROFS layer")]
    Occupied { target: PathBuf },
}

fn io_err<'a>(context: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> MountError + 'a {
    move |source| MountError::Io { context, path: path.to_path_buf(), source }
}

/// Layer mounts under one directory. Use one instance per directory per
/// process (it is `Sync`; share it): the in-memory set is what makes repeat
/// mounts free and concurrent first mounts happen exactly once.
pub struct LayerMounts {
    dir: PathBuf,
    /// Layers known to be mounted: the fast path is one read lock.
    mounted: RwLock<HashSet<Digest>>,
    /// Serialises the slow paths (mount, unmount). A mount costs ~75 us, so
    /// per-digest locks would buy little and cost clarity.
    change: Mutex<()>,
}

impl LayerMounts {
    /// Opens `dir` (creating it), makes it a private mount, and adopts the
    /// layers an earlier process left mounted there.
    pub fn open(dir: impl AsRef<Path>) -> Result<LayerMounts, MountError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
        let dir = dir.canonicalize().map_err(io_err("resolving", dir))?;
        if !mountinfo::is_mount_point(&dir).map_err(io_err("reading mountinfo for", &dir))? {
            // Recursive, so layers mounted here before (by a process that
            // predates the bind) stay visible instead of being shadowed.
            mount_bind_recursive(&dir, &dir).map_err(|e| io_err("bind-mounting", &dir)(e.into()))?;
        }
        mount_change(&dir, MountPropagationFlags::PRIVATE).map_err(|e| io_err("making private", &dir)(e.into()))?;
        let mounts = LayerMounts { dir, mounted: RwLock::new(HashSet::new()), change: Mutex::new(()) };
        let found = mounts.mounted()?;
        mounts.set_mut().extend(found);
        Ok(mounts)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where `digest` is (or would be) mounted.
    pub fn path_of(&self, digest: &Digest) -> PathBuf {
        self.dir.join(digest.hex())
    }

    fn set_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashSet<Digest>> {
        self.mounted.write().unwrap_or_else(|p| p.into_inner())
    }

    fn is_known(&self, digest: &Digest) -> bool {
        self.mounted.read().unwrap_or_else(|p| p.into_inner()).contains(digest)
    }

    /// Mounts the blob of `digest` read-only at `<dir>/<hex>` unless it is
    /// mounted already, and returns that path. Safe to call from many
    /// threads at once: the layer is mounted exactly once.
    pub fn mount(&self, digest: &Digest, blob: &Path) -> Result<PathBuf, MountError> {
        if self.is_known(digest) {
            return Ok(self.path_of(digest));
        }
        let _change = self.change.lock().unwrap_or_else(|p| p.into_inner());
        let target = self.path_of(digest);
        if self.is_known(digest) {
            return Ok(target);
        }
        match std::fs::create_dir(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Mounted by another process since we looked (or a leftover
                // empty mountpoint): adopt it rather than stack a second mount.
                if is_erofs_mount(&target)? {
                    self.set_mut().insert(*digest);
                    return Ok(target);
                }
                if crate::mountinfo::is_mount_point(&target).map_err(io_err("reading mountinfo for", &target))? {
                    return Err(MountError::Occupied { target });
                }
            }
            Err(e) => return Err(io_err("creating mountpoint", &target)(e)),
        }
        let result =
            erofs::check_image_file(blob).map_err(|source| MountError::CorruptBlob { path: blob.to_path_buf(), source }).and_then(|_| {
                mount(blob, &target, "erofs", MountFlags::RDONLY | MountFlags::NODEV | MountFlags::NOSUID, None)
                    .map_err(|e| MountError::Mount { digest: *digest, blob: blob.to_path_buf(), target: target.clone(), source: e.into() })
            });
        if let Err(e) = result {
            let _ = std::fs::remove_dir(&target);
            return Err(e);
        }
        self.set_mut().insert(*digest);
        Ok(target)
    }

    /// Mounts every layer of `image`; paths bottom first, like the manifest.
    /// (overlayfs wants `lowerdir=` topmost first: reverse them.)
    pub fn mount_image(&self, image: &ResolvedImage) -> Result<Vec<PathBuf>, MountError> {
        image.layers.iter().map(|l| self.mount(&l.digest, &l.path)).collect()
    }

    /// Detaches the mount of `digest` (lazily: sandboxes whose overlays use
    /// it keep working, the kernel frees it after the last one goes) and
    /// removes the mountpoint. Returns whether anything was mounted.
    pub fn unmount(&self, digest: &Digest) -> Result<bool, MountError> {
        let _change = self.change.lock().unwrap_or_else(|p| p.into_inner());
        self.set_mut().remove(digest);
        let target = self.path_of(digest);
        let mut unmounted = false;
        // Loop: two processes racing on one directory could have stacked
        // mounts; EINVAL means "not a mount point (any more)".
        for _ in 0..16 {
            match unmount(&target, UnmountFlags::DETACH) {
                Ok(()) => unmounted = true,
                Err(Errno::INVAL) | Err(Errno::NOENT) => break,
                Err(e) => return Err(MountError::Unmount { target, source: e.into() }),
            }
        }
        match std::fs::remove_dir(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("removing mountpoint", &target)(e)),
        }
        Ok(unmounted)
    }

    /// Layers mounted under `dir`, from the kernel's mount table (so it
    /// includes what an earlier process mounted).
    pub fn mounted(&self) -> Result<Vec<Digest>, MountError> {
        let entries = mountinfo::read().map_err(io_err("reading", Path::new("/proc/self/mountinfo")))?;
        let mut found: Vec<Digest> = entries
            .into_iter()
            .filter(|m| m.fs_type == "erofs" && m.mount_point.parent() == Some(self.dir.as_path()))
            .filter_map(|m| Digest::from_hex(m.mount_point.file_name()?.to_str()?).ok())
            .collect();
        found.sort();
        found.dedup();
        Ok(found)
    }

    /// Detaches every layer mounted from a blob file under `files` (the
    /// layers an earlier process mounted from its on-demand FUSE files:
    /// their data died with that process's FUSE server) and returns their
    /// digests. Sandboxes whose overlays use one keep a mount that fails
    /// reads of what is not in the page cache; new ones mount it afresh.
    pub fn unmount_backed_by(&self, files: &Path) -> Result<Vec<Digest>, MountError> {
        let entries = mountinfo::read().map_err(io_err("reading", Path::new("/proc/self/mountinfo")))?;
        let mut dead: Vec<Digest> = entries
            .into_iter()
            .filter(|m| m.fs_type == "erofs" && m.mount_point.parent() == Some(self.dir.as_path()))
            .filter(|m| Path::new(&m.source).starts_with(files))
            .filter_map(|m| Digest::from_hex(m.mount_point.file_name()?.to_str()?).ok())
            .collect();
        dead.sort();
        dead.dedup();
        for digest in &dead {
            self.unmount(digest)?;
        }
        Ok(dead)
    }

    /// Unmounts every layer not in `keep` (the reaper passes the layers of
    /// live sandboxes and of creations in flight). Returns what it unmounted.
    pub fn unmount_all_except(&self, keep: &HashSet<Digest>) -> Result<Vec<Digest>, MountError> {
        let mut removed = Vec::new();
        for digest in self.mounted()? {
            if !keep.contains(&digest) && self.unmount(&digest)? {
                removed.push(digest);
            }
        }
        Ok(removed)
    }

    /// Unmounts every layer, then detaches the mount at `dir` (the private
    /// bind `open` made): for decommissioning a node and for tests. Dropping
    /// a `LayerMounts` does not do this, on purpose: a restarted edge adopts
    /// the mounts.
    pub fn unmount_everything(&self) -> Result<(), MountError> {
        self.unmount_all_except(&HashSet::new())?;
        let _change = self.change.lock().unwrap_or_else(|p| p.into_inner());
        match unmount(&self.dir, UnmountFlags::DETACH) {
            Ok(()) | Err(Errno::INVAL) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(MountError::Unmount { target: self.dir.clone(), source: e.into() }),
        }
    }
}

/// Whether `path` is the root of an EROFS mount. Our `dir` is writable, so
/// it cannot itself be on EROFS: an EROFS statfs answer means a layer
/// mount sits exactly there.
fn is_erofs_mount(path: &Path) -> Result<bool, MountError> {
    let st = rustix::fs::statfs(path).map_err(|e| io_err("statfs", path)(e.into()))?;
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between architectures
    let f_type = st.f_type as u64;
    Ok(f_type == u64::from(EROFS_MAGIC))
}
