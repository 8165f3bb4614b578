//! Pull from an OCI registry (the distribution API: `GET /v2/<repo>/
//! manifests/<ref>` and `/blobs/<digest>`), with the bearer-token dance of
//! public registries (`client`). Layer blobs stream from the HTTP response through the
//! digest check and the unpacker: nothing is written to disk but the
//! resulting EROFS layers.

use std::io::Read;

use super::build::{import_image, SourceLayer};
use super::client::Client;
pub use super::client::RegistryOptions;
use super::layout::{check_platform, json, pick_platform, verify_bytes, verify_digest};
use super::spec::{host_platform, ImageConfigBlob, ImageManifest, Index, ACCEPT_MANIFESTS};
use super::{derive_reference, parse_digest, ImportError, ImportOptions, Imported};
use crate::progress::Progress;
use crate::store::ImageStore;

const DOCKER_HUB: &str = "registry-1.docker.io";

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("invalid registry reference `{reference}`: {reason}")]
    BadReference { reference: String, reason: String },
    #[error("cannot reach {url}: {message}")]
    Unreachable { url: String, message: String },
    #[error("{url}: access denied ({status}); private repositories and pushes need credentials: check DSEC_REGISTRY_USER and DSEC_REGISTRY_PASSWORD")]
    Denied { url: String, status: u16 },
    #[error("{url}: not found (404)")]
    NotFound { url: String },
    #[error("{url}: HTTP {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("{url}: {message}")]
    Protocol { url: String, message: String },
    #[error("reading what is sent to {url}: {source}")]
    LocalRead {
        url: String,
        #[source]
        source: std::io::Error,
    },
}

/// `[registry/]repository[:tag|@digest]`, resolved the way `docker pull`
/// does (no registry means Docker Hub, one-part names are `library/...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryRef {
    pub registry: String,
    pub repository: String,
    /// A tag or a `sha256:...` digest.
    pub reference: String,
}

impl RegistryRef {
    pub fn parse(s: &str) -> Result<RegistryRef, RegistryError> {
        let bad = |reason: &str| RegistryError::BadReference { reference: s.to_string(), reason: reason.to_string() };
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(d)),
            None => (s, None),
        };
        let (first, remainder) = rest.split_once('/').unwrap_or(("", rest));
        let (registry, path) = if !first.is_empty() && (first.contains('.') || first.contains(':') || first == "localhost") {
            (first.to_string(), remainder.to_string())
        } else {
            (DOCKER_HUB.to_string(), rest.to_string())
        };
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r.to_string(), Some(t.to_string())),
            _ => (path.clone(), None),
        };
        if repository.is_empty() || !repository.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c)) {
            return Err(bad("the repository must be lowercase [a-z0-9._-/]"));
        }
        let repository = if registry == DOCKER_HUB && !repository.contains('/') { format!("library/{repository}") } else { repository };
        let reference = match (digest, tag) {
            (Some(d), _) => {
                parse_digest(d).map_err(|_| bad("only sha256 digests are supported"))?;
                d.to_string()
            }
            (None, Some(t)) => t,
            (None, None) => "latest".to_string(),
        };
        Ok(RegistryRef { registry, repository, reference })
    }

    /// Registries on this machine speak plain HTTP by default (as Docker
    /// treats them); everything else HTTPS.
    pub fn is_loopback(&self) -> bool {
        let host = self.registry.rsplit_once(':').map_or(self.registry.as_str(), |(h, _)| h);
        host == "localhost" || host.starts_with("127.") || host == "[::1]"
    }
}

/// Pulls `reference` into the store (named by `options.reference`, else by
/// the repository's last component and the tag).
pub fn pull(
    store: &ImageStore,
    reference: &str,
    registry: &RegistryOptions,
    options: &ImportOptions,
    progress: &dyn Progress,
) -> Result<Imported, ImportError> {
    let r = RegistryRef::parse(reference)?;
    let client = Client::new(&r, registry);
    progress.stage(&format!("resolving {reference}"));
    let accept = ACCEPT_MANIFESTS.join(", ");
    let (bytes, media_type) = client.manifest(&r.reference, &accept)?;
    let wanted = options.platform.clone().unwrap_or_else(host_platform);
    let top: serde_json::Value = json(&client.url_manifest(&r.reference), &bytes)?;
    let top_type = top.get("mediaType").and_then(|m| m.as_str()).map(str::to_string).unwrap_or(media_type);
    if r.reference.starts_with("sha256:") {
        verify_digest(&bytes, &r.reference, "image manifest")?;
    }
    let manifest_bytes = if top.get("manifests").is_some() || top_type.contains("index") || top_type.contains("list") {
        let index: Index = json(&client.url_manifest(&r.reference), &bytes)?;
        let desc = pick_platform(&index, &wanted)?;
        let (bytes, _) = client.manifest(&desc.digest, &accept)?;
        // Index entries carry sizes too, but some registries re-serialise
        // manifests: the digest is what identifies the content.
        verify_digest(&bytes, &desc.digest, "image manifest")?;
        bytes
    } else {
        bytes
    };
    let manifest: ImageManifest = json("image manifest", &manifest_bytes)?;
    let config_bytes = client.small_blob(&manifest.config.digest)?;
    verify_bytes(&config_bytes, &manifest.config, "image config")?;
    let config_blob: ImageConfigBlob = json("image config", &config_bytes)?;
    check_platform(&config_blob, &wanted)?;

    let layers = SourceLayer::from_descriptors(&manifest.layers)?;
    let name = match &options.reference {
        Some(n) => n.clone(),
        None if r.reference.starts_with("sha256:") => derive_reference(&r.repository)?,
        None => derive_reference(&format!("{}:{}", r.repository, r.reference))?,
    };
    let open = |i: usize| -> Result<Box<dyn Read>, ImportError> { Ok(client.blob(&manifest.layers[i].digest)?) };
    import_image(store, name, &config_blob, &layers, &open, options, progress)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_resolve_like_docker_pull() {
        let r = RegistryRef::parse("busybox").unwrap();
        assert_eq!((r.registry.as_str(), r.repository.as_str(), r.reference.as_str()), (DOCKER_HUB, "library/busybox", "latest"));
        let r = RegistryRef::parse("127.0.0.1:5000/team/tool:1.2").unwrap();
        assert_eq!((r.registry.as_str(), r.repository.as_str(), r.reference.as_str()), ("127.0.0.1:5000", "team/tool", "1.2"));
        assert!(r.is_loopback());
        let d = format!("sha256:{}", "a".repeat(64));
        let r = RegistryRef::parse(&format!("ghcr.io/x/y@{d}")).unwrap();
        assert_eq!(r.reference, d);
        assert!(!r.is_loopback());
        assert!(RegistryRef::parse("Upper/Case").is_err());
        assert!(RegistryRef::parse("x@md5:00").is_err());
    }
}
