//! The directories a call could leave files in, their sweep after a call,
//! and the inotify watch that lets a call that created nothing there (most
//! calls) skip the sweep.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use rustix::fs::inotify::{self, CreateFlags, WatchFlags};

use super::{BASE, CALL_GID, CALL_UID};

/// Trees never searched for writable directories: the kernel's, and the
/// monitor's own (whose scratch is removed whole).
const SKIP_TREES: [&str; 4] = ["/proc", "/sys", "/dev/pts", BASE];

fn skipped(path: &str) -> bool {
    SKIP_TREES.iter().any(|t| path == *t || path.strip_prefix(t).is_some_and(|rest| rest.starts_with('/')))
}

/// Whether the call user could create entries in a directory of this
/// owner and mode.
fn call_user_can_write(uid: u32, gid: u32, mode: u32) -> bool {
    mode & 0o002 != 0 || uid == CALL_UID || (gid == CALL_GID && mode & 0o020 != 0)
}

/// Every directory the call user could create files in (found once, at
/// start; symbolic links are not followed).
pub fn writable_dirs() -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec!["/".to_string()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut subdirs = Vec::new();
        for e in entries.flatten() {
            let Some(name) = e.file_name().to_str().map(String::from) else { continue };
            let path = if dir == "/" { format!("/{name}") } else { format!("{dir}/{name}") };
            if skipped(&path) {
                continue;
            }
            let Ok(md) = std::fs::symlink_metadata(&path) else { continue };
            if !md.is_dir() {
                continue;
            }
            if call_user_can_write(md.uid(), md.gid(), md.mode()) {
                found.push(path.clone());
            }
            subdirs.push(path);
        }
        // Depth-first, in name order, so the list is stable.
        subdirs.sort_unstable_by(|a, b| b.cmp(a));
        todo.extend(subdirs);
    }
    found.sort();
    found
}

/// Removes every entry the call user owns in `dirs`; returns whether all
/// of them went. Directories go whole (remove_dir_all never follows a
/// symbolic link).
pub fn remove_owned(dirs: &[String]) -> bool {
    let mut complete = true;
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(d) else { continue };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(md) = std::fs::symlink_metadata(&path) else { continue };
            if md.uid() != CALL_UID {
                continue;
            }
            let r = if md.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            if let Err(e) = r {
                complete &= e.kind() == std::io::ErrorKind::NotFound;
            }
        }
    }
    complete
}

/// Tells whether a call created anything in the directories the sweep
/// looks at. An inotify event is queued by the system call that creates
/// the entry, before it returns, and every process of the call is dead
/// before we look, so an empty queue means nothing was created. Any doubt
/// (no inotify, a watch lost, events dropped, a sweep that could not remove
/// everything) means sweeping after every call from then on.
pub struct SweepWatch {
    fd: Option<OwnedFd>,
}

/// What makes a watch's directory gain an entry (create, mkdir, link,
/// mknod, bind a socket: IN_CREATE; rename into it: IN_MOVED_TO) or ends
/// the watch (the directory deleted or moved).
const WATCHED: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::DONT_FOLLOW);
/// Events after which the queue no longer tells everything.
const WATCH_LOST: u32 = libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_Q_OVERFLOW | libc::IN_IGNORED;
/// struct inotify_event without its name.
const EVENT_HEADER: usize = 16;

impl SweepWatch {
    pub fn new(dirs: &[String]) -> Self {
        let Ok(fd) = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC) else { return SweepWatch { fd: None } };
        for d in dirs {
            if inotify::add_watch(&fd, d.as_str(), WATCHED).is_err() {
                return SweepWatch { fd: None };
            }
        }
        SweepWatch { fd: Some(fd) }
    }

    pub fn give_up(&mut self) {
        self.fd = None;
    }

    /// Whether anything was created since the last call (drains the
    /// queue); always true once the watch is given up.
    pub fn changed(&mut self) -> bool {
        let Some(fd) = &self.fd else { return true };
        // On the stack: most calls find the queue empty, and this runs
        // once per call. A read returns whole events only, and this holds
        // the largest (a header and NAME_MAX + 1 bytes of name) many times.
        let mut buf = [0u8; 4096];
        let mut seen = false;
        loop {
            match rustix::io::read(fd.as_fd(), &mut buf) {
                Err(rustix::io::Errno::AGAIN) => return seen,
                Err(rustix::io::Errno::INTR) => continue,
                Ok(n) if n > 0 => {
                    seen = true;
                    if events_lose_the_watch(&buf[..n]) {
                        self.give_up();
                        return true;
                    }
                }
                _ => {
                    self.give_up();
                    return true;
                }
            }
        }
    }
}

/// Whether a read of inotify events holds one that ends a watch or says
/// events were dropped.
fn events_lose_the_watch(data: &[u8]) -> bool {
    let mut off = 0;
    while off + EVENT_HEADER <= data.len() {
        let word = |at: usize| u32::from_ne_bytes(data[off + at..off + at + 4].try_into().expect("4 bytes"));
        if word(4) & WATCH_LOST != 0 {
            return true;
        }
        off += EVENT_HEADER + word(12) as usize;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_trees_match_whole_components() {
        assert!(skipped("/proc") && skipped("/proc/1") && skipped("/dev/pts") && skipped(BASE));
        assert!(!skipped("/system") && !skipped("/procfs") && !skipped("/dev"));
    }

    #[test]
    fn who_can_write() {
        assert!(call_user_can_write(0, 0, 0o1777));
        assert!(call_user_can_write(CALL_UID, 0, 0o700));
        assert!(call_user_can_write(0, CALL_GID, 0o770));
        assert!(!call_user_can_write(0, CALL_GID, 0o750));
        assert!(!call_user_can_write(0, 0, 0o755));
    }

    #[test]
    fn finds_tmp_on_this_machine() {
        let dirs = writable_dirs();
        assert!(dirs.iter().any(|d| d == "/tmp"), "{dirs:?}");
        assert!(!dirs.iter().any(|d| d.starts_with("/proc/")));
    }

    #[test]
    fn lost_watch_events_are_recognised() {
        let event = |mask: u32, len: u32| {
            let mut e = vec![0u8; EVENT_HEADER];
            e[4..8].copy_from_slice(&mask.to_ne_bytes());
            e[12..16].copy_from_slice(&len.to_ne_bytes());
            e.extend(std::iter::repeat_n(0, len as usize));
            e
        };
        let mut created = event(libc::IN_CREATE, 16);
        assert!(!events_lose_the_watch(&created));
        created.extend(event(libc::IN_Q_OVERFLOW, 0));
        assert!(events_lose_the_watch(&created));
    }

    #[test]
    fn a_watch_sees_creation_and_drains() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap().to_string();
        let mut w = SweepWatch::new(std::slice::from_ref(&d));
        assert!(!w.changed());
        std::fs::write(format!("{d}/f"), b"x").unwrap();
        assert!(w.changed());
        assert!(!w.changed());
    }
}
