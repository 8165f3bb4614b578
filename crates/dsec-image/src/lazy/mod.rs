//! On-demand loading of layers from a shared store: metadata (manifests,
//! chunk tables) is fetched up front, file data chunk by chunk when first
//! read. [`ChunkTable`] is the integrity root of a partial blob,
//! [`LazyBlob`] its sparse local cache, [`LazyLayers`] the FUSE mount
//! that serves blobs as files for EROFS file-backed mounts, and
//! [`resolve_lazily`] turns an image of the shared store into layers a
//! node can mount before any of their data is local.

mod blob;
mod chunks;
mod fs;

use std::path::PathBuf;
use std::sync::Arc;

pub use blob::{remove_leftover_partials, BlobStats, LazyBlob, LazyError};
pub use chunks::{ChunkError, ChunkTable, DEFAULT_CHUNK_SIZE};
pub use fs::LazyLayers;

use crate::digest::Digest;
use crate::manifest::Manifest;
use crate::reference::Reference;
use crate::shared::SharedStore;
use crate::store::{ImageError, ImageStore, ResolvedImage, ResolvedLayer};

/// How a lazily resolved image's layers were obtained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LazyStats {
    /// Layers already in the node's store.
    pub local: usize,
    /// Layers now served on demand.
    pub on_demand: usize,
    /// Layers without a chunk table (pushed by an older dsec): copied whole.
    pub copied: usize,
}

/// Resolves `reference` from `shared` without fetching layer data: each
/// layer is the node's own blob if it has one, else a file of `layers`
/// whose chunks are fetched when read (its chunk table checked against the
/// manifest first). A layer without a chunk table is copied whole.
///
/// The manifest and the chunk tables are kept in the node's store (the
/// manifest as an image whose blobs arrive on demand), so a restarted node
/// describes and resolves the image again without asking `shared`: only
/// chunk data comes from there.
pub fn resolve_lazily(
    shared: &Arc<SharedStore>,
    local: &Arc<ImageStore>,
    layers: &LazyLayers,
    reference: &Reference,
) -> Result<(ResolvedImage, LazyStats), ImageError> {
    let manifest = manifest_for(shared, local, reference)?;
    let mut stats = LazyStats::default();
    let mut resolved = Vec::with_capacity(manifest.layers.len());
    for layer in &manifest.layers {
        let path: PathBuf = if local.has_blob(&layer.digest) {
            stats.local += 1;
            local.blob_path(&layer.digest)
        } else if let Some(blob) = layers.get(&layer.digest) {
            stats.on_demand += 1;
            layers.mountpoint().join(format!("{}.erofs", blob.digest().hex()))
        } else if let Some(table_digest) = manifest.chunk_tables.get(&layer.digest) {
            let table = chunk_table(shared, local, &layer.digest, table_digest, layer.size)?;
            let blob = LazyBlob::new(layer.digest, table, Arc::clone(shared), Arc::clone(local))
                .map_err(|e| ImageError::SharedStore { store: shared.describe(), message: e.to_string() })?;
            stats.on_demand += 1;
            layers.add(blob)
        } else {
            stats.copied += 1;
            local.put_layer_from_reader(shared.blob_reader(&layer.digest)?, Some(&layer.digest))?.path
        };
        resolved.push(ResolvedLayer { digest: layer.digest, kind: layer.kind, size: layer.size, path });
    }
    Ok((ResolvedImage { reference: reference.clone(), manifest, layers: resolved }, stats))
}

/// The node's own copy of the manifest when it can serve every missing
/// layer on demand (it has a chunk table digest for each); else the shared
/// store's, which is then kept.
///
/// A node's own image of the same name but other layers (built here, its
/// blobs evicted since) is never overwritten: it is used as the shared
/// store describes it, as before this node kept manifests.
fn manifest_for(shared: &SharedStore, local: &ImageStore, reference: &Reference) -> Result<Manifest, ImageError> {
    let own = match local.stored_manifest(reference) {
        Ok(m) if m.layers.iter().all(|l| local.has_blob(&l.digest) || m.chunk_tables.contains_key(&l.digest)) => {
            return Ok(m);
        }
        Ok(m) => Some(m),
        Err(ImageError::ImageNotFound(_)) => None,
        Err(e) => return Err(e),
    };
    let manifest = shared.manifest(reference)?;
    if own.is_none_or(|m| m.layers == manifest.layers) {
        local.put_on_demand_image(reference, &manifest)?;
    }
    Ok(manifest)
}

/// The chunk table of `blob`, checked against the manifest's digest for
/// it: the node's copy if it has a good one, else the shared store's, then
/// kept.
fn chunk_table(
    shared: &SharedStore,
    local: &ImageStore,
    blob: &Digest,
    table_digest: &Digest,
    blob_size: u64,
) -> Result<ChunkTable, ImageError> {
    if let Ok(bytes) = std::fs::read(local.chunk_table_path(blob)) {
        match ChunkTable::from_trusted_bytes(&bytes, table_digest, blob, blob_size) {
            Ok(table) => return Ok(table),
            Err(e) => tracing::warn!(layer = %blob, error = %e, "the node's copy of a chunk table is bad; fetching it again"),
        }
    }
    let bytes = shared.chunk_table(blob)?;
    let table = ChunkTable::from_trusted_bytes(&bytes, table_digest, blob, blob_size)?;
    local.put_chunk_table(blob, &bytes)?;
    Ok(table)
}
