//! Writes a layer's tree (a mounted EROFS layer) as an OCI layer tar: the
//! reverse of `apply`. overlayfs' deletion markers become OCI ones: a
//! character device 0:0 becomes `.wh.NAME`, a directory carrying
//! `trusted.overlay.opaque=y` gets a `.wh..wh..opq` entry. Other extended
//! attributes travel as PAX `SCHILY.xattr.*` records (what the import
//! unpacks); hard links stay hard links.
//!
//! The order is fixed (depth first, names sorted) and every header field
//! comes from the tree, so one layer always gives the same bytes, hence the
//! same digest, and a second push finds its blobs already there.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use tar::{EntryType, Header};

use crate::progress::{Progress, Unit};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
const OVERLAY_XATTR_PREFIX: &[u8] = b"trusted.overlay.";
const OVERLAY_OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// What a written tar holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TarStats {
    pub entries: u64,
    pub whiteouts: u64,
    pub opaque_dirs: u64,
    /// Bytes of file content.
    pub file_bytes: u64,
}

/// Writes the tree under `root` (not `root` itself) as a tar to `out` and
/// returns `out` once the archive is finished.
pub(crate) fn write_layer_tar<W: Write>(root: &Path, out: W, progress: &dyn Progress) -> io::Result<(W, TarStats)> {
    let mut entries = Vec::new();
    collect(root, Path::new(""), &mut entries)?;
    let total: u64 = entries.iter().filter(|(_, m)| m.file_type().is_file()).map(|(_, m)| m.len()).sum();
    let mut builder = tar::Builder::new(out);
    let mut stats = TarStats::default();
    // (dev, inode) of multiply-linked files -> the first path written.
    let mut links: HashMap<(u64, u64), PathBuf> = HashMap::new();
    for (rel, meta) in &entries {
        let full = root.join(rel);
        let ft = meta.file_type();
        stats.entries += 1;
        if ft.is_char_device() && meta.rdev() == 0 {
            let name = rel.file_name().unwrap_or_default();
            let mut marker = OsString::from(WHITEOUT_PREFIX);
            marker.push(name);
            let mut header = empty_file_header(meta);
            builder.append_data(&mut header, rel.with_file_name(marker), io::empty())?;
            stats.whiteouts += 1;
            continue;
        }
        if ft.is_socket() {
            continue; // not representable in a tar; a live socket means nothing in an image
        }
        write_xattrs(&mut builder, &full)?;
        let mut header = Header::new_gnu();
        set_metadata(&mut header, meta);
        if ft.is_dir() {
            header.set_entry_type(EntryType::Directory);
            header.set_size(0);
            builder.append_data(&mut header, rel, io::empty())?;
            if is_opaque(&full)? {
                let mut marker = empty_file_header(meta);
                builder.append_data(&mut marker, rel.join(OPAQUE_MARKER), io::empty())?;
                stats.opaque_dirs += 1;
            }
        } else if ft.is_symlink() {
            header.set_entry_type(EntryType::Symlink);
            header.set_size(0);
            builder.append_link(&mut header, rel, fs::read_link(&full)?)?;
        } else if ft.is_file() {
            if meta.nlink() > 1 {
                let key = (meta.dev(), meta.ino());
                if let Some(first) = links.get(&key) {
                    header.set_entry_type(EntryType::Link);
                    header.set_size(0);
                    builder.append_link(&mut header, rel, first)?;
                    continue;
                }
                links.insert(key, rel.clone());
            }
            header.set_entry_type(EntryType::Regular);
            header.set_size(meta.len());
            let file = fs::File::open(&full)?;
            // The size in the header is a promise: a file that changed
            // under us must fail the export, not corrupt the archive.
            let mut reader = ExactReader { inner: file.take(meta.len()), left: meta.len() };
            builder.append_data(&mut header, rel, &mut reader)?;
            stats.file_bytes += meta.len();
            progress.advance(stats.file_bytes, Some(total), Unit::Bytes);
        } else if ft.is_char_device() || ft.is_block_device() || ft.is_fifo() {
            header.set_entry_type(if ft.is_char_device() {
                EntryType::Char
            } else if ft.is_block_device() {
                EntryType::Block
            } else {
                EntryType::Fifo
            });
            header.set_size(0);
            let rdev = meta.rdev();
            header.set_device_major(rustix::fs::major(rdev))?;
            header.set_device_minor(rustix::fs::minor(rdev))?;
            builder.append_data(&mut header, rel, io::empty())?;
        }
    }
    builder.finish()?;
    Ok((builder.into_inner()?, stats))
}

/// Every entry under `dir`, depth first, names sorted (parents before
/// their children, as extraction needs).
fn collect(root: &Path, rel: &Path, out: &mut Vec<(PathBuf, fs::Metadata)>) -> io::Result<()> {
    let mut names: Vec<OsString> = fs::read_dir(root.join(rel))?.map(|e| e.map(|e| e.file_name())).collect::<io::Result<_>>()?;
    names.sort();
    for name in names {
        let child = rel.join(&name);
        let meta = fs::symlink_metadata(root.join(&child))?;
        let is_dir = meta.is_dir();
        out.push((child.clone(), meta));
        if is_dir {
            collect(root, &child, out)?;
        }
    }
    Ok(())
}

fn set_metadata(header: &mut Header, meta: &fs::Metadata) {
    header.set_mode(meta.mode() & 0o7777);
    header.set_uid(u64::from(meta.uid()));
    header.set_gid(u64::from(meta.gid()));
    header.set_mtime(meta.mtime().max(0) as u64);
}

/// A zero-length regular file (the OCI markers), stamped like `meta`.
fn empty_file_header(meta: &fs::Metadata) -> Header {
    let mut header = Header::new_gnu();
    set_metadata(&mut header, meta);
    header.set_mode(0o644);
    header.set_entry_type(EntryType::Regular);
    header.set_size(0);
    header
}

fn is_opaque(path: &Path) -> io::Result<bool> {
    let mut value = [0u8; 4];
    match rustix::fs::lgetxattr(path, OVERLAY_OPAQUE_XATTR, &mut value) {
        Ok(n) => Ok(&value[..n] == b"y"),
        Err(rustix::io::Errno::NODATA) | Err(rustix::io::Errno::OPNOTSUPP) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The extended attributes of `path` other than overlayfs' own, as a PAX
/// header in front of its entry (nothing when there are none).
fn write_xattrs<W: Write>(builder: &mut tar::Builder<W>, path: &Path) -> io::Result<()> {
    let mut records = Vec::new();
    for (name, value) in xattrs(path)? {
        if name.starts_with(OVERLAY_XATTR_PREFIX) {
            continue;
        }
        let mut key = b"SCHILY.xattr.".to_vec();
        key.extend_from_slice(&name);
        records.extend_from_slice(&pax_record(&key, &value));
    }
    if records.is_empty() {
        return Ok(());
    }
    let mut header = Header::new_ustar();
    header.set_entry_type(EntryType::XHeader);
    header.set_path("PaxHeaders/xattrs")?;
    header.set_mode(0o644);
    header.set_size(records.len() as u64);
    header.set_cksum();
    builder.append(&header, records.as_slice())
}

fn xattrs(path: &Path) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut names = vec![0u8; 4096];
    let n = match rustix::fs::llistxattr(path, &mut names) {
        Ok(n) => n,
        Err(rustix::io::Errno::OPNOTSUPP) => return Ok(Vec::new()),
        Err(rustix::io::Errno::RANGE) => {
            names = vec![0u8; 65536];
            rustix::fs::llistxattr(path, &mut names)?
        }
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let mut value = vec![0u8; 65536];
        let len = rustix::fs::lgetxattr(path, std::ffi::OsStr::from_bytes(name), &mut value)?;
        value.truncate(len);
        out.push((name.to_vec(), value));
    }
    out.sort();
    Ok(out)
}

/// `"<len> <key>=<value>\n"`, where len counts the whole record, its own
/// digits included.
fn pax_record(key: &[u8], value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    let mut out = format!("{len} ").into_bytes();
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
    out
}

/// Yields exactly `left` bytes or fails (a file that shrank while read).
struct ExactReader<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for ExactReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let n = self.inner.read(buf)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file shrank while it was read"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::NoProgress;

    #[test]
    fn pax_lengths_count_themselves() {
        let r = pax_record(b"k", b"v");
        assert_eq!(r, b"6 k=v\n");
        let long = vec![b'x'; 95];
        let r = pax_record(b"k", &long);
        let text = String::from_utf8(r.clone()).unwrap();
        let (len, _) = text.split_once(' ').unwrap();
        assert_eq!(len.parse::<usize>().unwrap(), r.len());
    }

    /// Regular files, a symlink, a hard link, nested directories: the tar
    /// lists them in order with their content, and a second write gives the
    /// same bytes.
    #[test]
    fn trees_become_deterministic_tars() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::create_dir_all(root.join("b/c")).unwrap();
        fs::write(root.join("b/c/f"), b"hello").unwrap();
        fs::write(root.join("a"), b"top").unwrap();
        fs::hard_link(root.join("a"), root.join("b/a-again")).unwrap();
        std::os::unix::fs::symlink("../a", root.join("b/link")).unwrap();

        let (bytes, stats) = write_layer_tar(root, Vec::new(), &NoProgress).unwrap();
        assert_eq!(stats.file_bytes, 8);
        let (again, _) = write_layer_tar(root, Vec::new(), &NoProgress).unwrap();
        assert_eq!(bytes, again);

        let mut archive = tar::Archive::new(bytes.as_slice());
        let mut seen = Vec::new();
        for e in archive.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            let kind = e.header().entry_type();
            let mut content = String::new();
            e.read_to_string(&mut content).unwrap();
            let link = e.link_name().unwrap().map(|l| l.display().to_string());
            seen.push((path, kind, content, link));
        }
        let summary: Vec<(&str, EntryType)> = seen.iter().map(|(p, k, _, _)| (p.as_str(), *k)).collect();
        assert_eq!(
            summary,
            vec![
                ("a", EntryType::Regular),
                ("b", EntryType::Directory),
                ("b/a-again", EntryType::Link),
                ("b/c", EntryType::Directory),
                ("b/c/f", EntryType::Regular),
                ("b/link", EntryType::Symlink),
            ]
        );
        assert_eq!(seen[0].2, "top");
        assert_eq!(seen[2].3.as_deref(), Some("a"));
        assert_eq!(seen[4].2, "hello");
        assert_eq!(seen[5].3.as_deref(), Some("../a"));
    }

    /// overlayfs markers (needs root: mknod and trusted.* xattrs) become
    /// OCI whiteouts and opaque markers; user xattrs become PAX records.
    #[test]
    fn overlay_markers_become_oci_whiteouts() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root for mknod and trusted.* xattrs");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::create_dir(root.join("etc")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("etc/gone"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::empty(),
            rustix::fs::makedev(0, 0),
        )
        .unwrap();
        fs::create_dir(root.join("data")).unwrap();
        rustix::fs::lsetxattr(root.join("data"), OVERLAY_OPAQUE_XATTR, b"y", rustix::fs::XattrFlags::empty()).unwrap();
        fs::write(root.join("data/kept"), b"k").unwrap();
        rustix::fs::lsetxattr(root.join("data/kept"), "user.note", b"v=1", rustix::fs::XattrFlags::empty()).unwrap();

        let (bytes, stats) = write_layer_tar(root, Vec::new(), &NoProgress).unwrap();
        assert_eq!((stats.whiteouts, stats.opaque_dirs), (1, 1));
        let mut archive = tar::Archive::new(bytes.as_slice());
        let mut paths = Vec::new();
        let mut note = None;
        for e in archive.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            if path == "data/kept" {
                for ext in e.pax_extensions().unwrap().unwrap() {
                    let ext = ext.unwrap();
                    if ext.key().unwrap() == "SCHILY.xattr.user.note" {
                        note = Some(ext.value_bytes().to_vec());
                    }
                }
            }
            paths.push(path);
        }
        assert_eq!(paths, vec!["data", "data/.wh..wh..opq", "data/kept", "etc", "etc/.wh.gone"]);
        assert_eq!(note.as_deref(), Some(&b"v=1"[..]));
    }
}
