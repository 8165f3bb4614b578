//! Which files an operation changed: a walk of the sandbox's writable layer.
//!
//! The overlay's upper directory holds only what the sandbox changed, so
//! walking it is short, and an entry whose inode changed (ctime) since the
//! operation began was written, made, renamed or deleted by it (an overlay
//! whiteout, a 0/0 character device, marks a deletion). A directory is
//! reported only when nothing below it is: copying a file up also makes its
//! parent directories in the upper layer.
//!
//! The edge gives the start time from the coarse clock the kernel stamps
//! inodes with, so no change is missed; a change made by the previous
//! operation in the same clock tick would then look new too. The agent
//! remembers the ctime of every entry the last walk found new, and an entry
//! with that very ctime is not new again. (On kernels with multigrain
//! timestamps, tmpfs gives a fine-grained ctime to any change after the
//! walk looked at the inode, so a real second change never looks the same.)
//!
//! The agent opens the upper directory before pivot_root and keeps the
//! descriptor (close-on-exec, and the agent is not dumpable), because after
//! pivot_root no path inside the sandbox leads to it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use dsec_agent_proto::{AgentError, ChangedPath, ErrorKind, Reply};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::errors::os_err;

/// Entries looked at, at most, per walk: a bound on the time one walk takes
/// even if a sandbox fills its layer with millions of tiny files.
const MAX_VISITED: usize = 200_000;

/// Each entry's ctime, as one walk found it.
pub type Seen = HashMap<String, (i64, u32)>;

struct Walk<'a> {
    since: (i64, u32),
    max_paths: usize,
    visited: usize,
    paths: Vec<ChangedPath>,
    truncated: bool,
    /// What the previous walk found new (see the module comment).
    before: &'a Seen,
    now: Seen,
}

impl Walk<'_> {
    fn is_new(&mut self, path: &str, st: &rustix::fs::Stat) -> bool {
        // `as`: the field types differ between architectures.
        #[allow(clippy::unnecessary_cast)]
        let ctime = (st.st_ctime as i64, st.st_ctime_nsec as u32);
        if ctime < self.since {
            return false;
        }
        self.now.insert(path.to_string(), ctime);
        self.before.get(path) != Some(&ctime)
    }

    fn push(&mut self, path: String, deleted: bool) {
        if self.paths.len() >= self.max_paths {
            self.truncated = true;
        } else {
            self.paths.push(ChangedPath { path, deleted });
        }
    }

    /// Walks one directory; says whether anything below it was reported.
    fn dir(&mut self, dir: BorrowedFd<'_>, prefix: &str) -> bool {
        let Ok(fd) = rustix::fs::openat(dir, c".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()) else {
            return false;
        };
        let Ok(mut entries) = rustix::fs::Dir::read_from(&fd) else {
            return false;
        };
        let mut reported = false;
        while let Some(Ok(entry)) = entries.read() {
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            self.visited += 1;
            if self.visited > MAX_VISITED || self.truncated {
                self.truncated = true;
                return reported;
            }
            let Ok(st) = rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            let path = format!("{prefix}/{}", String::from_utf8_lossy(name.to_bytes()));
            let kind = FileType::from_raw_mode(st.st_mode);
            if kind == FileType::Directory {
                let below = match rustix::fs::openat(
                    &fd,
                    name,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(sub) => self.dir(sub.as_fd(), &path),
                    Err(_) => false,
                };
                if self.is_new(&path, &st) && !below {
                    self.push(path, false);
                    reported = true;
                }
                reported |= below;
            } else if self.is_new(&path, &st) {
                let whiteout = kind == FileType::CharacterDevice && st.st_rdev == 0;
                self.push(path, whiteout);
                reported = true;
            }
        }
        reported
    }
}

/// The walk of `upper` (None: the agent has no writable layer) for what
/// changed since the given time; `seen` is what the last walk found new,
/// replaced by what this one finds.
pub fn changed_since(
    upper: Option<&OwnedFd>,
    seen: &RefCell<Seen>,
    since_sec: i64,
    since_nsec: u32,
    max_paths: u32,
) -> Result<Reply, AgentError> {
    let Some(upper) = upper else {
        return Err(AgentError::new(ErrorKind::Unsupported, "this agent has no writable layer to watch"));
    };
    // Fail loudly if the layer itself is gone rather than report nothing.
    rustix::fs::fstat(upper).map_err(|e| os_err("the writable layer", e))?;
    let before = seen.take();
    let mut walk = Walk {
        since: (since_sec, since_nsec),
        max_paths: max_paths as usize,
        visited: 0,
        paths: Vec::new(),
        truncated: false,
        before: &before,
        now: Seen::new(),
    };
    walk.dir(upper.as_fd(), "");
    seen.replace(walk.now);
    Ok(Reply::Changed { paths: walk.paths, truncated: walk.truncated })
}

/// Opens the upper directory (before pivot_root) for later walks.
pub fn open_upper(path: &std::ffi::CStr) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> (i64, u32) {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut t) };
        (t.tv_sec, t.tv_nsec as u32)
    }

    #[test]
    fn reports_new_files_and_leaf_directories_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("old/keep")).unwrap();
        std::fs::write(d.join("old/keep/f"), b"x").unwrap();
        // Everything above was made before `since`.
        std::thread::sleep(std::time::Duration::from_millis(30));
        let since = now();
        std::fs::create_dir_all(d.join("new/deep")).unwrap();
        std::fs::write(d.join("new/deep/file"), b"y").unwrap();
        std::fs::create_dir(d.join("empty")).unwrap();
        let fd = open_upper(&std::ffi::CString::new(d.as_os_str().as_encoded_bytes()).unwrap()).unwrap();
        let none = Seen::new();
        let mut walk = Walk { since, max_paths: 100, visited: 0, paths: vec![], truncated: false, before: &none, now: Seen::new() };
        walk.dir(fd.as_fd(), "");
        let mut got: Vec<_> = walk.paths.iter().map(|p| p.path.as_str()).collect();
        got.sort();
        assert_eq!(got, vec!["/empty", "/new/deep/file"]);
        assert!(!walk.truncated);

        let mut small = Walk { since, max_paths: 1, visited: 0, paths: vec![], truncated: false, before: &none, now: Seen::new() };
        small.dir(fd.as_fd(), "");
        assert_eq!(small.paths.len(), 1);
        assert!(small.truncated);

        // A second walk from the same start does not report again what the
        // first found, unless it changed since.
        let seen = walk.now.clone();
        let mut again = Walk { since, max_paths: 100, visited: 0, paths: vec![], truncated: false, before: &seen, now: Seen::new() };
        again.dir(fd.as_fd(), "");
        assert!(again.paths.is_empty(), "{:?}", again.paths);
        std::thread::sleep(std::time::Duration::from_millis(30));
        std::fs::write(d.join("new/deep/file"), b"z").unwrap();
        let mut third = Walk { since, max_paths: 100, visited: 0, paths: vec![], truncated: false, before: &again.now, now: Seen::new() };
        third.dir(fd.as_fd(), "");
        assert_eq!(third.paths.iter().map(|p| p.path.as_str()).collect::<Vec<_>>(), vec!["/new/deep/file"]);
    }
}
