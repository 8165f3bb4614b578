//! Turns a list of OCI layer blobs into dsec EROFS layers and an image
//! manifest: groups of consecutive layers, each applied to a scratch root,
//! checked against its digests, and run through mkfs.

use std::io::{BufReader, Read};
use std::sync::Arc;

use super::apply::GroupRoot;
use super::layout::image_config;
use super::push::ANNOTATION_LAYER_KIND;
use super::spec::{Descriptor, ImageConfigBlob};
use super::verify::{sniff, Compression, Hashing};
use super::{parse_digest, ImportError, ImportOptions, Imported};
use crate::build::{mkfs_into_store, BuildDir, BuildOptions};
use crate::digest::Digest;
use crate::manifest::{ImageConfig, LayerDescriptor, LayerKind, Manifest};
use crate::progress::Progress;
use crate::reference::Reference;
use crate::store::{ImageStore, ResolvedImage};

/// One OCI layer to apply.
#[derive(Debug, Clone)]
pub(crate) struct SourceLayer {
    /// How errors and progress name it (its digest or archive path).
    pub label: String,
    /// Size of the blob as stored (compressed), when the source says.
    pub size: Option<u64>,
    /// Digest of the blob as stored.
    pub blob_digest: Option<Digest>,
    /// Digest of the uncompressed tar (checked only when the blob digest
    /// is not known: `docker save`'s older layout).
    pub diff_id: Option<Digest>,
    /// The dsec layer kind `dsec image push` recorded (annotation
    /// [`ANNOTATION_LAYER_KIND`]); images from other producers have none,
    /// and their layers become base layers.
    pub kind: Option<LayerKind>,
}

impl SourceLayer {
    /// The layers an image manifest lists (registry or OCI layout).
    pub(crate) fn from_descriptors(layers: &[Descriptor]) -> Result<Vec<SourceLayer>, ImportError> {
        layers
            .iter()
            .map(|d| {
                Ok(SourceLayer {
                    label: short(&d.digest),
                    size: Some(d.size),
                    blob_digest: Some(parse_digest(&d.digest)?),
                    diff_id: None,
                    kind: annotated_kind(d)?,
                })
            })
            .collect()
    }
}

/// The kind a layer descriptor's dsec annotation names, if it has one.
fn annotated_kind(d: &Descriptor) -> Result<Option<LayerKind>, ImportError> {
    match d.annotations.get(ANNOTATION_LAYER_KIND) {
        None => Ok(None),
        Some(name) => LayerKind::parse(name).map(Some).ok_or_else(|| {
            ImportError::NotAnImage(format!(
                "layer {}: annotation {ANNOTATION_LAYER_KIND} is {name:?}, not base, workspace or toolkit",
                short(&d.digest)
            ))
        }),
    }
}

/// `sha256:0123456789ab`, for messages.
pub(crate) fn short(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    format!("sha256:{}", &hex[..hex.len().min(12)])
}

/// Builds the image's layers and manifest from its config blob and layers.
pub(crate) fn import_image(
    store: &ImageStore,
    reference: Reference,
    config: &ImageConfigBlob,
    layers: &[SourceLayer],
    open: &OpenLayer<'_>,
    options: &ImportOptions,
    progress: &dyn Progress,
) -> Result<Imported, ImportError> {
    let image = build_image(store, &reference, image_config(config), layers, open, options.merge_below, &options.build, progress)?;
    Ok(Imported { reference, image, source_layers: layers.len() })
}

/// Opens layer `i` of the plan.
pub(crate) type OpenLayer<'a> = dyn Fn(usize) -> Result<Box<dyn Read + 'a>, ImportError> + 'a;

/// Splits layers into groups of consecutive layers holding at most
/// `merge_below` bytes together (a layer of unknown or larger size stands
/// alone). Layers of different kinds never share a group: a workspace or
/// toolkit that was pushed as a layer of its own comes back as one.
pub(crate) fn group(layers: &[SourceLayer], merge_below: u64) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    let mut held = 0u64;
    for (i, l) in layers.iter().enumerate() {
        let size = l.size.unwrap_or(u64::MAX);
        if i > start && (held.saturating_add(size) > merge_below || l.kind != layers[start].kind) {
            groups.push(start..i);
            start = i;
            held = 0;
        }
        held = held.saturating_add(size);
    }
    if start < layers.len() {
        groups.push(start..layers.len());
    }
    groups
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn build_image(
    store: &ImageStore,
    reference: &Reference,
    config: ImageConfig,
    layers: &[SourceLayer],
    open: &OpenLayer<'_>,
    merge_below: u64,
    options: &BuildOptions,
    progress: &dyn Progress,
) -> Result<Arc<ResolvedImage>, ImportError> {
    if layers.is_empty() {
        return Err(ImportError::NotAnImage("the image has no layers".into()));
    }
    // Held until the manifest is written: a concurrent gc must not collect
    // the layers committed in between.
    let _lock = store.write_lock()?;
    let groups = group(layers, merge_below);
    let mut descriptors = Vec::with_capacity(groups.len());
    for (g, range) in groups.iter().enumerate() {
        let scratch = BuildDir::new(store, "import")?;
        let root = GroupRoot::new(scratch.make_root()?, g > 0);
        for i in range.clone() {
            let layer = &layers[i];
            progress.stage(&format!(
                "layer {}/{} {}{}",
                i + 1,
                layers.len(),
                layer.label,
                layer.size.map(|s| format!(" ({:.1} MB)", s as f64 / 1e6)).unwrap_or_default()
            ));
            apply_one(&root, layer, open(i)?, progress)?;
        }
        let stored = mkfs_into_store(store, root.path(), options, progress)?;
        descriptors.push(LayerDescriptor {
            digest: stored.digest,
            // One kind per group (see `group`); none recorded means base.
            kind: layers[range.start].kind.unwrap_or(LayerKind::Base),
            size: stored.size,
        });
        drop(scratch);
    }
    let manifest = Manifest::new(descriptors, config);
    store.put_image(reference, &manifest)?;
    Ok(store.resolve_ref(reference)?)
}

/// Streams one blob through its digest check, the decompressor and the
/// whiteout-aware unpacker; the digests are compared once the whole blob
/// has been read, and a mismatch fails the import (the scratch root, and
/// with it everything unpacked from the blob, is then thrown away).
fn apply_one(root: &GroupRoot, layer: &SourceLayer, blob: Box<dyn Read + '_>, progress: &dyn Progress) -> Result<(), ImportError> {
    let raw = Hashing::new(blob, Some((progress, layer.size)));
    let raw_tally = raw.tally();
    let mut buffered = BufReader::with_capacity(1 << 20, raw);
    let compression = sniff(&mut buffered).map_err(|e| ImportError::Layer { layer: layer.label.clone(), source: e })?;
    let decoded: Box<dyn Read + '_> = match compression {
        Compression::None => Box::new(buffered),
        Compression::Gzip => Box::new(flate2::read::GzDecoder::new(buffered)),
        Compression::Zstd => Box::new(
            ruzstd::decoding::StreamingDecoder::new(buffered)
                .map_err(|e| ImportError::Layer { layer: layer.label.clone(), source: std::io::Error::other(e.to_string()) })?,
        ),
    };
    let plain = Hashing::new(decoded, None);
    let plain_tally = plain.tally();
    root.apply(plain, &layer.label)?;

    let raw_tally = raw_tally.borrow();
    if let Some(size) = layer.size {
        if raw_tally.bytes() != size {
            return Err(ImportError::SizeMismatch { what: format!("layer {}", layer.label), expected: size, actual: raw_tally.bytes() });
        }
    }
    if let Some(expected) = layer.blob_digest {
        check(&layer.label, &expected, &raw_tally.digest())?;
    } else if let Some(expected) = layer.diff_id {
        check(&layer.label, &expected, &plain_tally.borrow().digest())?;
    }
    Ok(())
}

fn check(label: &str, expected: &Digest, actual: &Digest) -> Result<(), ImportError> {
    if expected == actual {
        return Ok(());
    }
    Err(ImportError::DigestMismatch {
        what: format!("layer {label}"),
        expected: format!("sha256:{}", expected.hex()),
        actual: format!("sha256:{}", actual.hex()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sized(sizes: &[Option<u64>]) -> Vec<SourceLayer> {
        sizes.iter().map(|s| SourceLayer { label: String::new(), size: *s, blob_digest: None, diff_id: None, kind: None }).collect()
    }

    #[test]
    fn small_consecutive_layers_share_a_group() {
        let l = sized(&[Some(50), Some(5), Some(5), Some(100), Some(1), None, Some(1)]);
        assert_eq!(group(&l, 60), vec![0..3, 3..4, 4..5, 5..6, 6..7]);
        assert_eq!(group(&l, 1000), vec![0..5, 5..6, 6..7]);
        assert_eq!(group(&sized(&[Some(1); 3]), 0), vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn layers_of_different_kinds_never_merge() {
        let mut l = sized(&[Some(1); 5]);
        let kinds =
            [Some(LayerKind::Base), Some(LayerKind::Base), Some(LayerKind::Workspace), Some(LayerKind::Toolkit), Some(LayerKind::Toolkit)];
        for (layer, kind) in l.iter_mut().zip(kinds) {
            layer.kind = kind;
        }
        assert_eq!(group(&l, 1000), vec![0..2, 2..3, 3..5]);
    }

    #[test]
    fn kind_annotation() {
        let d = |ann: Option<&str>| Descriptor {
            media_type: String::new(),
            digest: format!("sha256:{}", "ab".repeat(32)),
            size: 1,
            platform: None,
            annotations: ann.map(|a| [(ANNOTATION_LAYER_KIND.to_string(), a.to_string())].into()).unwrap_or_default(),
        };
        assert_eq!(annotated_kind(&d(None)).unwrap(), None);
        assert_eq!(annotated_kind(&d(Some("toolkit"))).unwrap(), Some(LayerKind::Toolkit));
        let err = annotated_kind(&d(Some("gadget"))).unwrap_err().to_string();
        assert!(err.contains("\"gadget\"") && err.contains(ANNOTATION_LAYER_KIND), "{err}");
    }
}
