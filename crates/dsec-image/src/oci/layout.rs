//! Reads an image out of an OCI image layout (`oci-layout` + `index.json` +
//! `blobs/`) or a `docker save` archive (`manifest.json` + config + layer
//! tars), whichever the tree holds, and hands its layers to the builder.

use serde::de::DeserializeOwned;

use super::build::{import_image, SourceLayer};
use super::source::Tree;
use super::spec::{host_platform, Descriptor, DockerSaveEntry, ImageConfigBlob, ImageManifest, Index, Platform};
use super::{derive_reference, parse_digest, ImportError, ImportOptions, Imported};
use crate::digest::Digest;
use crate::manifest::ImageConfig;
use crate::progress::Progress;
use crate::store::ImageStore;

pub(crate) fn import_tree(
    store: &ImageStore,
    tree: &dyn Tree,
    options: &ImportOptions,
    progress: &dyn Progress,
) -> Result<Imported, ImportError> {
    if tree.exists("oci-layout") && tree.exists("index.json") {
        import_oci(store, tree, options, progress)
    } else if tree.exists("manifest.json") {
        import_docker_save(store, tree, options, progress)
    } else {
        Err(ImportError::NotAnImage(
            "found neither `oci-layout` + `index.json` (an OCI image layout) nor \
             `manifest.json` (`docker save`); for a plain root filesystem tar use \
             `dsec image build --from-tar`"
                .into(),
        ))
    }
}

pub(crate) fn json<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, ImportError> {
    serde_json::from_slice(bytes).map_err(|source| ImportError::Json { what: what.to_string(), source })
}

fn blob_path(digest: &str) -> Result<String, ImportError> {
    let d = parse_digest(digest)?;
    Ok(format!("blobs/sha256/{}", d.hex()))
}

/// Reads a blob named by a descriptor, checking its size and digest.
pub(crate) fn read_verified(tree: &dyn Tree, desc: &Descriptor, what: &str) -> Result<Vec<u8>, ImportError> {
    let bytes = tree.read_small(&blob_path(&desc.digest)?)?;
    verify_bytes(&bytes, desc, what)?;
    Ok(bytes)
}

pub(crate) fn verify_bytes(bytes: &[u8], desc: &Descriptor, what: &str) -> Result<(), ImportError> {
    if bytes.len() as u64 != desc.size {
        return Err(ImportError::SizeMismatch { what: what.to_string(), expected: desc.size, actual: bytes.len() as u64 });
    }
    verify_digest(bytes, &desc.digest, what)
}

/// Checks `bytes` against a `sha256:...` digest.
pub(crate) fn verify_digest(bytes: &[u8], digest: &str, what: &str) -> Result<(), ImportError> {
    let actual = Digest::of_bytes(bytes);
    if actual != parse_digest(digest)? {
        return Err(ImportError::DigestMismatch {
            what: what.to_string(),
            expected: digest.to_string(),
            actual: format!("sha256:{}", actual.hex()),
        });
    }
    Ok(())
}

/// Picks the manifest the caller selected (by tag or digest), or the only
/// one.
pub(crate) fn select<'a>(manifests: &'a [Descriptor], select: Option<&str>) -> Result<&'a Descriptor, ImportError> {
    let names = || manifests.iter().map(|d| d.ref_name().unwrap_or(&d.digest).to_string()).collect::<Vec<_>>().join(", ");
    match select {
        Some(want) => {
            let tag = want.rsplit(':').next().unwrap_or(want);
            manifests
                .iter()
                .find(|d| d.digest == want || d.ref_name() == Some(want) || d.ref_name() == Some(tag))
                .ok_or_else(|| ImportError::Ambiguous(format!("no image `{want}` in the source (it holds: {})", names())))
        }
        None => match manifests {
            [] => Err(ImportError::NotAnImage("the index lists no image".into())),
            [only] => Ok(only),
            _ => Err(ImportError::Ambiguous(format!(
                "the source holds {} images, pick one with `--select` (one of: {})",
                manifests.len(),
                names()
            ))),
        },
    }
}

/// Picks the entry of a multi-platform index for `wanted`.
pub(crate) fn pick_platform<'a>(index: &'a Index, wanted: &Platform) -> Result<&'a Descriptor, ImportError> {
    index.manifests.iter().find(|d| d.platform.as_ref().is_some_and(|p| wanted.accepts(p))).ok_or_else(|| ImportError::NoMatchingPlatform {
        wanted: wanted.to_string(),
        available: index.manifests.iter().filter_map(|d| d.platform.as_ref().map(|p| p.to_string())).collect::<Vec<_>>().join(", "),
    })
}

/// The sandbox defaults an OCI config gives (environment, working
/// directory, user), falling back to dsec's own.
pub(crate) fn image_config(blob: &ImageConfigBlob) -> ImageConfig {
    let mut config = ImageConfig::default();
    let Some(run) = &blob.config else {
        return config;
    };
    if let Some(env) = &run.env {
        let env: Vec<String> = env.iter().filter(|e| e.contains('=') && !e.starts_with('=')).cloned().collect();
        if !env.is_empty() {
            config.env = env;
        }
    }
    if let Some(dir) = run.working_dir.as_deref().filter(|d| !d.is_empty()) {
        config.workdir = if dir.starts_with('/') { dir.to_string() } else { format!("/{dir}") };
    }
    if let Some(user) = run.user.as_deref().filter(|u| !u.is_empty()) {
        config.user = user.to_string();
    }
    config.entrypoint = run.entrypoint.clone();
    config.cmd = run.cmd.clone();
    config.labels = run.labels.clone().unwrap_or_default();
    config.exposed_ports = run.exposed_ports.iter().flat_map(|m| m.keys().cloned()).collect();
    config.volumes = run.volumes.iter().flat_map(|m| m.keys().cloned()).collect();
    config.stop_signal = run.stop_signal.clone().filter(|s| !s.is_empty());
    config.shell = run.shell.clone().filter(|s| !s.is_empty());
    config.healthcheck = run.healthcheck.as_ref().filter(|h| !h.test.is_empty()).map(|h| crate::manifest::HealthcheckConfig {
        test: h.test.clone(),
        interval_ns: h.interval,
        timeout_ns: h.timeout,
        start_period_ns: h.start_period,
        start_interval_ns: h.start_interval,
        retries: h.retries,
    });
    config
}

/// Refuses an image built for another machine (it would fail at the first
/// exec with a confusing error).
pub(crate) fn check_platform(blob: &ImageConfigBlob, wanted: &Platform) -> Result<(), ImportError> {
    if blob.architecture.is_empty() || blob.architecture == wanted.architecture {
        return Ok(());
    }
    Err(ImportError::NoMatchingPlatform { wanted: wanted.to_string(), available: format!("{}/{}", blob.os, blob.architecture) })
}

fn import_oci(store: &ImageStore, tree: &dyn Tree, options: &ImportOptions, progress: &dyn Progress) -> Result<Imported, ImportError> {
    let index: Index = json("index.json", &tree.read_small("index.json")?)?;
    let chosen = select(&index.manifests, options.select.as_deref())?;
    let source_name = chosen.ref_name().map(str::to_string);
    let wanted = options.platform.clone().unwrap_or_else(host_platform);
    let mut desc = chosen.clone();
    if desc.is_index() {
        let nested: Index = json("image index", &read_verified(tree, &desc, "image index")?)?;
        desc = pick_platform(&nested, &wanted)?.clone();
    }
    let manifest: ImageManifest = json("image manifest", &read_verified(tree, &desc, "image manifest")?)?;
    let config_blob: ImageConfigBlob = json("image config", &read_verified(tree, &manifest.config, "image config")?)?;
    check_platform(&config_blob, &wanted)?;

    let layers = SourceLayer::from_descriptors(&manifest.layers)?;
    let paths = manifest.layers.iter().map(|d| blob_path(&d.digest)).collect::<Result<Vec<_>, _>>()?;
    let reference = match (&options.reference, &source_name) {
        (Some(r), _) => r.clone(),
        (None, Some(name)) => derive_reference(name)?,
        (None, None) => return Err(ImportError::NoName),
    };
    let open = |i: usize| tree.open(&paths[i]).map(|(r, _)| r);
    import_image(store, reference, &config_blob, &layers, &open, options, progress)
}

fn import_docker_save(
    store: &ImageStore,
    tree: &dyn Tree,
    options: &ImportOptions,
    progress: &dyn Progress,
) -> Result<Imported, ImportError> {
    let entries: Vec<DockerSaveEntry> = json("manifest.json", &tree.read_small("manifest.json")?)?;
    let tags = |e: &DockerSaveEntry| e.repo_tags.clone().unwrap_or_default();
    let entry = match options.select.as_deref() {
        Some(want) => entries.iter().find(|e| tags(e).iter().any(|t| t == want || t.ends_with(&format!("/{want}")))).ok_or_else(|| {
            ImportError::Ambiguous(format!(
                "no image `{want}` in the archive (it holds: {})",
                entries.iter().flat_map(tags).collect::<Vec<_>>().join(", ")
            ))
        })?,
        None => match entries.as_slice() {
            [] => return Err(ImportError::NotAnImage("manifest.json lists no image".into())),
            [only] => only,
            _ => {
                return Err(ImportError::Ambiguous(format!(
                    "the archive holds {} images, pick one with `--select` (one of: {})",
                    entries.len(),
                    entries.iter().flat_map(tags).collect::<Vec<_>>().join(", ")
                )))
            }
        },
    };
    let config_bytes = tree.read_small(&entry.config)?;
    // Config paths are `<hex>.json` (older) or `blobs/sha256/<hex>`: the
    // hex is the config's own digest either way.
    if let Some(expected) = digest_in_path(&entry.config) {
        verify_digest(&config_bytes, &format!("sha256:{}", expected.hex()), "image config")?;
    }
    let config_blob: ImageConfigBlob = json("image config", &config_bytes)?;
    let wanted = options.platform.clone().unwrap_or_else(host_platform);
    check_platform(&config_blob, &wanted)?;
    let diff_ids = config_blob.rootfs.as_ref().map(|r| r.diff_ids.clone()).unwrap_or_default();
    if diff_ids.len() != entry.layers.len() {
        return Err(ImportError::NotAnImage(format!(
            "the config lists {} layers but manifest.json {}",
            diff_ids.len(),
            entry.layers.len()
        )));
    }
    let mut layers = Vec::with_capacity(entry.layers.len());
    for (path, diff_id) in entry.layers.iter().zip(&diff_ids) {
        let (_, size) = tree.open(path)?;
        layers.push(SourceLayer {
            label: path.clone(),
            size: Some(size),
            // `blobs/sha256/<hex>` names the blob's digest; older archives
            // name layers by id, and then the uncompressed digest is checked.
            blob_digest: path.strip_prefix("blobs/sha256/").and_then(|h| Digest::from_hex(h).ok()),
            diff_id: Some(parse_digest(diff_id)?),
            // `docker save` keeps no layer annotations.
            kind: None,
        });
    }
    let reference = match (&options.reference, tags(entry).first()) {
        (Some(r), _) => r.clone(),
        (None, Some(name)) => derive_reference(name)?,
        (None, None) => return Err(ImportError::NoName),
    };
    let open = |i: usize| tree.open(&entry.layers[i]).map(|(r, _)| r);
    import_image(store, reference, &config_blob, &layers, &open, options, progress)
}

/// The digest a `docker save` path carries (`<hex>.json`,
/// `blobs/sha256/<hex>`), if any.
fn digest_in_path(path: &str) -> Option<Digest> {
    let file = path.rsplit('/').next()?;
    Digest::from_hex(file.strip_suffix(".json").unwrap_or(file)).ok()
}
