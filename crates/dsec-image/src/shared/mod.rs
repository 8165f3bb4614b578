//! A store shared by many nodes, in two flavours: an image store directory
//! on a shared POSIX filesystem (NFS, CephFS, a FUSE-mounted 3FS; the same
//! layout as a node's own store) and an S3-compatible object store (the
//! same layout as object keys, [`s3`]). `dsec image push` copies an image
//! into it, with a chunk table per layer (`lazy::ChunkTable`); an edge
//! started with `--shared-store` reads the images it does not have from
//! it, on demand chunk by chunk (`lazy`) or whole layers at a time
//! (eager, [`fetch_image`]), into its own store, which then acts as the
//! node's cache (bounded by `--image-cache-mb`, least recently used layers
//! evicted first).
//!
//! Every blob fetched is verified against its digest as it is copied (the
//! store's `put_layer_from_reader`), every chunk against its table: a
//! corrupt or truncated blob in the shared store is an error, never a
//! layer a sandbox mounts. Writes never go from a node to the shared store
//! except by an explicit push.

pub mod s3;
mod sigv4;
mod store;

use std::collections::HashSet;
use std::fs::File;
use std::io::BufReader;

pub use s3::S3Options;
pub use store::SharedStore;

use crate::digest::Digest;
use crate::lazy::{ChunkTable, DEFAULT_CHUNK_SIZE};
use crate::progress::{Progress, Unit};
use crate::reference::Reference;
use crate::store::{io_err, ImageError, ImageStore};

/// What one copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyStats {
    pub layers_copied: usize,
    pub bytes_copied: u64,
    /// Layers the destination already had (shared with other images).
    pub layers_present: usize,
}

/// Copies `reference` (its manifest and the layers `to` lacks) from a
/// shared store into a node's store, each blob checked against its digest
/// as it streams in. The manifest is written last, so the image appears in
/// `to` only once all its layers are there and verified.
pub fn fetch_image(from: &SharedStore, to: &ImageStore, reference: &Reference, progress: &dyn Progress) -> Result<CopyStats, ImageError> {
    let manifest = from.manifest(reference)?;
    let _lock = to.write_lock()?;
    let mut stats = CopyStats::default();
    let total: u64 = manifest.layers.iter().filter(|l| !to.has_blob(&l.digest)).map(|l| l.size).sum();
    for layer in &manifest.layers {
        if to.has_blob(&layer.digest) {
            stats.layers_present += 1;
            continue;
        }
        progress.stage(&format!("layer sha256:{}", &layer.digest.hex()[..12]));
        let counted = Counted { inner: from.blob_reader(&layer.digest)?, done: stats.bytes_copied, total, progress };
        let stored = to.put_layer_from_reader(counted, Some(&layer.digest))?;
        stats.layers_copied += 1;
        stats.bytes_copied += stored.size;
    }
    to.put_image(reference, &manifest)?;
    Ok(stats)
}

/// Copies `reference` from a node's store into a shared store: the layers
/// it lacks, a chunk table for every layer (so nodes can load it on
/// demand), then the manifest, which records the tables' digests.
pub fn push_image(from: &ImageStore, to: &SharedStore, reference: &Reference, progress: &dyn Progress) -> Result<CopyStats, ImageError> {
    let image = from.resolve_ref(reference)?;
    let mut manifest = image.manifest.clone();
    let mut stats = CopyStats::default();
    let total: u64 = image.layers.iter().map(|l| l.size).sum();
    let mut done = 0;
    for layer in &image.layers {
        progress.stage(&format!("layer sha256:{}", &layer.digest.hex()[..12]));
        // Indexing re-reads the local blob and checks its digest on the way.
        let file = File::open(&layer.path).map_err(io_err("opening layer", &layer.path))?;
        let table = ChunkTable::build(BufReader::with_capacity(1 << 20, file), DEFAULT_CHUNK_SIZE, &layer.digest)?;
        if to.has_blob(&layer.digest)? {
            stats.layers_present += 1;
        } else {
            stats.bytes_copied += to.put_blob(&layer.digest, &layer.path)?;
            stats.layers_copied += 1;
        }
        let bytes = table.to_bytes();
        to.put_chunk_table(&layer.digest, &bytes)?;
        manifest.chunk_tables.insert(layer.digest, table.digest());
        done += layer.size;
        progress.advance(done, Some(total), Unit::Bytes);
    }
    to.put_manifest(reference, &manifest)?;
    Ok(stats)
}

/// Deletes least recently used layer blobs of `store` until its blobs take
/// at most `limit_bytes`, sparing `keep` (layers in use) and blobs the
/// shared store does not hold (they could not be fetched again). `order`
/// lists digests from least to most recently used; blobs it does not name
/// go first. Manifests stay: an image whose layer was evicted is fetched
/// again on its next use. Returns the bytes freed.
pub fn evict(
    store: &ImageStore,
    shared: &SharedStore,
    limit_bytes: u64,
    order: &[Digest],
    keep: &HashSet<Digest>,
) -> Result<u64, ImageError> {
    let mut blobs = store.blobs()?;
    let mut used: u64 = blobs.iter().map(|(_, s)| s).sum();
    if used <= limit_bytes {
        return Ok(0);
    }
    let rank = |d: &Digest| order.iter().position(|o| o == d).map_or(0, |p| p + 1);
    blobs.sort_by_key(|(d, _)| rank(d));
    let mut freed = 0;
    for (digest, size) in blobs {
        if used <= limit_bytes {
            break;
        }
        if keep.contains(&digest) || !shared.has_blob(&digest)? {
            continue;
        }
        if store.remove_blob(&digest)? {
            used -= size;
            freed += size;
        }
    }
    Ok(freed)
}

struct Counted<'p, R> {
    inner: R,
    done: u64,
    total: u64,
    progress: &'p dyn Progress,
}

impl<R: std::io::Read> std::io::Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        self.progress.advance(self.done, Some(self.total), Unit::Bytes);
        Ok(n)
    }
}
