//! TarCreate: a depth-first walk that emits one entry at a time, as fast
//! as the edge's credit allows.

use std::os::fd::OwnedFd;
use std::rc::Rc;

use dsec_agent_proto::{AgentError, Reply, Stream, MAX_CHUNK_BYTES};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::format::{encode_header, EntryMeta, BLOCK};
use crate::agent::Agent;
use crate::errors::{invalid, os_err};
use crate::paths::SandboxPath;
use crate::request::ReqCtx;

/// Buffers output into chunks and sends them as the window allows.
struct Emitter<'a> {
    ctx: &'a Rc<ReqCtx>,
    buf: Vec<u8>,
}

impl Emitter<'_> {
    async fn put(&mut self, data: &[u8]) -> Result<(), AgentError> {
        self.buf.extend_from_slice(data);
        while self.buf.len() >= MAX_CHUNK_BYTES {
            self.send_some().await?;
        }
        Ok(())
    }

    /// Sends up to one chunk, waiting for credit if needed.
    async fn send_some(&mut self) -> Result<(), AgentError> {
        loop {
            if let Some(e) = self.ctx.abort_error() {
                return Err(e);
            }
            let n = self.ctx.sendable().min(self.buf.len());
            if n > 0 {
                self.ctx.send_data(Stream::Content, &self.buf[..n]);
                self.buf.drain(..n);
                tokio::task::yield_now().await;
                return Ok(());
            }
            self.ctx.changed().await;
        }
    }

    async fn finish(&mut self) -> Result<(), AgentError> {
        while !self.buf.is_empty() {
            self.send_some().await?;
        }
        Ok(())
    }
}

fn tar_kind(ft: FileType) -> Option<u8> {
    Some(match ft {
        FileType::RegularFile => b'0',
        FileType::Symlink => b'2',
        FileType::CharacterDevice => b'3',
        FileType::BlockDevice => b'4',
        FileType::Directory => b'5',
        FileType::Fifo => b'6',
        // Sockets have no tar representation.
        _ => return None,
    })
}

/// Streams `path` as a tar archive: a directory's contents with names
/// relative to it (no leading component), or a single file under its name.
pub async fn create(agent: &Agent, ctx: &Rc<ReqCtx>, path: &str) -> Result<Reply, AgentError> {
    let p = SandboxPath::parse(path)?;
    let top = agent.root.open_at(&p, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()).map_err(|e| os_err(p.display(), e))?;
    let st = rustix::fs::fstat(&top).map_err(|e| os_err(p.display(), e))?;
    let mut em = Emitter { ctx, buf: Vec::with_capacity(MAX_CHUNK_BYTES * 2) };
    let mut scratch = vec![0u8; MAX_CHUNK_BYTES];
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {
            let name = p.name().as_bytes().to_vec();
            emit_file(&mut em, &top, &st, name, &mut scratch).await?;
        }
        FileType::Directory => {
            // Depth-first, one open directory per level.
            let mut stack: Vec<(rustix::fs::Dir, Vec<u8>)> = Vec::new();
            stack.push((rustix::fs::Dir::new(top).map_err(|e| os_err(p.display(), e))?, Vec::new()));
            while let Some((dir, prefix)) = stack.last_mut() {
                let Some(entry) = dir.read() else {
                    stack.pop();
                    continue;
                };
                let entry = entry.map_err(|e| os_err(p.display(), e))?;
                let raw = entry.file_name().to_bytes();
                if raw == b"." || raw == b".." {
                    continue;
                }
                let raw = raw.to_vec();
                let mut name = prefix.clone();
                name.extend_from_slice(&raw);
                let dfd = dir.fd().map_err(|e| os_err(p.display(), e))?;
                let shown = || format!("{}/{}", p.display(), String::from_utf8_lossy(&name));
                let est = match rustix::fs::statat(dfd, raw.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(s) => s,
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(os_err(shown(), e)),
                };
                let ft = FileType::from_raw_mode(est.st_mode);
                let Some(kind) = tar_kind(ft) else { continue };
                match ft {
                    FileType::RegularFile => {
                        let fd = match rustix::fs::openat(
                            dfd,
                            raw.as_slice(),
                            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                            Mode::empty(),
                        ) {
                            Ok(fd) => fd,
                            Err(Errno::NOENT) => continue,
                            Err(e) => return Err(os_err(shown(), e)),
                        };
                        emit_file(&mut em, &fd, &est, name, &mut scratch).await?;
                    }
                    FileType::Directory => {
                        let sub = rustix::fs::openat(
                            dfd,
                            raw.as_slice(),
                            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                            Mode::empty(),
                        )
                        .map_err(|e| os_err(shown(), e))?;
                        let mut dname = name.clone();
                        dname.push(b'/');
                        em.put(&encode_header(&meta(&est, dname.clone(), kind, Vec::new()))).await?;
                        stack.push((rustix::fs::Dir::new(sub).map_err(|e| os_err(shown(), e))?, dname));
                    }
                    _ => {
                        let link = if kind == b'2' {
                            rustix::fs::readlinkat(dfd, raw.as_slice(), Vec::new()).map_err(|e| os_err(shown(), e))?.into_bytes()
                        } else {
                            Vec::new()
                        };
                        em.put(&encode_header(&meta(&est, name, kind, link))).await?;
                    }
                }
            }
        }
        _ => return Err(invalid(format!("{}: not a file or directory", p.display()))),
    }
    // End of archive: two zero blocks.
    em.put(&[0u8; 2 * BLOCK]).await?;
    em.finish().await?;
    Ok(Reply::Done)
}

fn meta(st: &rustix::fs::Stat, name: Vec<u8>, kind: u8, link: Vec<u8>) -> EntryMeta {
    let size = if kind == b'0' { st.st_size as u64 } else { 0 };
    let dev = (rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev));
    EntryMeta { name, kind, mode: st.st_mode & 0o7777, uid: st.st_uid, gid: st.st_gid, size, mtime: st.st_mtime, link, dev }
}

async fn emit_file(em: &mut Emitter<'_>, fd: &OwnedFd, st: &rustix::fs::Stat, name: Vec<u8>, scratch: &mut [u8]) -> Result<(), AgentError> {
    let m = meta(st, name, b'0', Vec::new());
    let size = m.size;
    em.put(&encode_header(&m)).await?;
    let mut pos = 0u64;
    while pos < size {
        let want = (size - pos).min(scratch.len() as u64) as usize;
        let n = match rustix::io::pread(fd, &mut scratch[..want], pos) {
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(os_err(String::from_utf8_lossy(&m.name), e)),
        };
        if n == 0 {
            // The file shrank after we wrote its size: pad with zeros so the
            // archive stays well-formed.
            scratch[..want].fill(0);
            em.put(&scratch[..want]).await?;
            pos += want as u64;
            continue;
        }
        em.put(&scratch[..n]).await?;
        pos += n as u64;
    }
    let pad = (size as usize).next_multiple_of(BLOCK) - size as usize;
    em.put(&[0u8; BLOCK][..pad]).await?;
    Ok(())
}
