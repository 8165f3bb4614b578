//! `dsec cp`: copies a file or a directory between this machine and a
//! sandbox, streaming both ways (a directory crosses as a tar stream), with
//! a progress bar on a terminal.
//!
//! The copy is made *at* the destination: a directory's content becomes the
//! destination directory's (created if missing, merged if it exists), the
//! way the SDK's `upload` and `download` do. One exception, as with `cp`: a
//! file copied to an existing directory lands inside it, under its own name.
//! Nothing half-copied is left: a local file, or a local directory that did
//! not exist, is written under a temporary name and renamed, and the server
//! applies an upload only once it is whole.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use dsec_api as api;
use dsec_client::{Chunks, Client};
use http_body_util::BodyExt;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::mpsc;

use crate::connect::ConnectArgs;

#[derive(Args, Debug)]
pub struct CpArgs {
    /// What to copy: a local path, `ID:PATH` in a sandbox (PATH absolute),
    /// or `-` for standard input (the content of one file).
    pub src: String,
    /// Where the copy is made: a local path, `ID:PATH`, or `-` for standard
    /// output (a file's content, or a directory as a tar stream).
    pub dst: String,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// One end of a copy.
#[derive(Debug, PartialEq)]
enum End {
    Local(PathBuf),
    Std,
    Sandbox { id: String, path: String },
}

/// `ID:PATH` names a sandbox path; anything else is local (write a local
/// path with a colon as `./a:b`: an id has no `/`).
fn parse_end(s: &str) -> anyhow::Result<End> {
    if s == "-" {
        return Ok(End::Std);
    }
    match s.split_once(':') {
        Some((id, path)) if !id.is_empty() && !id.contains('/') => {
            if !path.starts_with('/') {
                bail!("{s}: the path in a sandbox must be absolute (ID:/path)");
            }
            Ok(End::Sandbox { id: id.to_string(), path: path.to_string() })
        }
        _ if s.is_empty() => bail!("an empty path"),
        _ => Ok(End::Local(PathBuf::from(s))),
    }
}

/// Pieces of this size go to the server, and come from disk.
const CHUNK: usize = 256 << 10;

pub async fn run(a: CpArgs) -> anyhow::Result<u8> {
    let (src, dst) = (parse_end(&a.src)?, parse_end(&a.dst)?);
    let client = a.conn.client()?;
    let copied = match (src, dst) {
        (End::Sandbox { .. }, End::Sandbox { .. }) => bail!("both ends are in sandboxes: copy through this machine"),
        (End::Local(_) | End::Std, End::Local(_) | End::Std) => bail!("neither end is in a sandbox (ID:/path): use cp"),
        (End::Local(from), End::Sandbox { id, path }) => upload(&client, &from, &id, &path).await?,
        (End::Std, End::Sandbox { id, path }) => upload_stdin(&client, &id, &path).await?,
        (End::Sandbox { id, path }, to) => download(&client, &id, &path, to).await?,
    };
    eprintln!("copied {} to {}", indicatif::HumanBytes(copied), a.dst);
    Ok(0)
}

fn files_path(id: &str, route: &str, query: &[(&str, &str)]) -> String {
    let q: String = form_urlencoded::Serializer::new(String::new()).extend_pairs(query).finish();
    format!("/v1/sandboxes/{id}/{route}?{q}")
}

fn bar(len: Option<u64>, what: &str) -> ProgressBar {
    let bar = match len {
        Some(n) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        ),
        None => ProgressBar::no_length()
            .with_style(ProgressStyle::with_template("{spinner} {prefix} {bytes} {bytes_per_sec}").expect("valid template")),
    };
    bar.with_prefix(what.to_string())
}

/// Reads `reader` on a blocking thread into the channel an upload sends.
fn pump(mut reader: impl Read + Send + 'static, bar: ProgressBar) -> Chunks {
    let (tx, rx) = mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let piece = match reader.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => Ok(Bytes::copy_from_slice(&buf[..n])),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
            let failed = piece.is_err();
            if let Ok(p) = &piece {
                bar.inc(p.len() as u64);
            }
            // The upload ended (refused, or the connection is gone).
            if tx.blocking_send(piece).is_err() || failed {
                return;
            }
        }
    });
    rx
}

/// A `Write` whose bytes go, in pieces of [`CHUNK`], to an upload.
struct ChunkWriter {
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    buf: Vec<u8>,
    bar: ProgressBar,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.bar.inc(piece.len() as u64);
        self.tx.blocking_send(Ok(piece)).map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the upload ended"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

async fn upload(client: &Client, from: &Path, id: &str, path: &str) -> anyhow::Result<u64> {
    let meta = std::fs::metadata(from).with_context(|| format!("{}", from.display()))?;
    if meta.is_dir() {
        return upload_dir(client, from, id, path).await;
    }
    // A file copied to an existing directory lands inside it.
    let mut path = path.to_string();
    if let Ok(info) = client.stat(id, &path).await {
        if info.file_type == api::FileType::Dir {
            let name = from.file_name().and_then(|n| n.to_str()).context("the file has no name")?;
            path = format!("{}/{name}", path.trim_end_matches('/'));
        }
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = (meta.permissions().mode() & 0o7777).to_string();
    let file = std::fs::File::open(from).with_context(|| format!("{}", from.display()))?;
    let bar = bar(Some(meta.len()), &format!("{} -> {id}:{path}", from.display()));
    let chunks = pump(file, bar.clone());
    let query = [("path", path.as_str()), ("parents", "true"), ("mode", mode.as_str())];
    let body = client.put_stream(&files_path(id, "files", &query), "application/octet-stream", Some(meta.len()), chunks).await;
    bar.finish_and_clear();
    let written: api::WriteResult = serde_json::from_slice(&body?)?;
    Ok(written.bytes)
}

async fn upload_stdin(client: &Client, id: &str, path: &str) -> anyhow::Result<u64> {
    let bar = bar(None, &format!("stdin -> {id}:{path}"));
    let chunks = pump(std::io::stdin(), bar.clone());
    let query = [("path", path), ("parents", "true")];
    let body = client.put_stream(&files_path(id, "files", &query), "application/octet-stream", None, chunks).await;
    bar.finish_and_clear();
    let written: api::WriteResult = serde_json::from_slice(&body?)?;
    Ok(written.bytes)
}

/// A tar stream of directory `root`'s contents (and of `extra`, a file
/// added under the name it gives), made on a blocking thread as the upload
/// takes it. The task's error, if any, says what could not be read.
pub(crate) fn tar_stream(
    root: PathBuf,
    extra: Option<(PathBuf, &'static str)>,
    bar: ProgressBar,
) -> (Chunks, tokio::task::JoinHandle<anyhow::Result<()>>) {
    let (tx, chunks) = mpsc::channel(4);
    let mut writer = ChunkWriter { tx: tx.clone(), buf: Vec::with_capacity(CHUNK), bar };
    let packer = tokio::task::spawn_blocking(move || {
        let mut tar = tar::Builder::new(&mut writer);
        // Links stay links, as in the sandbox.
        tar.follow_symlinks(false);
        let mut built = tar.append_dir_all(".", &root);
        if let (Ok(()), Some((path, name))) = (&built, &extra) {
            built = tar.append_path_with_name(path, name);
        }
        let built = built.and_then(|()| tar.finish());
        drop(tar);
        let sent = built.and_then(|()| writer.flush());
        if let Err(e) = &sent {
            // Cut the body: the server then keeps nothing.
            let _ = tx.blocking_send(Err(std::io::Error::new(e.kind(), e.to_string())));
        }
        sent.with_context(|| format!("reading {}", root.display()))
    });
    (chunks, packer)
}

async fn upload_dir(client: &Client, from: &Path, id: &str, path: &str) -> anyhow::Result<u64> {
    let bar = bar(None, &format!("{} -> {id}:{path}", from.display()));
    let (chunks, packer) = tar_stream(from.to_path_buf(), None, bar.clone());
    let body = client.put_stream(&files_path(id, "archive", &[("path", path)]), "application/x-tar", None, chunks).await;
    bar.finish_and_clear();
    // A local error explains a cut upload better than the server's answer.
    packer.await??;
    let _: api::WriteResult = serde_json::from_slice(&body?)?;
    Ok(bar.position())
}

async fn download(client: &Client, id: &str, path: &str, to: End) -> anyhow::Result<u64> {
    let info = client.stat(id, path).await?;
    let mut is_dir = info.file_type == api::FileType::Dir;
    let archive = files_path(id, "archive", &[("path", path)]);
    let mut body = if is_dir {
        client.get_stream(&archive).await?
    } else {
        match client.get_stream(&files_path(id, "files", &[("path", path)])).await {
            // A symlink to a directory: stat did not follow it, the read did.
            Err(e) if info.file_type == api::FileType::Symlink && e.code() == Some(api::ErrorCode::IsADirectory) => {
                is_dir = true;
                client.get_stream(&archive).await?
            }
            r => r?,
        }
    };
    let bar = bar((!is_dir).then_some(info.size), &format!("{id}:{path}"));
    // The body's frames go to a blocking thread that writes them out.
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, String>>(4);
    let sink = match to {
        End::Std => Sink::Stdout,
        End::Local(p) if is_dir => Sink::Unpack(p),
        End::Local(p) => Sink::File(file_target(&p, path)?),
        End::Sandbox { .. } => unreachable!("sandbox-to-sandbox is refused before"),
    };
    let writer = tokio::task::spawn_blocking(move || sink.write_all(ChannelReader { rx: &mut rx, piece: Bytes::new() }, info.mode));
    let mut total = 0u64;
    let received: anyhow::Result<()> = async {
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.context("the download was cut")?.into_data() else { continue };
            total += data.len() as u64;
            bar.inc(data.len() as u64);
            if tx.send(Ok(data)).await.is_err() {
                break; // the writer failed; its error says why
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = &received {
        // The writer must fail too, not take the cut for the end.
        let _ = tx.send(Err(e.to_string())).await;
    }
    drop(tx);
    bar.finish_and_clear();
    let written = writer.await?;
    received?;
    written?;
    Ok(total)
}

/// Where a downloaded file goes: `to`, or inside it if it is a directory.
fn file_target(to: &Path, remote: &str) -> anyhow::Result<PathBuf> {
    if to.is_dir() {
        let name = remote.rsplit('/').next().filter(|n| !n.is_empty()).context("the remote path has no file name")?;
        return Ok(to.join(name));
    }
    Ok(to.to_path_buf())
}

enum Sink {
    Stdout,
    File(PathBuf),
    Unpack(PathBuf),
}

impl Sink {
    fn write_all(self, mut from: ChannelReader<'_>, mode: u32) -> anyhow::Result<()> {
        match self {
            Sink::Stdout => {
                std::io::copy(&mut from, &mut std::io::stdout().lock())?;
                Ok(())
            }
            Sink::File(path) => {
                let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
                let name = path.file_name().context("the local path has no file name")?;
                let tmp = dir.join(format!(".{}.dsec-cp-{}", name.to_string_lossy(), std::process::id()));
                let written = (|| -> anyhow::Result<()> {
                    let mut f = std::fs::File::create(&tmp).with_context(|| format!("{}", tmp.display()))?;
                    std::io::copy(&mut from, &mut f)?;
                    use std::os::unix::fs::PermissionsExt;
                    f.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))?;
                    std::fs::rename(&tmp, &path).with_context(|| format!("{}", path.display()))
                })();
                if written.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                written
            }
            // An existing directory is unpacked into; a new one is unpacked
            // beside it under a temporary name and renamed at the end, so a
            // cut download leaves nothing.
            Sink::Unpack(dir) if dir.is_dir() => unpack(from, &dir),
            Sink::Unpack(dir) => {
                let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
                std::fs::create_dir_all(parent).with_context(|| format!("{}", parent.display()))?;
                let name = dir.file_name().context("the local path has no name")?.to_string_lossy().into_owned();
                let staging = parent.join(format!(".{name}.dsec-cp-{}", std::process::id()));
                std::fs::create_dir(&staging).with_context(|| format!("{}", staging.display()))?;
                let unpacked =
                    unpack(from, &staging).and_then(|()| std::fs::rename(&staging, &dir).with_context(|| format!("{}", dir.display())));
                if unpacked.is_err() {
                    let _ = std::fs::remove_dir_all(&staging);
                }
                unpacked
            }
        }
    }
}

fn unpack(from: ChannelReader<'_>, dir: &Path) -> anyhow::Result<()> {
    let mut archive = tar::Archive::new(from);
    archive.set_preserve_permissions(true);
    archive.set_overwrite(true);
    archive.unpack(dir).with_context(|| format!("unpacking into {}", dir.display()))
}

/// A `Read` over the pieces a download's task hands over; an `Err` piece
/// (the download was cut) is a read error, so no sink mistakes it for the end.
struct ChannelReader<'a> {
    rx: &'a mut mpsc::Receiver<Result<Bytes, String>>,
    piece: Bytes,
}

impl Read for ChannelReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.piece.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(p)) => self.piece = p,
                Some(Err(e)) => return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, e)),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.piece.len());
        out[..n].copy_from_slice(&self.piece.split_to(n));
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar of `n` files, as the archive route sends one.
    fn archive(n: usize) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for i in 0..n {
            let data = vec![i as u8; 3000];
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, format!("d/f{i}"), &data[..]).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// Feeds `data` to a sink in pieces, then an error if `cut`.
    fn feed(sink: Sink, data: &[u8], cut: bool) -> anyhow::Result<()> {
        let (tx, mut rx) = mpsc::channel(data.len() / 1000 + 2);
        for piece in data.chunks(1000) {
            tx.try_send(Ok(Bytes::copy_from_slice(piece))).unwrap();
        }
        if cut {
            tx.try_send(Err("the download was cut".into())).unwrap();
        }
        drop(tx);
        sink.write_all(ChannelReader { rx: &mut rx, piece: Bytes::new() }, 0o644)
    }

    #[test]
    fn a_new_local_directory_appears_whole_or_not_at_all() {
        let tmp = tempfile::tempdir().unwrap();
        let data = archive(20);
        let err = feed(Sink::Unpack(tmp.path().join("out")), &data[..data.len() / 2], true).unwrap_err();
        assert!(format!("{err:#}").contains("cut"), "{err:#}");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);

        feed(Sink::Unpack(tmp.path().join("out")), &data, false).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("out/d/f7")).unwrap(), vec![7u8; 3000]);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_cut_file_download_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(feed(Sink::File(tmp.path().join("f")), &[1u8; 5000], true).is_err());
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn ends_are_told_apart() {
        assert_eq!(parse_end("-").unwrap(), End::Std);
        assert_eq!(parse_end("node.abc:/tmp/x").unwrap(), End::Sandbox { id: "node.abc".into(), path: "/tmp/x".into() });
        assert_eq!(parse_end("./a:b").unwrap(), End::Local("./a:b".into()));
        assert_eq!(parse_end("dir/file").unwrap(), End::Local("dir/file".into()));
        assert!(parse_end("node.abc:relative").unwrap_err().to_string().contains("absolute"));
        assert!(parse_end("").is_err());
    }
}
