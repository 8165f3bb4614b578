//! Layer from a tar or tar.gz archive: unpacked into a scratch root (modes,
//! owners, mtimes, xattrs, symlinks and hard links kept), then mkfs.
//!
//! OCI whiteouts (`.wh.*`) are not interpreted yet: they end up as plain
//! files in the layer.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Component, Path};
use std::rc::Rc;

use flate2::read::GzDecoder;

use super::{mkfs::mkfs_into_store, BuildDir, BuildError, BuildOptions};
use crate::progress::{Progress, Unit};
use crate::store::{ImageStore, StoredLayer};

pub fn build_layer_from_tar(
    store: &ImageStore,
    archive: &Path,
    options: &BuildOptions,
    progress: &dyn Progress,
) -> Result<StoredLayer, BuildError> {
    let build = BuildDir::new(store, "tar")?;
    let root = build.make_root()?;
    progress.stage(&format!("unpacking {}", archive.display()));
    unpack(archive, &root, progress)?;
    mkfs_into_store(store, &root, options, progress)
}

fn unpack(archive: &Path, root: &Path, progress: &dyn Progress) -> Result<(), BuildError> {
    let tar_err = |source: io::Error| {
        if crate::fsutil::is_enospc(&source) {
            BuildError::DiskFull(format!("unpacking {}", archive.display()))
        } else {
            BuildError::Tar { path: archive.to_path_buf(), source }
        }
    };
    let file = File::open(archive).map_err(tar_err)?;
    let total = file.metadata().map_err(tar_err)?.len();
    let done = Rc::new(Cell::new(0u64));
    let mut input = BufReader::with_capacity(1 << 20, file);

    // Sniff gzip by its magic rather than trusting the file name.
    let is_gzip = io::BufRead::fill_buf(&mut input).map_err(tar_err)?.starts_with(&[0x1f, 0x8b]);
    let counted = CountingReader { inner: input, done: Rc::clone(&done) };
    let reader: Box<dyn Read> = if is_gzip { Box::new(GzDecoder::new(counted)) } else { Box::new(counted) };

    let mut tar = tar::Archive::new(reader);
    tar.set_preserve_permissions(true);
    tar.set_preserve_ownerships(true);
    tar.set_preserve_mtime(true);
    tar.set_unpack_xattrs(true);
    tar.set_overwrite(true);

    // Directories are applied last, deepest first, so a read-only or
    // older-mtime directory entry does not get in the way of (or get its
    // mtime bumped by) the entries created inside it.
    let mut directories = Vec::new();
    for entry in tar.entries().map_err(tar_err)? {
        let mut entry = entry.map_err(tar_err)?;
        let path = entry.path().map_err(tar_err)?.into_owned();
        if path.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(BuildError::TarEntryEscapes { entry: path.display().to_string() });
        }
        if entry.header().entry_type().is_dir() {
            directories.push(entry);
            continue;
        }
        unpack_entry(&mut entry, root, &path, tar_err)?;
        // Position in the archive file (compressed bytes for a tar.gz), so
        // `total` is known up front.
        progress.advance(done.get().min(total), Some(total), Unit::Bytes);
    }
    directories.sort_by(|a, b| b.path_bytes().cmp(&a.path_bytes()));
    for mut dir in directories {
        let path = dir.path().map_err(tar_err)?.into_owned();
        unpack_entry(&mut dir, root, &path, tar_err)?;
    }
    progress.advance(total, Some(total), Unit::Bytes);
    Ok(())
}

fn unpack_entry<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    root: &Path,
    path: &Path,
    tar_err: impl Fn(io::Error) -> BuildError,
) -> Result<(), BuildError> {
    unpack_entry_in(entry, root).map_err(|e| match e {
        UnpackError::Escapes => BuildError::TarEntryEscapes { entry: path.display().to_string() },
        UnpackError::Io(e) => tar_err(e),
    })
}

/// Why an entry was not unpacked.
pub(crate) enum UnpackError {
    /// It would land outside `root` (through `..`, a symlink or a hard link).
    Escapes,
    Io(io::Error),
}

/// Unpacks one entry under `root`. The tar crate refuses (with an error)
/// symlink and hard-link tricks that would land outside `root`, and skips
/// (returning false) what it considers outside; both are refusals for us.
pub(crate) fn unpack_entry_in<R: Read>(entry: &mut tar::Entry<'_, R>, root: &Path) -> Result<(), UnpackError> {
    match entry.unpack_in(root) {
        Ok(true) => Ok(()),
        Ok(false) => Err(UnpackError::Escapes),
        Err(e) if is_escape(&e) => Err(UnpackError::Escapes),
        Err(e) => Err(UnpackError::Io(e)),
    }
}

/// The tar crate has no error kind for "outside the destination"; it says
/// so in the message of the error or of one of its sources.
fn is_escape(e: &io::Error) -> bool {
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = cur {
        if err.to_string().contains("outside of destination") {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Counts the bytes read from the archive file (shared with the progress
/// reporting while the decoder owns the reader).
struct CountingReader<R> {
    inner: R,
    done: Rc<Cell<u64>>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done.set(self.done.get() + n as u64);
        Ok(n)
    }
}
