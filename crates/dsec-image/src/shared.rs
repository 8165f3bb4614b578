//! A store shared by many nodes: an image store directory on a shared POSIX
//! filesystem (NFS, CephFS, a FUSE-mounted 3FS), the same layout as a
//! node's own store. `dsec image push` copies an image into it; an edge
//! started with `--shared-store DIR` fetches the images it does not have
//! from it, whole layers at a time (eager), into its own store, which then
//! acts as the node's cache (bounded by `--image-cache-mb`, least recently
//! used layers evicted first).
//!
//! Every blob fetched is verified against its digest as it is copied (the
//! store's `put_layer_from_reader`): a corrupt or truncated blob on the
//! shared filesystem is an error, never a layer a sandbox mounts. Writes
//! never go from a node to the shared store except by an explicit push.

use std::collections::HashSet;
use std::fs::File;

use crate::digest::Digest;
use crate::progress::{Progress, Unit};
use crate::reference::Reference;
use crate::store::{ImageError, ImageStore};

/// What one copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyStats {
    pub layers_copied: usize,
    pub bytes_copied: u64,
    /// Layers the destination already had (shared with other images).
    pub layers_present: usize,
}

/// Copies `reference` (its manifest and the layers `to` lacks) from one
/// store to another. The manifest is written last, so the image appears in
/// `to` only once all its layers are there and verified.
pub fn copy_image(
    from: &ImageStore,
    to: &ImageStore,
    reference: &Reference,
    progress: &dyn Progress,
) -> Result<CopyStats, ImageError> {
    let image = from.resolve_ref(reference)?;
    let _lock = to.write_lock()?;
    let mut stats = CopyStats::default();
    let total: u64 = image
        .layers
        .iter()
        .filter(|l| !to.has_blob(&l.digest))
        .map(|l| l.size)
        .sum();
    for layer in &image.layers {
        if to.has_blob(&layer.digest) {
            stats.layers_present += 1;
            continue;
        }
        progress.stage(&format!("layer sha256:{}", &layer.digest.hex()[..12]));
        let file = File::open(&layer.path).map_err(|source| ImageError::Io {
            context: "opening layer",
            path: layer.path.clone(),
            source,
        })?;
        let counted = Counted {
            inner: file,
            done: stats.bytes_copied,
            total,
            progress,
        };
        let stored = to.put_layer_from_reader(counted, Some(&layer.digest))?;
        stats.layers_copied += 1;
        stats.bytes_copied += stored.size;
    }
    to.put_image(reference, &image.manifest)?;
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
    shared: &ImageStore,
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
        if keep.contains(&digest) || !shared.has_blob(&digest) {
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
