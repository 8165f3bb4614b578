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

pub use blob::{BlobStats, LazyBlob, LazyError};
pub use chunks::{ChunkError, ChunkTable, DEFAULT_CHUNK_SIZE};
pub use fs::LazyLayers;

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
pub fn resolve_lazily(
    shared: &Arc<SharedStore>,
    local: &Arc<ImageStore>,
    layers: &LazyLayers,
    reference: &Reference,
) -> Result<(ResolvedImage, LazyStats), ImageError> {
    let manifest = shared.manifest(reference)?;
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
            let bytes = shared.chunk_table(&layer.digest)?;
            let table = ChunkTable::from_trusted_bytes(&bytes, table_digest, &layer.digest, layer.size)?;
            let blob = LazyBlob::new(layer.digest, table, Arc::clone(shared), Arc::clone(local)).map_err(|e| {
                ImageError::SharedStore { store: shared.describe(), message: e.to_string() }
            })?;
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
