//! Import of OCI images: from an OCI image layout (a directory or its tar),
//! a `docker save` archive, or an OCI registry (`registry`); and push of
//! dsec images to an OCI registry (`push`).
//!
//! Each image becomes dsec layers: consecutive OCI layers are applied to one
//! scratch root until it holds `merge_below` bytes of layer data (the many
//! tiny layers of a Dockerfile cost one EROFS layer, not ten), OCI whiteouts
//! become deletions inside a group and overlayfs whiteouts across groups
//! (`apply`). Every blob is checked against its digest in the same pass
//! that unpacks it, and nothing is stored unless the whole image imported.

use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod apply;
mod build;
mod client;
mod export;
mod layer_tar;
mod layout;
pub mod push;
pub mod registry;
mod source;
mod spec;
mod verify;

pub use spec::{parse_platform, Platform};

use crate::build::{BuildError, BuildOptions};
use crate::digest::Digest;
use crate::progress::Progress;
use crate::reference::Reference;
use crate::store::{ImageError, ImageStore, ResolvedImage};

/// Consecutive OCI layers are merged into one dsec layer until the group
/// holds this many bytes of (compressed) layer data.
pub const DEFAULT_MERGE_BELOW: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("not an OCI image layout or `docker save` archive: {0}")]
    NotAnImage(String),
    #[error("the image names `{0}`, which is not in it")]
    MissingFile(String),
    #[error("{0}")]
    Ambiguous(String),
    #[error("no image for platform {wanted} (available: {available})")]
    NoMatchingPlatform { wanted: String, available: String },
    #[error("digest `{0}` is not supported (only sha256)")]
    UnsupportedDigest(String),
    #[error("{what}: digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch { what: String, expected: String, actual: String },
    #[error("{what}: expected {expected} bytes, got {actual}")]
    SizeMismatch { what: String, expected: u64, actual: u64 },
    #[error("{what}: invalid JSON: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("layer {layer}: entry `{entry}` would be written outside the root filesystem")]
    EntryEscapes { layer: String, entry: String },
    #[error("layer {layer}: {source}")]
    Layer {
        layer: String,
        #[source]
        source: io::Error,
    },
    #[error("no image name: the source names none, give one (`--name NAME[:TAG]`)")]
    NoName,
    #[error("invalid image name `{name}`: {reason}")]
    BadName { name: String, reason: String },
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Registry(#[from] registry::RegistryError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Store(#[from] ImageError),
}

/// What to import and how.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Store the image under this name; default: the name the source gives.
    pub reference: Option<Reference>,
    /// Which image of a source holding several (a tag such as `busybox:1`
    /// or a manifest digest).
    pub select: Option<String>,
    /// Which platform of a multi-platform image; default: this host's.
    pub platform: Option<Platform>,
    pub merge_below: u64,
    pub build: BuildOptions,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions { reference: None, select: None, platform: None, merge_below: DEFAULT_MERGE_BELOW, build: BuildOptions::default() }
    }
}

/// An imported image.
#[derive(Debug, Clone)]
pub struct Imported {
    pub reference: Reference,
    pub image: Arc<ResolvedImage>,
    /// OCI layers read, and dsec layers they became.
    pub source_layers: usize,
}

/// Imports the image in `path`: an OCI image layout directory, or a tar
/// (optionally gzip-compressed) of an OCI layout or of `docker save`.
pub fn import_path(store: &ImageStore, path: &Path, options: &ImportOptions, progress: &dyn Progress) -> Result<Imported, ImportError> {
    let meta = std::fs::metadata(path).map_err(|e| ImportError::Io { context: "reading", path: path.to_path_buf(), source: e })?;
    if meta.is_dir() {
        return layout::import_tree(store, &source::DirTree::new(path), options, progress);
    }
    // A compressed archive cannot be read in place: decompress it once into
    // the store's temp space (removed on every exit path).
    let _decompressed;
    let archive: &Path = if is_gzip(path)? {
        progress.stage(&format!("decompressing {}", path.display()));
        let temp = store.temp_file()?;
        let input = std::fs::File::open(path).map_err(|e| ImportError::Io { context: "reading", path: path.to_path_buf(), source: e })?;
        let mut out = temp.as_file();
        io::copy(&mut flate2::read::GzDecoder::new(BufReader::new(input)), &mut out).map_err(|e| ImportError::Io {
            context: "decompressing",
            path: path.to_path_buf(),
            source: e,
        })?;
        _decompressed = temp;
        _decompressed.path()
    } else {
        path
    };
    let tree = source::TarTree::index(archive)?;
    layout::import_tree(store, &tree, options, progress)
}

fn is_gzip(path: &Path) -> Result<bool, ImportError> {
    let mut head = [0u8; 2];
    let mut f = std::fs::File::open(path).map_err(|e| ImportError::Io { context: "reading", path: path.to_path_buf(), source: e })?;
    let n = f.read(&mut head).map_err(|e| ImportError::Io { context: "reading", path: path.to_path_buf(), source: e })?;
    Ok(n == 2 && head == [0x1f, 0x8b])
}

/// `sha256:<hex>` -> digest.
pub(crate) fn parse_digest(s: &str) -> Result<Digest, ImportError> {
    let hex = s.strip_prefix("sha256:").ok_or_else(|| ImportError::UnsupportedDigest(s.to_string()))?;
    Digest::from_hex(hex).map_err(|_| ImportError::UnsupportedDigest(s.to_string()))
}

/// The dsec name for a source's image name: `registry/ns/python:3.12` ->
/// `python:3.12` (the last path component, lowercased; tag kept).
pub fn derive_reference(source_name: &str) -> Result<Reference, ImportError> {
    let without_digest = source_name.split('@').next().unwrap_or_default();
    let last = without_digest.rsplit('/').next().unwrap_or_default();
    let (name, tag) = match last.split_once(':') {
        Some((n, t)) => (n, t),
        None => (last, crate::reference::DEFAULT_TAG),
    };
    if name.is_empty() {
        return Err(ImportError::NoName);
    }
    Reference::new(&name.to_ascii_lowercase(), tag)
        .map_err(|e| ImportError::BadName { name: source_name.to_string(), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_sources() {
        assert_eq!(derive_reference("docker.io/library/python:3.12").unwrap().to_string(), "python:3.12");
        assert_eq!(derive_reference("127.0.0.1:5000/team/Tool").unwrap().to_string(), "tool:latest");
        assert_eq!(derive_reference("busybox").unwrap().to_string(), "busybox:latest");
        assert!(derive_reference("").is_err());
    }
}
