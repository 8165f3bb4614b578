//! An archive is extracted into a staging directory, and moved into its
//! target only once the whole archive has been read and written. A failure
//! before that (the upload over its size limit, a truncated or malformed
//! archive, an entry that cannot be written, the call aborted) removes the
//! staging tree: the target is left exactly as it was, and so is everything
//! around it. An upload that fails changes nothing.
//!
//! Where the staging directory lives, so that moving it is a rename on one
//! filesystem:
//! - a target that does not exist yet is staged in its nearest existing
//!   ancestor. The commit creates the missing directories between them and
//!   renames the staging directory to the target's name: it appears whole.
//! - an existing target is staged inside itself. The commit renames each
//!   staged entry over the target's (files, links and fifos replace what was
//!   there, as tar does), merges directories present on both sides, and
//!   copies an entry whose destination is on another filesystem (a mount
//!   inside the target).

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use dsec_agent_proto::{AgentError, ErrorKind};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Timestamps};
use rustix::io::Errno;

use crate::errors::{io_err, os_err};
use crate::files::{dir_entries, remove_tree, temp_name};
use crate::paths::{Root, SandboxPath};

pub struct Staging {
    /// The directory holding the staging directory.
    holder: OwnedFd,
    name: String,
    /// Directories between `holder` and the target that do not exist yet,
    /// the target's own name last; empty when the target exists (it is then
    /// `holder` itself).
    missing: Vec<String>,
    target: String,
    committed: bool,
}

impl Staging {
    /// Creates the staging directory for extracting into `target`.
    pub fn create(root: &Root, target: &SandboxPath) -> Result<Self, AgentError> {
        let mut missing = Vec::new();
        let mut at = target.clone();
        let holder = loop {
            match root.open_at(&at, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()) {
                Ok(fd) => break fd,
                Err(Errno::NOENT) => {
                    // The root always exists, so a missing path has a parent.
                    let Some((parent, name)) = at.split() else { return Err(os_err(at.display(), Errno::NOENT)) };
                    missing.push(name.to_string());
                    at = parent;
                }
                Err(e) => return Err(os_err(at.display(), e)),
            }
        };
        missing.reverse();
        let name = temp_name("extract");
        rustix::fs::mkdirat(&holder, name.as_str(), Mode::from_raw_mode(0o755)).map_err(|e| os_err(at.display(), e))?;
        Ok(Staging { holder, name, missing, target: target.display(), committed: false })
    }

    /// The staging directory, for the extractor to write into.
    pub fn dir(&self) -> Result<OwnedFd, AgentError> {
        open_dir(self.holder.as_fd(), &self.name, OFlags::PATH).map_err(|e| os_err(&self.target, e))
    }

    /// Moves the staged tree into the target. `explicit_dirs` are the
    /// directories the archive itself listed (relative, `/`-joined): an
    /// existing directory takes their owner and mode, as tar does; one the
    /// archive only implied keeps its own.
    pub fn commit(mut self, explicit_dirs: &HashSet<Vec<u8>>) -> Result<(), AgentError> {
        let staged = open_dir(self.holder.as_fd(), &self.name, OFlags::RDONLY).map_err(|e| os_err(&self.target, e))?;
        let Some((last, between)) = self.missing.split_last() else {
            check(staged.as_fd(), self.holder.as_fd(), &mut Vec::new(), &self.target)?;
            return merge(staged.as_fd(), self.holder.as_fd(), &mut Vec::new(), explicit_dirs, &self.target);
        };
        let mut parent = rustix::io::dup(&self.holder).map_err(|e| os_err("dup", e))?;
        for name in between {
            match rustix::fs::mkdirat(&parent, name.as_str(), Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(os_err(&self.target, e)),
            }
            parent = open_dir(parent.as_fd(), name, OFlags::PATH).map_err(|e| os_err(&self.target, e))?;
        }
        match rustix::fs::renameat_with(&self.holder, self.name.as_str(), &parent, last.as_str(), RenameFlags::NOREPLACE) {
            Ok(()) => {
                self.committed = true;
                Ok(())
            }
            // Someone made the target meanwhile: merge into it instead.
            Err(Errno::EXIST) => {
                let target = open_dir(parent.as_fd(), last, OFlags::PATH).map_err(|e| os_err(&self.target, e))?;
                check(staged.as_fd(), target.as_fd(), &mut Vec::new(), &self.target)?;
                merge(staged.as_fd(), target.as_fd(), &mut Vec::new(), explicit_dirs, &self.target)
            }
            Err(e) => Err(os_err(&self.target, e)),
        }
    }
}

impl Drop for Staging {
    /// Whatever is still staged goes: all of it after a failure, the
    /// emptied directory after a merge.
    fn drop(&mut self) {
        if !self.committed {
            let _ = remove_tree(self.holder.as_fd(), self.name.as_bytes());
        }
    }
}

/// One directory component, never a symlink (the name is a single entry).
fn open_dir(parent: BorrowedFd<'_>, name: impl rustix::path::Arg, how: OFlags) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(parent, name, how | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
}

/// Finds, before anything moves, what would stop a merge of `src` into
/// `dst` halfway: a directory where the archive has a file, or the reverse.
fn check(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, rel: &mut Vec<Vec<u8>>, target: &str) -> Result<(), AgentError> {
    for (name, is_dir) in dir_entries(src).map_err(|e| os_err(shown(target, rel, b""), e))? {
        let name = name.as_slice();
        let there = match rustix::fs::statat(dst, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => FileType::from_raw_mode(st.st_mode),
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(os_err(shown(target, rel, name), e)),
        };
        match (is_dir, there == FileType::Directory) {
            (true, true) => {
                let staged = open_dir(src, name, OFlags::RDONLY).map_err(|e| os_err(shown(target, rel, name), e))?;
                let existing = open_dir(dst, name, OFlags::PATH).map_err(|e| os_err(shown(target, rel, name), e))?;
                rel.push(name.to_vec());
                let checked = check(staged.as_fd(), existing.as_fd(), rel, target);
                rel.pop();
                checked?;
            }
            (true, false) => return Err(in_the_way(ErrorKind::NotADirectory, "a file is in the way of a directory", target, rel, name)),
            (false, true) => return Err(in_the_way(ErrorKind::IsADirectory, "a directory is in the way", target, rel, name)),
            (false, false) => {}
        }
    }
    Ok(())
}

fn in_the_way(kind: ErrorKind, what: &str, target: &str, rel: &[Vec<u8>], name: &[u8]) -> AgentError {
    AgentError::new(kind, format!("{}: {what}", shown(target, rel, name)))
}

/// Moves every entry of `src` into `dst` (after [`check`]); `rel` is `src`'s path in the
/// archive (components), for `explicit_dirs` and messages.
fn merge(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    rel: &mut Vec<Vec<u8>>,
    explicit_dirs: &HashSet<Vec<u8>>,
    target: &str,
) -> Result<(), AgentError> {
    for (name, is_dir) in dir_entries(src).map_err(|e| os_err(shown(target, rel, b""), e))? {
        let name = name.as_slice();
        if is_dir {
            match open_dir(dst, name, OFlags::RDONLY) {
                Ok(existing) => {
                    let staged = open_dir(src, name, OFlags::RDONLY).map_err(|e| os_err(shown(target, rel, name), e))?;
                    rel.push(name.to_vec());
                    merge(staged.as_fd(), existing.as_fd(), rel, explicit_dirs, target)?;
                    if explicit_dirs.contains(&rel.join(&b'/')) {
                        copy_owner_and_mode(&staged, &existing).map_err(|e| os_err(shown(target, rel, b""), e))?;
                    }
                    rel.pop();
                    let _ = rustix::fs::unlinkat(src, name, AtFlags::REMOVEDIR);
                    continue;
                }
                Err(Errno::NOENT) => {}
                Err(Errno::NOTDIR | Errno::LOOP) => {
                    return Err(in_the_way(ErrorKind::NotADirectory, "a file is in the way of a directory", target, rel, name))
                }
                Err(e) => return Err(os_err(shown(target, rel, name), e)),
            }
        }
        match rustix::fs::renameat(src, name, dst, name) {
            Ok(()) => {}
            Err(Errno::XDEV) => copy_entry(src, dst, name, rel, explicit_dirs, target).map_err(|e| e.context(shown(target, rel, name)))?,
            Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => {
                return Err(in_the_way(ErrorKind::IsADirectory, "a directory is in the way", target, rel, name))
            }
            Err(e) => return Err(os_err(shown(target, rel, name), e)),
        }
    }
    Ok(())
}

/// `target/rel/name` for messages.
fn shown(target: &str, rel: &[Vec<u8>], name: &[u8]) -> String {
    let mut s = target.trim_end_matches('/').to_string();
    for c in rel.iter().map(Vec::as_slice).chain([name]).filter(|c| !c.is_empty()) {
        s.push('/');
        s.push_str(&String::from_utf8_lossy(c));
    }
    s
}

/// An error while copying across filesystems, its path added by the caller.
enum CopyError {
    Os(Errno),
    Io(std::io::Error),
    Agent(AgentError),
}

impl CopyError {
    fn context(self, what: String) -> AgentError {
        match self {
            CopyError::Os(e) => os_err(what, e),
            CopyError::Io(e) => io_err(what, e),
            CopyError::Agent(e) => e,
        }
    }
}

impl From<Errno> for CopyError {
    fn from(e: Errno) -> Self {
        CopyError::Os(e)
    }
}

/// Copies `name` from `src` to `dst` where a rename cannot cross filesystems.
fn copy_entry(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    name: &[u8],
    rel: &mut Vec<Vec<u8>>,
    explicit_dirs: &HashSet<Vec<u8>>,
    target: &str,
) -> Result<(), CopyError> {
    let st = rustix::fs::statat(src, name, AtFlags::SYMLINK_NOFOLLOW)?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => {
            rustix::fs::mkdirat(dst, name, Mode::from_raw_mode(st.st_mode & 0o7777))?;
            let from = open_dir(src, name, OFlags::RDONLY)?;
            let to = open_dir(dst, name, OFlags::RDONLY)?;
            rel.push(name.to_vec());
            let merged = merge(from.as_fd(), to.as_fd(), rel, explicit_dirs, target);
            rel.pop();
            merged.map_err(CopyError::Agent)?;
            copy_owner_and_mode(&from, &to)?;
        }
        FileType::RegularFile => {
            let tmp = temp_name("extract");
            let out = rustix::fs::openat(
                dst,
                tmp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )?;
            let copied = (|| -> Result<(), CopyError> {
                let input = rustix::fs::openat(src, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
                std::io::copy(&mut File::from(input), &mut File::from(rustix::io::dup(&out)?)).map_err(CopyError::Io)?;
                let _ = rustix::fs::fchown(&out, Some(rustix::fs::Uid::from_raw(st.st_uid)), Some(rustix::fs::Gid::from_raw(st.st_gid)));
                rustix::fs::fchmod(&out, Mode::from_raw_mode(st.st_mode & 0o7777))?;
                let _ =
                    rustix::fs::futimens(&out, &Timestamps { last_access: st_time(st.st_atime), last_modification: st_time(st.st_mtime) });
                rustix::fs::renameat(dst, tmp.as_str(), dst, name)?;
                Ok(())
            })();
            if copied.is_err() {
                let _ = rustix::fs::unlinkat(dst, tmp.as_str(), AtFlags::empty());
            }
            copied?;
        }
        FileType::Symlink => {
            let link = rustix::fs::readlinkat(src, name, Vec::new())?;
            unlink_non_dir(dst, name)?;
            rustix::fs::symlinkat(link.as_c_str(), dst, name)?;
            let _ = rustix::fs::chownat(
                dst,
                name,
                Some(rustix::fs::Uid::from_raw(st.st_uid)),
                Some(rustix::fs::Gid::from_raw(st.st_gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            );
        }
        FileType::Fifo => {
            unlink_non_dir(dst, name)?;
            rustix::fs::mknodat(dst, name, FileType::Fifo, Mode::from_raw_mode(st.st_mode & 0o7777), 0)?;
        }
        // The extractor makes nothing else.
        _ => {}
    }
    Ok(())
}

fn unlink_non_dir(dir: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

fn st_time(secs: i64) -> rustix::fs::Timespec {
    rustix::fs::Timespec { tv_sec: secs, tv_nsec: 0 }
}

/// Owner first (best effort: a non-root agent cannot chown), then mode.
fn copy_owner_and_mode(from: &OwnedFd, to: &OwnedFd) -> Result<(), Errno> {
    let st = rustix::fs::fstat(from)?;
    let _ = rustix::fs::fchown(to, Some(rustix::fs::Uid::from_raw(st.st_uid)), Some(rustix::fs::Gid::from_raw(st.st_gid)));
    rustix::fs::fchmod(to, Mode::from_raw_mode(st.st_mode & 0o7777))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::super::extract::Extractor;
    use super::super::format::{encode_header, EntryMeta, BLOCK};
    use super::*;

    fn entry(name: &str, kind: u8, mode: u32, content: &[u8]) -> Vec<u8> {
        let m =
            EntryMeta { name: name.into(), kind, mode, uid: 0, gid: 0, size: content.len() as u64, mtime: 0, link: vec![], dev: (0, 0) };
        let mut out = encode_header(&m);
        out.extend(content);
        out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
        out
    }

    /// Extracts `archive` (cut after `cut` bytes, if given) into `target`
    /// under the temp root, the way `extract` does.
    fn extract_into(root: &Path, target: &str, archive: &[u8], cut: Option<usize>) -> Result<(), AgentError> {
        let root = Root::open(root.to_str().unwrap()).unwrap();
        let staging = Staging::create(&root, &SandboxPath::parse(target)?)?;
        let mut ex = Extractor::new(staging.dir()?);
        ex.feed(&archive[..cut.unwrap_or(archive.len())])?;
        ex.finish()?;
        let dirs = ex.explicit_dirs().clone();
        drop(ex);
        staging.commit(&dirs)
    }

    fn tree(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                if p.is_dir() {
                    stack.push(p);
                    out.push(format!("{rel}/"));
                } else {
                    out.push(format!("{rel}={}", std::fs::read_to_string(&p).unwrap_or_default()));
                }
            }
        }
        out.sort();
        out
    }

    fn archive() -> Vec<u8> {
        [entry("sub/", b'5', 0o700, b""), entry("sub/a", b'0', 0o644, b"new a"), entry("b", b'0', 0o644, b"new b")].concat()
    }

    #[test]
    fn a_new_target_appears_whole_with_its_missing_parents() {
        let root = tempfile::tempdir().unwrap();
        extract_into(root.path(), "/x/y/t", &archive(), None).unwrap();
        assert_eq!(tree(root.path()), ["x/", "x/y/", "x/y/t/", "x/y/t/b=new b", "x/y/t/sub/", "x/y/t/sub/a=new a"]);
    }

    #[test]
    fn a_failed_extraction_into_a_new_target_leaves_nothing() {
        let root = tempfile::tempdir().unwrap();
        // Cut in the middle of the last file's content.
        let a = archive();
        assert!(extract_into(root.path(), "/x/y/t", &a, Some(a.len() - BLOCK + 2)).is_err());
        assert_eq!(tree(root.path()), Vec::<String>::new());
    }

    #[test]
    fn an_existing_target_is_merged_and_a_failure_leaves_it_as_it_was() {
        let root = tempfile::tempdir().unwrap();
        let t = root.path().join("t");
        std::fs::create_dir_all(t.join("sub")).unwrap();
        std::fs::create_dir_all(t.join("implied")).unwrap();
        std::fs::set_permissions(t.join("implied"), std::fs::Permissions::from_mode(0o711)).unwrap();
        std::fs::write(t.join("b"), "old b").unwrap();
        std::fs::write(t.join("sub/keep"), "kept").unwrap();
        let before = tree(root.path());

        let mut a = archive();
        a.extend(entry("implied/c", b'0', 0o644, b"c"));
        assert!(extract_into(root.path(), "/t", &a, Some(a.len() - 3)).is_err());
        assert_eq!(tree(root.path()), before, "a failed extraction changed the target");

        extract_into(root.path(), "/t", &a, None).unwrap();
        assert_eq!(tree(root.path()), ["t/", "t/b=new b", "t/implied/", "t/implied/c=c", "t/sub/", "t/sub/a=new a", "t/sub/keep=kept"]);
        // A directory the archive lists takes its mode; one it only implies keeps its own.
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&t.join("sub")), 0o700);
        assert_eq!(mode(&t.join("implied")), 0o711);
    }

    #[test]
    fn a_directory_in_the_way_of_a_file_is_a_clear_error() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("t/b/inner")).unwrap();
        let err = extract_into(root.path(), "/t", &archive(), None).unwrap_err();
        assert_eq!(err.kind, ErrorKind::IsADirectory, "{err:?}");
        assert!(err.message.contains("/t/b"), "{err:?}");
        // Nothing moved (the conflict is found before anything does), and
        // the staging directory is gone.
        assert_eq!(tree(root.path()), ["t/", "t/b/", "t/b/inner/"]);
        // The reverse: a file where the archive has a directory.
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("t")).unwrap();
        std::fs::write(root.path().join("t/sub"), "file").unwrap();
        let err = extract_into(root.path(), "/t", &archive(), None).unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotADirectory, "{err:?}");
        assert_eq!(tree(root.path()), ["t/", "t/sub=file"]);
    }
}
