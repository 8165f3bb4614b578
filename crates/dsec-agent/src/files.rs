//! File operations on the sandbox's filesystem, every path confined to the
//! agent's root (see paths.rs).
//!
//! Regular-file I/O is done with plain blocking system calls: the sandbox's
//! files live on tmpfs/overlay (or a VM's local disk), where a read or write
//! of one chunk takes microseconds, and the agent has no threads to hand it
//! to anyway.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;

use dsec_agent_proto::{AgentError, ErrorKind, FileKind, FileStat, Reply, Stream, WriteFileSpec, MAX_CHUNK_BYTES};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::agent::Agent;
use crate::errors::{invalid, os_err};
use crate::paths::{Root, SandboxPath};
use crate::request::ReqCtx;
use crate::users;

pub fn kind_of(mode: u32) -> FileKind {
    match FileType::from_raw_mode(mode) {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Dir,
        FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

fn to_stat(name: &str, st: &Stat, link_target: Option<String>) -> FileStat {
    FileStat {
        name: name.to_string(),
        kind: kind_of(st.st_mode),
        size: st.st_size as u64,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime: st.st_mtime,
        link_target,
    }
}

fn stat_entry(dir: BorrowedFd<'_>, name: &str, shown: &str) -> Result<FileStat, Errno> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    let target = if kind_of(st.st_mode) == FileKind::Symlink {
        rustix::fs::readlinkat(dir, name, Vec::new()).ok().map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    Ok(to_stat(shown, &st, target))
}

/// lstat semantics: a symlink is reported as one, with its target.
pub fn stat(agent: &Agent, path: &str) -> Result<Reply, AgentError> {
    let p = SandboxPath::parse(path)?;
    if p.is_root() {
        let st = rustix::fs::fstat(agent.root.fd()).map_err(|e| os_err("/", e))?;
        return Ok(Reply::Stat(to_stat("/", &st, None)));
    }
    let (dir, name) = agent.root.open_parent(&p)?;
    let st = stat_entry(dir.as_fd(), name, name).map_err(|e| os_err(p.display(), e))?;
    Ok(Reply::Stat(st))
}

/// Entries sorted by name, without `.` and `..`.
pub fn list_dir(agent: &Agent, path: &str) -> Result<Reply, AgentError> {
    let p = SandboxPath::parse(path)?;
    let fd = agent.root.open_at(&p, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).map_err(|e| os_err(p.display(), e))?;
    let mut dir = rustix::fs::Dir::new(fd).map_err(|e| os_err(p.display(), e))?;
    let mut names = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(|e| os_err(p.display(), e))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push(String::from_utf8_lossy(name).into_owned());
    }
    names.sort();
    let dfd = dir.fd().map_err(|e| os_err(p.display(), e))?;
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        match stat_entry(dfd, &name, &name) {
            Ok(st) => out.push(st),
            // Removed while we listed: not an error.
            Err(Errno::NOENT) => {}
            Err(e) => return Err(os_err(p.join(&name).display(), e)),
        }
    }
    Ok(Reply::Dir(out))
}

/// mkdir -p: every missing component is created; existing directories
/// (or symlinks to directories inside the root) are fine.
pub fn mkdir_all(root: &Root, p: &SandboxPath, mode: u32) -> Result<(), AgentError> {
    for prefix in p.prefixes() {
        let (dir, name) = root.open_parent(&prefix)?;
        match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(os_err(prefix.display(), e)),
        }
    }
    // Whatever exists there must now be a directory.
    root.open_dir(p).map(drop)
}

pub fn mkdir(agent: &Agent, path: &str, parents: bool, mode: u32) -> Result<Reply, AgentError> {
    let p = SandboxPath::parse(path)?;
    let mode = mode & 0o7777;
    if parents {
        if let Some((parent, _)) = p.split() {
            mkdir_all(&agent.root, &parent, 0o755)?;
        }
        mkdir_all(&agent.root, &p, mode)?;
        return Ok(Reply::Done);
    }
    let (dir, name) = agent.root.open_parent(&p)?;
    rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(mode)).map_err(|e| os_err(p.display(), e))?;
    Ok(Reply::Done)
}

pub fn remove(agent: &Agent, path: &str, recursive: bool) -> Result<Reply, AgentError> {
    let p = SandboxPath::parse(path)?;
    let (dir, name) = agent.root.open_parent(&p)?;
    let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| os_err(p.display(), e))?;
    let res = if kind_of(st.st_mode) == FileKind::Dir {
        if recursive {
            remove_tree(dir.as_fd(), name.as_bytes())
        } else {
            rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR)
        }
    } else {
        rustix::fs::unlinkat(&dir, name, AtFlags::empty())
    };
    res.map_err(|e| os_err(p.display(), e))?;
    Ok(Reply::Done)
}

/// rm -r of `name` in `parent`, never following symlinks (O_NOFOLLOW on
/// every directory opened, so a link planted inside cannot redirect us).
pub fn remove_tree(parent: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
    let fd = rustix::fs::openat(parent, name, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    for (n, is_dir) in dir_entries(fd.as_fd())? {
        if is_dir {
            remove_tree(fd.as_fd(), &n)?;
        } else {
            match rustix::fs::unlinkat(&fd, n.as_slice(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)
}

/// The names in `dir` (as bytes: a name need not be UTF-8) and whether each
/// is a directory (a symlink to one is not).
pub fn dir_entries(dir: BorrowedFd<'_>) -> Result<Vec<(Vec<u8>, bool)>, Errno> {
    let mut d = rustix::fs::Dir::read_from(dir)?;
    let mut out = Vec::new();
    while let Some(entry) = d.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            FileType::Unknown => {
                let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
                FileType::from_raw_mode(st.st_mode) == FileType::Directory
            }
            _ => false,
        };
        out.push((name.to_vec(), is_dir));
    }
    Ok(out)
}

/// Streams a regular file's content (from `offset`, at most `limit` bytes).
pub async fn read_file(agent: &Agent, ctx: &Rc<ReqCtx>, path: &str, offset: u64, limit: Option<u64>) -> Result<Reply, AgentError> {
    let p = SandboxPath::parse(path)?;
    let fd = agent.root.open_at(&p, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()).map_err(|e| os_err(p.display(), e))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| os_err(p.display(), e))?;
    match kind_of(st.st_mode) {
        FileKind::File => {}
        FileKind::Dir => return Err(AgentError::new(ErrorKind::IsADirectory, format!("{}: is a directory", p.display()))),
        _ => return Err(invalid(format!("{}: not a regular file", p.display()))),
    }
    let end = limit.map_or(u64::MAX, |l| offset.saturating_add(l));
    let mut pos = offset;
    let mut buf = vec![0u8; MAX_CHUNK_BYTES];
    while pos < end {
        if let Some(e) = ctx.abort_error() {
            return Err(e);
        }
        let want = ctx.sendable().min((end - pos).min(MAX_CHUNK_BYTES as u64) as usize);
        if want == 0 {
            ctx.changed().await;
            continue;
        }
        let n = match rustix::io::pread(&fd, &mut buf[..want], pos) {
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(os_err(p.display(), e)),
        };
        if n == 0 {
            break;
        }
        ctx.send_data(Stream::Content, &buf[..n]);
        pos += n as u64;
        // Let other requests (and the edge's credit) in between chunks.
        tokio::task::yield_now().await;
    }
    Ok(Reply::Done)
}

/// A file being written under a temporary name; removed unless committed.
struct TempFile {
    dir: OwnedFd,
    name: String,
    armed: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.armed {
            let _ = rustix::fs::unlinkat(&self.dir, self.name.as_str(), AtFlags::empty());
        }
    }
}

/// An appended file restored (or removed, if we created it) on failure.
struct AppendGuard<'a> {
    fd: &'a OwnedFd,
    orig_len: u64,
    created: Option<(OwnedFd, String)>,
    armed: bool,
}

impl Drop for AppendGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        match &self.created {
            Some((dir, name)) => {
                let _ = rustix::fs::unlinkat(dir, name.as_str(), AtFlags::empty());
            }
            None => {
                let _ = rustix::fs::ftruncate(self.fd, self.orig_len);
            }
        }
    }
}

/// A name for a temporary entry, unique on this host: `.dsec-{what}-…`.
pub fn temp_name(what: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!(".dsec-{what}-{}-{n}-{t:08x}", std::process::id())
}

fn write_all(fd: &OwnedFd, mut data: &[u8], what: &str) -> Result<(), AgentError> {
    while !data.is_empty() {
        match rustix::io::write(fd, data) {
            Ok(0) => return Err(os_err(what, Errno::NOSPC)),
            Ok(n) => data = &data[n..],
            Err(Errno::INTR) => {}
            Err(e) => return Err(os_err(what, e)),
        }
    }
    Ok(())
}

/// Receives the upload's Data frames until Eof, writing each as it comes
/// (memory stays at one frame whatever the file size).
async fn receive(ctx: &Rc<ReqCtx>, fd: &OwnedFd, max_bytes: u64, what: &str) -> Result<u64, AgentError> {
    let mut total = 0u64;
    loop {
        if let Some(e) = ctx.abort_error() {
            return Err(e);
        }
        if let Some(chunk) = ctx.take_input() {
            total += chunk.len() as u64;
            if total > max_bytes {
                return Err(AgentError::new(ErrorKind::TooLarge, format!("{what}: larger than the limit of {max_bytes} bytes")));
            }
            write_all(fd, &chunk, what)?;
            ctx.consumed(chunk.len());
            continue;
        }
        if ctx.eof() {
            return Ok(total);
        }
        ctx.changed().await;
    }
}

pub async fn write_file(agent: &Agent, ctx: &Rc<ReqCtx>, spec: WriteFileSpec) -> Result<Reply, AgentError> {
    let p = SandboxPath::parse(&spec.path)?;
    let what = p.display();
    let owner = spec.owner.as_deref().map(|o| users::lookup(&agent.root, o)).transpose()?;
    if spec.create_parents {
        if let Some((parent, _)) = p.split() {
            mkdir_all(&agent.root, &parent, 0o755)?;
        }
    }
    let (dir, name) = agent.root.open_parent(&p)?;
    let mode = Mode::from_raw_mode(spec.mode & 0o7777);

    if spec.append {
        let (fd, created) = match agent.root.open_at(&p, OFlags::WRONLY | OFlags::APPEND, Mode::empty()) {
            Ok(fd) => (fd, None),
            Err(Errno::NOENT) => {
                let fd =
                    rustix::fs::openat(&dir, name, OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC, mode)
                        .map_err(|e| os_err(&what, e))?;
                let dir2 = rustix::io::dup(&dir).map_err(|e| os_err(&what, e))?;
                (fd, Some((dir2, name.to_string())))
            }
            Err(e) => return Err(os_err(&what, e)),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| os_err(&what, e))?;
        if kind_of(st.st_mode) != FileKind::File {
            return Err(invalid(format!("{what}: not a regular file")));
        }
        let mut guard = AppendGuard { fd: &fd, orig_len: st.st_size as u64, created, armed: true };
        if guard.created.is_some() {
            set_meta(&fd, mode, owner.as_ref(), &what)?;
        }
        let bytes = receive(ctx, &fd, spec.max_bytes, &what).await?;
        guard.armed = false;
        return Ok(Reply::Written { bytes });
    }

    let tmp = temp_name("upload");
    let fd = rustix::fs::openat(&dir, tmp.as_str(), OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC, mode)
        .map_err(|e| os_err(&what, e))?;
    let mut guard = TempFile { dir, name: tmp, armed: true };
    set_meta(&fd, mode, owner.as_ref(), &what)?;
    let bytes = receive(ctx, &fd, spec.max_bytes, &what).await?;
    drop(fd);
    rustix::fs::renameat(&guard.dir, guard.name.as_str(), &guard.dir, name).map_err(|e| os_err(&what, e))?;
    guard.armed = false;
    Ok(Reply::Written { bytes })
}

/// Owner first, then mode: chown clears setuid/setgid bits.
fn set_meta(fd: &OwnedFd, mode: Mode, owner: Option<&users::User>, what: &str) -> Result<(), AgentError> {
    if let Some(u) = owner {
        rustix::fs::fchown(fd, Some(rustix::fs::Uid::from_raw(u.uid)), Some(rustix::fs::Gid::from_raw(u.gid)))
            .map_err(|e| os_err(what, e))?;
    }
    rustix::fs::fchmod(fd, mode).map_err(|e| os_err(what, e))
}
