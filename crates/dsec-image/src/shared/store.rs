//! The two flavours of a store many nodes share, behind one concrete type:
//! a directory on a shared POSIX filesystem (an [`ImageStore`] layout) and
//! an S3-compatible object store (the same layout as object keys). Nodes
//! only read from it; `push` is the one writer.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::s3::{S3Options, S3Store};
use crate::digest::Digest;
use crate::manifest::Manifest;
use crate::reference::Reference;
use crate::store::{io_err, ImageError, ImageStore};

pub enum SharedStore {
    Dir(ImageStore),
    S3(S3Store),
}

impl SharedStore {
    /// `s3://bucket[/prefix]` opens an object store (endpoint and
    /// credentials from `s3`); anything else is a directory.
    pub fn open(location: &str, s3: &S3Options) -> Result<SharedStore, ImageError> {
        match location.strip_prefix("s3://") {
            Some(rest) => Ok(SharedStore::S3(S3Store::new(rest, s3)?)),
            None => Ok(SharedStore::Dir(ImageStore::open(location)?)),
        }
    }

    /// For messages and logs.
    pub fn describe(&self) -> String {
        match self {
            SharedStore::Dir(s) => s.root().display().to_string(),
            SharedStore::S3(s) => s.describe(),
        }
    }

    /// The manifest of `reference` (`ImageNotFound` if the store lacks it).
    pub fn manifest(&self, reference: &Reference) -> Result<Manifest, ImageError> {
        match self {
            SharedStore::Dir(s) => Ok(s.resolve_ref(reference)?.manifest.clone()),
            SharedStore::S3(s) => s.manifest(reference),
        }
    }

    pub fn has_blob(&self, digest: &Digest) -> Result<bool, ImageError> {
        match self {
            SharedStore::Dir(s) => Ok(s.has_blob(digest)),
            SharedStore::S3(s) => s.has_blob(digest),
        }
    }

    /// The whole blob as a stream (eager fetch; the caller checks the digest).
    pub fn blob_reader(&self, digest: &Digest) -> Result<Box<dyn Read + Send>, ImageError> {
        match self {
            SharedStore::Dir(s) => {
                let path = s.blob_path(digest);
                Ok(Box::new(File::open(&path).map_err(io_err("opening layer", &path))?))
            }
            SharedStore::S3(s) => s.blob_reader(digest),
        }
    }

    /// `len` bytes of the blob from `offset` (one chunk of an on-demand
    /// read; a ranged GET on S3). A short answer is an error.
    pub fn read_range(&self, digest: &Digest, offset: u64, len: u64) -> Result<Vec<u8>, ImageError> {
        match self {
            SharedStore::Dir(s) => {
                let path = s.blob_path(digest);
                let file = File::open(&path).map_err(io_err("opening layer", &path))?;
                let mut buf = vec![0u8; len as usize];
                file.read_exact_at(&mut buf, offset).map_err(io_err("reading layer", &path))?;
                Ok(buf)
            }
            SharedStore::S3(s) => s.read_range(digest, offset, len),
        }
    }

    /// The chunk table `push` wrote next to the blob (unchecked bytes: the
    /// caller checks them against the manifest).
    pub fn chunk_table(&self, digest: &Digest) -> Result<Vec<u8>, ImageError> {
        match self {
            SharedStore::Dir(s) => {
                let path = s.chunk_table_path(digest);
                std::fs::read(&path).map_err(io_err("reading chunk table", &path))
            }
            SharedStore::S3(s) => s.chunk_table(digest),
        }
    }

    pub(crate) fn put_blob(&self, digest: &Digest, path: &Path) -> Result<u64, ImageError> {
        match self {
            SharedStore::Dir(s) => Ok(s.put_layer_from_file(path, Some(digest))?.size),
            SharedStore::S3(s) => s.put_blob(digest, path),
        }
    }

    pub(crate) fn put_chunk_table(&self, digest: &Digest, bytes: &[u8]) -> Result<(), ImageError> {
        match self {
            SharedStore::Dir(s) => s.put_chunk_table(digest, bytes),
            SharedStore::S3(s) => s.put_chunk_table(digest, bytes),
        }
    }

    /// Written last by a push, so the image appears only once complete.
    pub(crate) fn put_manifest(&self, reference: &Reference, manifest: &Manifest) -> Result<(), ImageError> {
        match self {
            SharedStore::Dir(s) => s.put_image(reference, manifest),
            SharedStore::S3(s) => s.put_manifest(reference, manifest),
        }
    }
}
