//! TarExtract: a push parser fed the Data frames as they come, creating
//! entries under the target directory and never outside it.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::rc::Rc;

use dsec_agent_proto::{AgentError, ErrorKind, Reply};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Timestamps};
use rustix::io::Errno;

use super::format::{bad, cstr_field, parse_num, BLOCK};
use super::staging::Staging;
use crate::agent::Agent;
use crate::errors::os_err;
use crate::paths::SandboxPath;
use crate::request::ReqCtx;

/// Attributes from PAX or GNU headers that apply to the next entry.
#[derive(Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    uid: Option<u32>,
    gid: Option<u32>,
    mtime: Option<i64>,
}

enum State {
    Header,
    /// Content of a regular file being extracted.
    File {
        fd: OwnedFd,
        remaining: u64,
        pad: u64,
        meta: ExtractMeta,
    },
    /// Content of a PAX / GNU long-name entry, gathered in memory.
    Meta {
        kind: u8,
        buf: Vec<u8>,
        remaining: u64,
        pad: u64,
    },
    /// Content we ignore (and padding).
    Skip {
        remaining: u64,
    },
    End,
}

struct ExtractMeta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
}

/// Long names and PAX headers are small; refuse absurd ones.
const META_MAX: u64 = 1 << 20;

pub struct Extractor {
    target: OwnedFd,
    hdr: [u8; BLOCK],
    hdr_len: usize,
    state: State,
    pending: Pending,
    /// The directory of the previous entry, reused when the next one is in
    /// the same place (the common case in an archive).
    last_dir: Option<(Vec<u8>, OwnedFd)>,
    /// The directories the archive lists as entries (components joined by
    /// `/`), as opposed to those only implied by a deeper entry's name.
    explicit_dirs: HashSet<Vec<u8>>,
}

/// Splits an entry name into components, refusing anything that would land
/// outside the target: `..` components. A leading `/` or `./` is dropped
/// (archives made with absolute names extract under the target, as GNU tar
/// does by default).
pub fn entry_components(name: &[u8]) -> Result<Vec<&[u8]>, AgentError> {
    let mut parts = Vec::new();
    for c in name.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                return Err(AgentError::new(
                    ErrorKind::InvalidPath,
                    format!("tar entry {:?} would escape the target directory", String::from_utf8_lossy(name)),
                ))
            }
            c => parts.push(c),
        }
    }
    Ok(parts)
}

const BENEATH: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

impl Extractor {
    pub fn new(target: OwnedFd) -> Self {
        Extractor {
            target,
            hdr: [0; BLOCK],
            hdr_len: 0,
            state: State::Header,
            pending: Pending::default(),
            last_dir: None,
            explicit_dirs: HashSet::new(),
        }
    }

    /// Feeds the next bytes of the archive.
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), AgentError> {
        while !data.is_empty() {
            match &mut self.state {
                State::End => return Ok(()),
                State::Header => {
                    let n = (BLOCK - self.hdr_len).min(data.len());
                    self.hdr[self.hdr_len..self.hdr_len + n].copy_from_slice(&data[..n]);
                    self.hdr_len += n;
                    data = &data[n..];
                    if self.hdr_len == BLOCK {
                        self.hdr_len = 0;
                        self.header()?;
                    }
                }
                State::File { fd, remaining, pad, .. } => {
                    let n = (*remaining).min(data.len() as u64) as usize;
                    let mut chunk = &data[..n];
                    while !chunk.is_empty() {
                        match rustix::io::write(&*fd, chunk) {
                            Ok(w) => chunk = &chunk[w..],
                            Err(Errno::INTR) => {}
                            Err(e) => return Err(os_err("tar: write", e)),
                        }
                    }
                    *remaining -= n as u64;
                    data = &data[n..];
                    if *remaining == 0 {
                        let pad = *pad;
                        let State::File { fd, meta, .. } = std::mem::replace(&mut self.state, State::Skip { remaining: pad }) else {
                            unreachable!("state checked above")
                        };
                        finish_file(&fd, &meta)?;
                    }
                }
                State::Meta { kind, buf, remaining, pad } => {
                    let n = (*remaining).min(data.len() as u64) as usize;
                    buf.extend_from_slice(&data[..n]);
                    *remaining -= n as u64;
                    data = &data[n..];
                    if *remaining == 0 {
                        let (kind, pad) = (*kind, *pad);
                        let buf = std::mem::take(buf);
                        self.state = State::Skip { remaining: pad };
                        self.apply_meta(kind, buf)?;
                    }
                }
                State::Skip { remaining } => {
                    let n = (*remaining).min(data.len() as u64) as usize;
                    *remaining -= n as u64;
                    data = &data[n..];
                    if *remaining == 0 {
                        self.state = State::Header;
                    }
                }
            }
            if let State::Skip { remaining: 0 } = self.state {
                self.state = State::Header;
            }
        }
        Ok(())
    }

    /// The directories the archive listed as entries so far.
    pub fn explicit_dirs(&self) -> &HashSet<Vec<u8>> {
        &self.explicit_dirs
    }

    /// End of input: fine between entries, an error in the middle of one.
    pub fn finish(&self) -> Result<(), AgentError> {
        match self.state {
            State::End => Ok(()),
            State::Header if self.hdr_len == 0 => Ok(()),
            _ => Err(bad("archive ends in the middle of an entry")),
        }
    }

    fn apply_meta(&mut self, kind: u8, buf: Vec<u8>) -> Result<(), AgentError> {
        match kind {
            b'L' => self.pending.path = Some(cstr_field(&buf).to_vec()),
            b'K' => self.pending.link = Some(cstr_field(&buf).to_vec()),
            b'x' => {
                let mut rest = &buf[..];
                while !rest.is_empty() {
                    let sp = rest.iter().position(|&b| b == b' ').ok_or_else(|| bad("bad PAX record"))?;
                    let len: usize =
                        std::str::from_utf8(&rest[..sp]).ok().and_then(|s| s.parse().ok()).ok_or_else(|| bad("bad PAX record length"))?;
                    if len <= sp + 1 || len > rest.len() {
                        return Err(bad("bad PAX record length"));
                    }
                    let rec = &rest[sp + 1..len - 1];
                    rest = &rest[len..];
                    let Some(eq) = rec.iter().position(|&b| b == b'=') else { continue };
                    let (k, v) = (&rec[..eq], &rec[eq + 1..]);
                    let num = || std::str::from_utf8(v).ok().and_then(|s| s.split('.').next()).and_then(|s| s.parse::<i64>().ok());
                    match k {
                        b"path" => self.pending.path = Some(v.to_vec()),
                        b"linkpath" => self.pending.link = Some(v.to_vec()),
                        b"size" => self.pending.size = num().and_then(|n| u64::try_from(n).ok()),
                        b"uid" => self.pending.uid = num().and_then(|n| u32::try_from(n).ok()),
                        b"gid" => self.pending.gid = num().and_then(|n| u32::try_from(n).ok()),
                        b"mtime" => self.pending.mtime = num(),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn header(&mut self) -> Result<(), AgentError> {
        let h = self.hdr;
        if h.iter().all(|&b| b == 0) {
            // The first of the two zero blocks that end an archive; anything
            // after it is ignored.
            self.state = State::End;
            return Ok(());
        }
        let stored = parse_num(&h[148..156])?;
        let unsigned: u64 = h.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u64::from(b) }).sum();
        let signed: i64 = h.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { i64::from(b as i8) }).sum();
        if stored != unsigned && stored as i64 != signed {
            return Err(bad("header checksum mismatch (not a tar archive?)"));
        }
        let kind = h[156];
        let pending = std::mem::take(&mut self.pending);
        let size = match pending.size {
            Some(s) if kind != b'x' && kind != b'L' && kind != b'K' => s,
            _ => parse_num(&h[124..136])?,
        };
        // No real archive comes near this; it keeps the padding arithmetic
        // below from overflowing on a hostile size.
        if size > 1 << 60 {
            return Err(bad("entry size out of range"));
        }
        let pad = (size.next_multiple_of(BLOCK as u64)) - size;
        if matches!(kind, b'x' | b'L' | b'K') {
            if size > META_MAX {
                return Err(bad("extended header too large"));
            }
            // Keep what came before (a GNU 'L' may precede a PAX 'x').
            self.pending = pending;
            self.state = State::Meta { kind, buf: Vec::with_capacity(size as usize), remaining: size, pad };
            if size == 0 {
                self.state = State::Header;
            }
            return Ok(());
        }
        let mut name = match pending.path {
            Some(p) => p,
            None => {
                let base = cstr_field(&h[0..100]);
                let prefix = if &h[257..262] == b"ustar" { cstr_field(&h[345..500]) } else { b"" };
                if prefix.is_empty() {
                    base.to_vec()
                } else {
                    [prefix, b"/", base].concat()
                }
            }
        };
        let link = pending.link.unwrap_or_else(|| cstr_field(&h[157..257]).to_vec());
        let meta = ExtractMeta {
            mode: parse_num(&h[100..108])? as u32 & 0o7777,
            uid: pending.uid.map_or_else(|| parse_num(&h[108..116]).map(|v| v as u32), Ok)?,
            gid: pending.gid.map_or_else(|| parse_num(&h[116..124]).map(|v| v as u32), Ok)?,
            mtime: pending.mtime.map_or_else(|| parse_num(&h[136..148]).map(|v| v as i64), Ok)?,
        };
        // Old tars mark directories only by a trailing slash.
        if (kind == b'0' || kind == 0) && name.ends_with(b"/") {
            return self.entry(b'5', &name, &link, meta, size, pad);
        }
        if name.is_empty() {
            name = b".".to_vec();
        }
        self.entry(kind, &name, &link, meta, size, pad)
    }

    fn entry(&mut self, kind: u8, name: &[u8], link: &[u8], meta: ExtractMeta, size: u64, pad: u64) -> Result<(), AgentError> {
        let parts = entry_components(name)?;
        let skip = State::Skip { remaining: size + pad };
        let Some((last, dirs)) = parts.split_last() else {
            // The target directory itself ("./"): nothing to create.
            self.state = skip;
            return Ok(());
        };
        let shown = String::from_utf8_lossy(name).into_owned();
        let parent = self.dir(dirs)?;
        let last = *last;
        match kind {
            b'5' => {
                match rustix::fs::mkdirat(&parent, last, Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(os_err(&shown, e)),
                }
                let fd = rustix::fs::openat2(
                    &parent,
                    last,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                    BENEATH,
                )
                .map_err(|e| os_err(&shown, e))?;
                finish_file(&fd, &meta)?;
                self.explicit_dirs.insert(parts.join(&b'/'));
                self.state = skip;
            }
            b'0' | 0 | b'7' => {
                replace_non_dir(&parent, last, &shown)?;
                let fd = rustix::fs::openat(
                    &parent,
                    last,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| os_err(&shown, e))?;
                if size == 0 {
                    finish_file(&fd, &meta)?;
                    self.state = State::Skip { remaining: pad };
                } else {
                    self.state = State::File { fd, remaining: size, pad, meta };
                }
            }
            b'2' => {
                replace_non_dir(&parent, last, &shown)?;
                // The link's target is stored as is: every later resolution
                // of it (ours, with RESOLVE_BENEATH / IN_ROOT) stays confined.
                rustix::fs::symlinkat(link, &parent, last).map_err(|e| os_err(&shown, e))?;
                let _ = rustix::fs::chownat(
                    &parent,
                    last,
                    Some(rustix::fs::Uid::from_raw(meta.uid)),
                    Some(rustix::fs::Gid::from_raw(meta.gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                );
                self.state = skip;
            }
            b'1' => {
                let src = entry_components(link)?;
                let Some((src_last, src_dirs)) = src.split_last() else {
                    return Err(bad(format!("hard link {shown} has an empty target")));
                };
                let src_dir = self.dir(src_dirs)?;
                let parent = self.dir(dirs)?;
                replace_non_dir(&parent, last, &shown)?;
                rustix::fs::linkat(&src_dir, *src_last, &parent, last, AtFlags::empty()).map_err(|e| os_err(&shown, e))?;
                self.state = skip;
            }
            b'6' => {
                replace_non_dir(&parent, last, &shown)?;
                rustix::fs::mknodat(&parent, last, FileType::Fifo, Mode::from_raw_mode(meta.mode), 0).map_err(|e| os_err(&shown, e))?;
                self.state = skip;
            }
            // Device nodes are not extracted: the agent is more privileged
            // than the sandbox, and a device node is a privilege. PAX global
            // headers and unknown types are skipped.
            _ => self.state = skip,
        }
        Ok(())
    }

    /// The directory `dirs` under the target (created as needed), resolved
    /// with RESOLVE_BENEATH so a symlinked component cannot lead outside.
    fn dir(&mut self, dirs: &[&[u8]]) -> Result<OwnedFd, AgentError> {
        let key = dirs.join(&b'/');
        if let Some((k, fd)) = &self.last_dir {
            if *k == key {
                return rustix::io::dup(fd).map_err(|e| os_err("dup", e));
            }
        }
        let mut cur = rustix::io::dup(&self.target).map_err(|e| os_err("dup", e))?;
        for (i, c) in dirs.iter().enumerate() {
            let shown = || String::from_utf8_lossy(&dirs[..=i].join(&b'/')).into_owned();
            let next = match open_beneath_dir(&cur, c) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    match rustix::fs::mkdirat(&cur, *c, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(os_err(shown(), e)),
                    }
                    open_beneath_dir(&cur, c).map_err(|e| os_err(shown(), e))?
                }
                Err(e) => return Err(os_err(shown(), e)),
            };
            cur = next;
        }
        let out = rustix::io::dup(&cur).map_err(|e| os_err("dup", e))?;
        self.last_dir = Some((key, cur));
        Ok(out)
    }
}

fn open_beneath_dir(dir: &OwnedFd, name: &[u8]) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(dir, name, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty(), BENEATH)
}

/// Makes room for a new non-directory entry: an existing file or link is
/// replaced (tar's behaviour), a directory is an error.
fn replace_non_dir(parent: &OwnedFd, name: &[u8], shown: &str) -> Result<(), AgentError> {
    match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(Errno::ISDIR) => Err(AgentError::new(ErrorKind::IsADirectory, format!("{shown}: a directory is in the way"))),
        Err(e) => Err(os_err(shown, e)),
    }
}

/// Ownership, then mode (chown clears setuid bits), then mtime.
fn finish_file(fd: &OwnedFd, m: &ExtractMeta) -> Result<(), AgentError> {
    // Ownership is best effort: a non-root plain-mode agent cannot chown.
    let _ = rustix::fs::fchown(fd, Some(rustix::fs::Uid::from_raw(m.uid)), Some(rustix::fs::Gid::from_raw(m.gid)));
    rustix::fs::fchmod(fd, Mode::from_raw_mode(m.mode)).map_err(|e| os_err("tar: chmod", e))?;
    let t = rustix::fs::Timespec { tv_sec: m.mtime, tv_nsec: 0 };
    let _ = rustix::fs::futimens(fd, &Timestamps { last_access: t, last_modification: t });
    Ok(())
}

/// Extracts the call's input into `path` (created if missing), through a
/// [`Staging`] directory: the target changes only if the whole archive
/// extracts.
pub async fn extract(agent: &Agent, ctx: &Rc<ReqCtx>, path: &str, max_bytes: u64) -> Result<Reply, AgentError> {
    let p = SandboxPath::parse(path)?;
    let staging = Staging::create(&agent.root, &p)?;
    let mut ex = Extractor::new(staging.dir()?);
    let mut total = 0u64;
    loop {
        if let Some(e) = ctx.abort_error() {
            return Err(e);
        }
        if let Some(chunk) = ctx.take_input() {
            total += chunk.len() as u64;
            if total > max_bytes {
                return Err(AgentError::new(ErrorKind::TooLarge, format!("archive larger than the limit of {max_bytes} bytes")));
            }
            ex.feed(&chunk)?;
            ctx.consumed(chunk.len());
            continue;
        }
        if ctx.eof() {
            ex.finish()?;
            // Close the extractor's directories before the tree moves.
            let explicit_dirs = ex.explicit_dirs().clone();
            drop(ex);
            staging.commit(&explicit_dirs)?;
            return Ok(Reply::Done);
        }
        ctx.changed().await;
    }
}

#[cfg(test)]
mod tests {
    use super::super::format::{encode_header, EntryMeta};
    use super::*;

    #[test]
    fn escaping_entries_are_refused() {
        assert_eq!(entry_components(b"./a/b").unwrap(), [b"a" as &[u8], b"b"]);
        assert_eq!(entry_components(b"/abs/x").unwrap(), [b"abs" as &[u8], b"x"]);
        assert!(entry_components(b"./").unwrap().is_empty());
        for bad in [&b"../x"[..], b"a/../../x", b"a/.."] {
            assert_eq!(entry_components(bad).unwrap_err().kind, ErrorKind::InvalidPath);
        }
    }

    /// Our headers must be read back by an independent implementation.

    #[test]
    fn extractor_refuses_escape_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let fd = rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        let m =
            EntryMeta { name: b"../evil".to_vec(), kind: b'0', mode: 0o644, uid: 0, gid: 0, size: 0, mtime: 0, link: vec![], dev: (0, 0) };
        let mut ex = Extractor::new(rustix::io::dup(&fd).unwrap());
        assert_eq!(ex.feed(&encode_header(&m)).unwrap_err().kind, ErrorKind::InvalidPath);
        assert!(!dir.path().parent().unwrap().join("evil").exists());

        let m = EntryMeta { name: b"f".to_vec(), kind: b'0', mode: 0o644, uid: 0, gid: 0, size: 10, mtime: 0, link: vec![], dev: (0, 0) };
        let mut ex = Extractor::new(fd);
        let mut bytes = encode_header(&m);
        bytes.extend(b"abc");
        ex.feed(&bytes).unwrap();
        assert!(ex.finish().is_err());
    }
}
