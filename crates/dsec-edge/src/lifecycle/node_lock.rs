//! One edge per node name on a host.
//!
//! Two edges with one node name would share a cgroup parent and reap each
//! other's sandboxes, so each holds an exclusive `flock` on
//! `/run/dsec/node-<name>.lock` for its life. A graceful shutdown removes
//! its file; an edge that was killed cannot, so every edge also removes, at
//! start, the files no running edge holds. A file is only ever removed by
//! a process holding its lock, and a locker checks that the file it locked
//! is still the one at the path, so removal never lets two edges in.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::EdgeError;

/// Where the locks live: a tmpfs, so a reboot clears them.
pub(crate) const LOCK_DIR: &str = "/run/dsec";

/// How often a lock held for a moment (by another edge's sweep) is tried
/// again before the name counts as taken.
const TRIES: u32 = 5;

pub(crate) fn path(dir: &Path, node: &str) -> PathBuf {
    dir.join(format!("node-{node}.lock"))
}

/// A node's lock, held for an edge's life (released when dropped).
#[derive(Debug)]
pub(crate) struct NodeLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl NodeLock {
    /// Removes the lock's file at a graceful shutdown: still locked by us,
    /// so no other edge holds it, and a host that saw many short-lived
    /// edges (tests) keeps no litter.
    pub(crate) fn remove_file(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Takes `node`'s lock in `dir`, or says that another edge holds it.
pub(crate) fn lock(dir: &Path, node: &str) -> Result<NodeLock, EdgeError> {
    let path = path(dir, node);
    std::fs::create_dir_all(dir).map_err(EdgeError::io("creating", dir))?;
    for attempt in 1..=TRIES {
        let f =
            std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(EdgeError::io("opening", &path))?;
        if !try_flock(&f) {
            if attempt == TRIES {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        }
        // Another edge's sweep may have removed the file between our open
        // and our lock: a lock on a removed file guards nothing.
        if same_file(&f, &path) {
            return Ok(NodeLock { _file: f, path });
        }
    }
    Err(EdgeError::Invalid(format!("node name {node:?} is already used by another edge on this host; give this one another name (--node)")))
}

/// Removes the lock files in `dir` that no running edge holds (left by
/// edges that were killed), except `own`'s. Best effort.
pub(crate) fn sweep_stale(dir: &Path, own: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let own = path(dir, own);
    for entry in entries.flatten() {
        let p = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if p == own || !name.starts_with("node-") || !name.ends_with(".lock") {
            continue;
        }
        let Ok(f) = std::fs::OpenOptions::new().write(true).open(&p) else { continue };
        // Held by a running edge: its file. Otherwise nobody's, and removed
        // while we hold it, so no edge can be holding it as we do.
        if try_flock(&f) && same_file(&f, &p) {
            let _ = std::fs::remove_file(&p);
        }
    }
}

fn try_flock(f: &std::fs::File) -> bool {
    // SAFETY: flock on an fd we own.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

fn same_file(f: &std::fs::File, path: &Path) -> bool {
    match (f.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_edge_of_one_name_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let _first = lock(t.path(), "n1").unwrap();
        let err = lock(t.path(), "n1").unwrap_err();
        assert!(err.to_string().contains("already used"), "{err}");
        let _other = lock(t.path(), "n2").expect("another name is free");
    }

    #[test]
    fn files_of_killed_edges_are_swept_and_held_ones_kept() {
        let t = tempfile::tempdir().unwrap();
        let held = lock(t.path(), "alive").unwrap();
        // A killed edge's file: it exists, and nobody holds its lock.
        std::fs::write(path(t.path(), "dead"), b"").unwrap();
        std::fs::write(t.path().join("unrelated"), b"").unwrap();
        let own = lock(t.path(), "me").unwrap();
        sweep_stale(t.path(), "me");
        assert!(!path(t.path(), "dead").exists(), "a stale lock file stays");
        assert!(path(t.path(), "alive").exists(), "a held lock file was removed");
        assert!(path(t.path(), "me").exists(), "our own lock file was removed");
        assert!(t.path().join("unrelated").exists());
        // The dead name is free again, and the live one still refused.
        let _again = lock(t.path(), "dead").unwrap();
        assert!(lock(t.path(), "alive").is_err());
        drop((held, own));
    }
}
