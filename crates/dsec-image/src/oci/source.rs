//! Where an import reads its files from: an OCI image layout directory, or
//! an archive (an OCI layout as a tar, or `docker save`'s tar) read in
//! place through an index of member offsets, so a layer is never copied
//! out of the archive before it is applied.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use super::ImportError;

/// Largest JSON document (index, manifest, config) an import reads.
pub(crate) const MAX_JSON_BYTES: u64 = 16 << 20;

/// Read access to the files of an image archive or directory.
pub(crate) trait Tree {
    fn exists(&self, path: &str) -> bool;
    /// Opens `path` (relative, `/`-separated) with its size.
    fn open(&self, path: &str) -> Result<(Box<dyn Read + '_>, u64), ImportError>;

    fn read_small(&self, path: &str) -> Result<Vec<u8>, ImportError> {
        let (reader, size) = self.open(path)?;
        if size > MAX_JSON_BYTES {
            return Err(ImportError::NotAnImage(format!("{path} is {size} bytes, more than a metadata file can be")));
        }
        let mut out = Vec::with_capacity(size as usize);
        reader.take(MAX_JSON_BYTES).read_to_end(&mut out).map_err(|e| ImportError::Io {
            context: "reading",
            path: PathBuf::from(path),
            source: e,
        })?;
        Ok(out)
    }
}

/// A relative path that stays inside the tree.
fn clean(path: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// An OCI image layout on disk.
pub(crate) struct DirTree {
    root: PathBuf,
}

impl DirTree {
    pub(crate) fn new(root: &Path) -> DirTree {
        DirTree { root: root.to_path_buf() }
    }

    fn resolve(&self, path: &str) -> Option<PathBuf> {
        clean(path).map(|p| self.root.join(p))
    }
}

impl Tree for DirTree {
    fn exists(&self, path: &str) -> bool {
        self.resolve(path).is_some_and(|p| p.is_file())
    }

    fn open(&self, path: &str) -> Result<(Box<dyn Read + '_>, u64), ImportError> {
        let full = self.resolve(path).ok_or_else(|| ImportError::NotAnImage(format!("path `{path}` leaves the layout")))?;
        let file = File::open(&full).map_err(|e| missing_or_io(path, &full, e))?;
        let size = file.metadata().map_err(|e| missing_or_io(path, &full, e))?.len();
        Ok((Box::new(BufReader::with_capacity(1 << 20, file)), size))
    }
}

fn missing_or_io(name: &str, full: &Path, e: io::Error) -> ImportError {
    if e.kind() == io::ErrorKind::NotFound {
        ImportError::MissingFile(name.to_string())
    } else {
        ImportError::Io { context: "opening", path: full.to_path_buf(), source: e }
    }
}

/// An uncompressed tar read in place: members are found by an index built
/// in one pass over the headers.
pub(crate) struct TarTree {
    archive: PathBuf,
    members: HashMap<PathBuf, Member>,
}

enum Member {
    File {
        offset: u64,
        size: u64,
    },
    /// `docker save` links repeated layers to their first copy.
    Symlink(PathBuf),
}

impl TarTree {
    pub(crate) fn index(archive: &Path) -> Result<TarTree, ImportError> {
        let io_err = |e: io::Error| ImportError::Io { context: "reading archive", path: archive.to_path_buf(), source: e };
        let file = File::open(archive).map_err(io_err)?;
        let mut tar = tar::Archive::new(file);
        let mut members = HashMap::new();
        for entry in tar.entries().map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let name = entry.path().map_err(io_err)?.to_string_lossy().into_owned();
            let Some(path) = clean(&name) else { continue };
            let kind = entry.header().entry_type();
            if kind.is_file() || kind == tar::EntryType::Continuous {
                members.insert(path, Member::File { offset: entry.raw_file_position(), size: entry.size() });
            } else if kind.is_symlink() {
                if let Some(target) = entry.link_name().map_err(io_err)? {
                    members.insert(path, Member::Symlink(target.into_owned()));
                }
            }
        }
        Ok(TarTree { archive: archive.to_path_buf(), members })
    }

    /// Follows member symlinks (relative to the link's directory).
    fn find(&self, path: &str) -> Option<(u64, u64)> {
        let mut cur = clean(path)?;
        for _ in 0..8 {
            match self.members.get(&cur)? {
                Member::File { offset, size } => return Some((*offset, *size)),
                Member::Symlink(target) => {
                    let joined = cur.parent().unwrap_or(Path::new("")).join(target);
                    cur = normalize(&joined)?;
                }
            }
        }
        None
    }
}

/// Resolves `..` lexically; `None` if it climbs above the top.
fn normalize(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(x) => out.push(x),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            _ => return None,
        }
    }
    Some(out)
}

impl Tree for TarTree {
    fn exists(&self, path: &str) -> bool {
        self.find(path).is_some()
    }

    fn open(&self, path: &str) -> Result<(Box<dyn Read + '_>, u64), ImportError> {
        let (offset, size) = self.find(path).ok_or_else(|| ImportError::MissingFile(path.to_string()))?;
        let io_err = |e: io::Error| ImportError::Io { context: "reading archive", path: self.archive.clone(), source: e };
        let mut file = File::open(&self.archive).map_err(io_err)?;
        file.seek(SeekFrom::Start(offset)).map_err(io_err)?;
        Ok((Box::new(BufReader::with_capacity(1 << 20, file).take(size)), size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_members_are_read_in_place_and_links_followed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tar");
        let mut b = tar::Builder::new(File::create(&path).unwrap());
        let mut h = tar::Header::new_gnu();
        h.set_size(5);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h.clone(), "one/layer.tar", &b"hello"[..]).unwrap();
        let mut l = tar::Header::new_gnu();
        l.set_entry_type(tar::EntryType::Symlink);
        l.set_size(0);
        b.append_link(&mut l, "two/layer.tar", "../one/layer.tar").unwrap();
        let mut e = tar::Header::new_gnu();
        e.set_entry_type(tar::EntryType::Symlink);
        e.set_size(0);
        b.append_link(&mut e, "evil", "../../etc/passwd").unwrap();
        b.into_inner().unwrap();

        let t = TarTree::index(&path).unwrap();
        let mut s = String::new();
        t.open("two/layer.tar").unwrap().0.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        assert!(t.exists("./one/layer.tar"));
        assert!(!t.exists("evil"));
        assert!(matches!(t.open("nope"), Err(ImportError::MissingFile(_))));
    }

    #[test]
    fn dir_tree_stays_inside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.json"), b"{}").unwrap();
        let t = DirTree::new(dir.path());
        assert!(t.exists("index.json"));
        assert!(!t.exists("../index.json"));
        assert!(t.open("/etc/passwd").is_err());
    }
}
