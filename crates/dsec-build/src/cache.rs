//! The step cache. Every step's key chains its parent's key with what the
//! step is (its instruction as expanded, the environment it runs in, the
//! digests of the files it copies); a filesystem step's result is stored
//! as an ordinary image named for its key, so an unchanged rebuild finds
//! every step's image and runs nothing, and a change rebuilds only from
//! the first step whose key changed.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{io_err, BuildError};

/// Images of the step cache live under this repository name; listings
/// leave them out.
pub const CACHE_REPOSITORY: &str = "build-cache";

/// A key: hex sha256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key(pub String);

impl Key {
    pub fn root(what: &str) -> Key {
        Key(hex::encode(Sha256::digest(format!("dsec-build v1\n{what}").as_bytes())))
    }

    /// The key of a step that follows this one.
    pub fn then(&self, step: &str) -> Key {
        let mut h = Sha256::new();
        h.update(self.0.as_bytes());
        h.update(b"\n");
        h.update(step.as_bytes());
        Key(hex::encode(h.finalize()))
    }

    /// The image holding the result of the step with this key.
    pub fn reference(&self) -> String {
        format!("{CACHE_REPOSITORY}/{}:latest", &self.0[..48])
    }
}

/// Whether `reference` names an image of the step cache.
pub fn is_cache_image(reference: &str) -> bool {
    reference.starts_with(CACHE_REPOSITORY) && reference[CACHE_REPOSITORY.len()..].starts_with('/')
}

/// A digest of a context path and everything below it: names, kinds,
/// modes, link targets and file contents (not times: a fresh checkout of
/// the same files hits the cache).
pub fn digest_path(path: &Path) -> Result<String, BuildError> {
    let mut h = Sha256::new();
    feed(&mut h, path, "")?;
    Ok(hex::encode(h.finalize()))
}

fn feed(h: &mut Sha256, path: &Path, rel: &str) -> Result<(), BuildError> {
    let meta = fs::symlink_metadata(path).map_err(io_err("reading", path))?;
    let mode = meta.permissions().mode() & 0o7777;
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = fs::read_link(path).map_err(io_err("reading", path))?;
        h.update(format!("L {rel} {mode:o} {}\n", target.display()).as_bytes());
    } else if ft.is_dir() {
        h.update(format!("D {rel} {mode:o}\n").as_bytes());
        let mut children: Vec<_> =
            fs::read_dir(path).map_err(io_err("listing", path))?.collect::<Result<_, _>>().map_err(io_err("listing", path))?;
        children.sort_by_key(|e| e.file_name());
        for c in children {
            let name = c.file_name().to_string_lossy().into_owned();
            feed(h, &c.path(), &format!("{rel}/{name}"))?;
        }
    } else if ft.is_file() {
        h.update(format!("F {rel} {mode:o} {}\n", meta.size()).as_bytes());
        let mut f = fs::File::open(path).map_err(io_err("opening", path))?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = f.read(&mut buf).map_err(io_err("reading", path))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_chain_and_name_valid_images() {
        let a = Key::root("scratch");
        assert_eq!(a, Key::root("scratch"));
        assert_ne!(a.then("RUN x"), a.then("RUN y"));
        assert_eq!(a.then("RUN x").then("ENV a=b"), a.then("RUN x").then("ENV a=b"));
        let r = a.reference();
        assert!(r.parse::<dsec_image::Reference>().is_ok(), "{r}");
        assert!(is_cache_image(&r));
        assert!(!is_cache_image("build-cachex/y:latest"));
    }

    #[test]
    fn a_path_digest_follows_content_and_modes_not_times() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("a"), "1").unwrap();
        let first = digest_path(d.path()).unwrap();
        filetime_touch(&d.path().join("a"));
        assert_eq!(first, digest_path(d.path()).unwrap());
        fs::write(d.path().join("a"), "2").unwrap();
        assert_ne!(first, digest_path(d.path()).unwrap());
        let second = digest_path(d.path()).unwrap();
        fs::set_permissions(d.path().join("a"), fs::Permissions::from_mode(0o700)).unwrap();
        assert_ne!(second, digest_path(d.path()).unwrap());
    }

    fn filetime_touch(p: &Path) {
        let f = fs::File::options().append(true).open(p).unwrap();
        f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5)).unwrap();
    }
}
