//! Small filesystem helpers shared by the store and the builders.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::mount::{unmount, UnmountFlags};

pub(crate) fn is_enospc(e: &io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
}

/// Makes a rename or unlink inside `dir` durable.
pub(crate) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes a directory tree that may contain mounts (a debootstrap target
/// keeps /proc and /sys mounted if it dies half way, and may bind the host's
/// /dev). Detaches every mount under it first, then deletes without ever
/// crossing into another filesystem, so a stray mount can never make us
/// delete the host's files.
pub(crate) fn remove_tree(root: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return std::fs::remove_file(root);
    }
    let canonical = root.canonicalize()?;
    for mount_point in crate::mountinfo::mounts_under(&canonical)? {
        match unmount(&mount_point, UnmountFlags::DETACH) {
            Ok(()) | Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    remove_same_fs(&canonical, meta.dev())
}

fn remove_same_fs(dir: &Path, dev: u64) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            if meta.dev() != dev {
                return Err(io::Error::other(format!("refusing to delete {}: it is on another filesystem", path.display())));
            }
            remove_same_fs(&path, dev)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    std::fs::remove_dir(dir)
}
