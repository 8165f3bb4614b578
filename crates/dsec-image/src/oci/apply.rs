//! Applies OCI layer tars, in order, to one scratch root that becomes one
//! EROFS layer ("a group" of consecutive OCI layers).
//!
//! OCI layers delete with whiteouts: an entry `.wh.NAME` removes `NAME` of
//! the layers below, and `.wh..wh..opq` in a directory hides everything the
//! layers below put in it. Both apply only to *lower* layers: an entry of
//! the same layer is never hidden, wherever it sits in the archive.
//!
//! Inside a group the layers are flattened: a whiteout deletes the file from
//! the scratch root. What lies below the group (earlier groups, stored as
//! their own EROFS layers) is hidden with overlayfs' own conventions, which
//! overlayfs honours in lower layers too: a whiteout is a character device
//! 0:0, an opaque directory carries `trusted.overlay.opaque=y`.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{makedev, mknodat, FileType, Mode, XattrFlags, CWD};

use super::ImportError;

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
const OVERLAY_OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// A scratch root being filled with one group of layers.
pub(crate) struct GroupRoot {
    root: PathBuf,
    /// Whether earlier groups lie below this one in the final overlay: then
    /// deletions must be recorded as overlay whiteouts, not only applied.
    has_lower: bool,
}

impl GroupRoot {
    pub(crate) fn new(root: PathBuf, has_lower: bool) -> GroupRoot {
        GroupRoot { root, has_lower }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.root
    }

    /// Applies one uncompressed layer tar. Reads `reader` to its end (so a
    /// hashing reader below sees every byte) and reports the number of
    /// tar entries applied.
    pub(crate) fn apply(&self, reader: impl Read, label: &str) -> Result<u64, ImportError> {
        let mut archive = tar::Archive::new(reader);
        archive.set_preserve_permissions(true);
        archive.set_preserve_ownerships(true);
        archive.set_preserve_mtime(true);
        archive.set_unpack_xattrs(true);
        archive.set_overwrite(true);
        let tar_err = |e: io::Error| ImportError::Layer { layer: label.to_string(), source: e };

        let mut layer = LayerState::default();
        let mut directories = Vec::new();
        let mut count = 0u64;
        for entry in archive.entries().map_err(tar_err)? {
            let mut entry = entry.map_err(tar_err)?;
            let raw = entry.path().map_err(tar_err)?.into_owned();
            let Some(path) =
                clean(&raw).ok_or_else(|| ImportError::EntryEscapes { layer: label.to_string(), entry: raw.display().to_string() })?
            else {
                continue; // the layer's `./` itself
            };
            count += 1;
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            let parent = path.parent().unwrap_or(Path::new("")).to_path_buf();
            if name == OPAQUE_MARKER {
                self.make_dir(&parent).map_err(tar_err)?;
                self.hide_lower_content(&parent, &layer).map_err(tar_err)?;
                continue;
            }
            if let Some(target) = name.strip_prefix(WHITEOUT_PREFIX) {
                if target.starts_with(".wh.") || target.is_empty() {
                    continue; // aufs bookkeeping (`.wh..wh.plnk` ...), not a deletion
                }
                self.whiteout(&parent.join(target), &layer).map_err(tar_err)?;
                continue;
            }

            let is_dir = entry.header().entry_type().is_dir();
            self.make_way(&path, &parent, is_dir).map_err(tar_err)?;
            layer.added.insert(path.clone());
            if is_dir {
                // Applied after the files in it, deepest first, so its mode
                // and mtime are the ones the archive gives (see build/tar.rs).
                let dir = self.root.join(&path);
                if !dir.is_dir() {
                    fs::create_dir(&dir).map_err(tar_err)?;
                }
                directories.push((path, entry));
                continue;
            }
            unpack(&mut entry, &self.root, &path, label)?;
        }
        directories.sort_by(|a, b| b.0.cmp(&a.0));
        for (path, mut dir) in directories {
            unpack(&mut dir, &self.root, &path, label)?;
        }
        // The two zero blocks that end a tar (and any padding after them)
        // are never read by the entry iterator; the digest covers them.
        io::copy(&mut archive.into_inner(), &mut io::sink()).map_err(tar_err)?;
        Ok(count)
    }

    /// `.wh.NAME`: NAME of the layers below is gone.
    fn whiteout(&self, target: &Path, layer: &LayerState) -> io::Result<()> {
        let abs = self.root.join(target);
        if layer.added.contains(target) {
            // The same layer also adds NAME: the whiteout hides only what
            // was below, which for a directory means its old content.
            if abs.symlink_metadata().map(|m| m.is_dir()).unwrap_or(false) {
                self.hide_lower_content(target, layer)?;
            }
            return Ok(());
        }
        remove_any(&abs)?;
        if self.has_lower {
            if let Some(parent) = target.parent() {
                self.make_dir(parent)?;
            }
            make_whiteout(&abs)?;
        }
        Ok(())
    }

    /// `.wh..wh..opq` in `dir`: what the layers below put in `dir` is
    /// hidden; what this layer adds stays.
    fn hide_lower_content(&self, dir: &Path, layer: &LayerState) -> io::Result<()> {
        clear_except(&self.root, dir, &layer.added)?;
        if self.has_lower {
            set_opaque(&self.root.join(dir))?;
        }
        Ok(())
    }

    /// Before an entry is unpacked at `path`: a directory replaces whatever
    /// non-directory is there (an earlier file, or a whiteout, in which case
    /// the new directory must also hide the lower one's content); a
    /// non-directory replaces a directory tree. Parents that are not
    /// directories (a whiteout of the directory in an earlier layer of the
    /// group) are turned back into directories.
    fn make_way(&self, path: &Path, parent: &Path, is_dir: bool) -> io::Result<()> {
        if !parent.as_os_str().is_empty() && !self.root.join(parent).is_dir() {
            self.make_dir(parent)?;
        }
        let abs = self.root.join(path);
        let Ok(meta) = abs.symlink_metadata() else {
            return Ok(());
        };
        if is_dir {
            if !meta.is_dir() {
                let was_whiteout = is_whiteout(&meta);
                fs::remove_file(&abs)?;
                fs::create_dir(&abs)?;
                if was_whiteout && self.has_lower {
                    set_opaque(&abs)?;
                }
            }
        } else if meta.is_dir() {
            fs::remove_dir_all(&abs)?;
        } else {
            fs::remove_file(&abs)?;
        }
        Ok(())
    }

    /// Makes `rel` and its parents directories, replacing whiteouts on the
    /// way (a directory deleted by an earlier layer of the group and now
    /// written into again: its lower content stays hidden).
    fn make_dir(&self, rel: &Path) -> io::Result<()> {
        let mut cur = self.root.clone();
        for part in rel.components() {
            cur.push(part);
            match cur.symlink_metadata() {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() && cur.is_dir() => {
                    // e.g. /lib -> usr/lib: the tar crate checks that the
                    // resolved parent stays inside the root.
                }
                Ok(m) => {
                    let was_whiteout = is_whiteout(&m);
                    fs::remove_file(&cur)?;
                    fs::create_dir(&cur)?;
                    if was_whiteout && self.has_lower {
                        set_opaque(&cur)?;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(&cur)?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// What one layer has done so far.
#[derive(Default)]
struct LayerState {
    /// Paths this layer added (never hidden by its own whiteouts).
    added: HashSet<PathBuf>,
}

fn unpack<R: Read>(entry: &mut tar::Entry<'_, R>, root: &Path, path: &Path, label: &str) -> Result<(), ImportError> {
    crate::build::unpack_entry_in(entry, root).map_err(|e| match e {
        crate::build::UnpackError::Escapes => ImportError::EntryEscapes { layer: label.to_string(), entry: path.display().to_string() },
        crate::build::UnpackError::Io(source) => ImportError::Layer { layer: label.to_string(), source },
    })
}

/// A relative path without `.` parts; `None` for one that climbs out with
/// `..`; `Some(None)` for the root itself.
fn clean(raw: &Path) -> Option<Option<PathBuf>> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(if out.as_os_str().is_empty() { None } else { Some(out) })
}

/// Removes everything in `root/dir` that `keep` does not name (recursing
/// into kept directories, whose older content goes too).
fn clear_except(root: &Path, dir: &Path, keep: &HashSet<PathBuf>) -> io::Result<()> {
    let abs = root.join(dir);
    let entries = match fs::read_dir(&abs) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let rel = dir.join(entry.file_name());
        let is_dir = entry.file_type()?.is_dir();
        if keep.contains(&rel) {
            if is_dir {
                clear_except(root, &rel, keep)?;
            }
        } else if is_dir {
            fs::remove_dir_all(entry.path())?;
        } else {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

fn remove_any(path: &Path) -> io::Result<()> {
    match path.symlink_metadata() {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn is_whiteout(meta: &fs::Metadata) -> bool {
    meta.file_type().is_char_device() && meta.rdev() == 0
}

fn make_whiteout(path: &Path) -> io::Result<()> {
    mknodat(CWD, path, FileType::CharacterDevice, Mode::empty(), makedev(0, 0))?;
    Ok(())
}

fn set_opaque(dir: &Path) -> io::Result<()> {
    rustix::fs::setxattr(dir, OVERLAY_OPAQUE_XATTR, b"y", XattrFlags::empty())?;
    Ok(())
}
