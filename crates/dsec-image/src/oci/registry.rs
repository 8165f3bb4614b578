//! Pull from an OCI registry (the distribution API: `GET /v2/<repo>/
//! manifests/<ref>` and `/blobs/<digest>`), with the bearer-token dance of
//! public registries. Layer blobs stream from the HTTP response through the
//! digest check and the unpacker: nothing is written to disk but the
//! resulting EROFS layers.

use std::io::Read;
use std::time::Duration;

use base64::Engine as _;

use super::build::{import_image, SourceLayer};
use super::layout::{check_platform, json, pick_platform, verify_bytes, verify_digest};
use super::spec::{host_platform, Descriptor, ImageConfigBlob, ImageManifest, Index, ACCEPT_MANIFESTS};
use super::{derive_reference, parse_digest, ImportError, ImportOptions, Imported};
use crate::progress::Progress;
use crate::store::ImageStore;

const DOCKER_HUB: &str = "registry-1.docker.io";
const MAX_MANIFEST_BYTES: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("invalid registry reference `{reference}`: {reason}")]
    BadReference { reference: String, reason: String },
    #[error("cannot reach {url}: {message}")]
    Unreachable { url: String, message: String },
    #[error("{url}: access denied ({status}); give credentials with DSEC_REGISTRY_USER and DSEC_REGISTRY_PASSWORD if the repository is private")]
    Denied { url: String, status: u16 },
    #[error("{url}: not found (404)")]
    NotFound { url: String },
    #[error("{url}: HTTP {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("{url}: {message}")]
    Protocol { url: String, message: String },
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
        let bad = |reason: &str| RegistryError::BadReference {
            reference: s.to_string(),
            reason: reason.to_string(),
        };
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(d)),
            None => (s, None),
        };
        let (first, remainder) = rest.split_once('/').unwrap_or(("", rest));
        let (registry, path) = if !first.is_empty()
            && (first.contains('.') || first.contains(':') || first == "localhost")
        {
            (first.to_string(), remainder.to_string())
        } else {
            (DOCKER_HUB.to_string(), rest.to_string())
        };
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r.to_string(), Some(t.to_string())),
            _ => (path.clone(), None),
        };
        if repository.is_empty()
            || !repository
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c))
        {
            return Err(bad("the repository must be lowercase [a-z0-9._-/]"));
        }
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        let reference = match (digest, tag) {
            (Some(d), _) => {
                parse_digest(d).map_err(|_| bad("only sha256 digests are supported"))?;
                d.to_string()
            }
            (None, Some(t)) => t,
            (None, None) => "latest".to_string(),
        };
        Ok(RegistryRef {
            registry,
            repository,
            reference,
        })
    }

    /// Registries on this machine speak plain HTTP by default (as Docker
    /// treats them); everything else HTTPS.
    pub fn is_loopback(&self) -> bool {
        let host = self.registry.rsplit_once(':').map_or(self.registry.as_str(), |(h, _)| h);
        host == "localhost" || host.starts_with("127.") || host == "[::1]"
    }
}

/// How to reach the registry.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Plain HTTP even for a non-loopback registry.
    pub plain_http: bool,
    /// `(user, password)` for registries that want them.
    pub credentials: Option<(String, String)>,
}

/// Pulls `reference` into the store (named by `options.reference`, else by
/// the repository's last component and the tag).
pub fn pull(
    store: &ImageStore,
    reference: &str,
    pull: &PullOptions,
    options: &ImportOptions,
    progress: &dyn Progress,
) -> Result<Imported, ImportError> {
    let r = RegistryRef::parse(reference)?;
    let client = Client::new(&r, pull);
    progress.stage(&format!("resolving {reference}"));
    let (bytes, media_type) = client.manifest(&r.reference)?;
    let wanted = options.platform.clone().unwrap_or_else(host_platform);
    let top: serde_json::Value = json(&client.url_manifest(&r.reference), &bytes)?;
    let top_type = top
        .get("mediaType")
        .and_then(|m| m.as_str())
        .map(str::to_string)
        .unwrap_or(media_type);
    if r.reference.starts_with("sha256:") {
        verify_digest(&bytes, &r.reference, "image manifest")?;
    }
    let manifest_bytes = if top.get("manifests").is_some() || top_type.contains("index") || top_type.contains("list") {
        let index: Index = json(&client.url_manifest(&r.reference), &bytes)?;
        let desc = pick_platform(&index, &wanted)?;
        let (bytes, _) = client.manifest(&desc.digest)?;
        // Index entries carry sizes too, but some registries re-serialise
        // manifests: the digest is what identifies the content.
        verify_digest(&bytes, &desc.digest, "image manifest")?;
        bytes
    } else {
        bytes
    };
    let manifest: ImageManifest = json("image manifest", &manifest_bytes)?;
    let config_bytes = client.small_blob(&manifest.config)?;
    verify_bytes(&config_bytes, &manifest.config, "image config")?;
    let config_blob: ImageConfigBlob = json("image config", &config_bytes)?;
    check_platform(&config_blob, &wanted)?;

    let layers = SourceLayer::from_descriptors(&manifest.layers)?;
    let name = match &options.reference {
        Some(n) => n.clone(),
        None if r.reference.starts_with("sha256:") => derive_reference(&r.repository)?,
        None => derive_reference(&format!("{}:{}", r.repository, r.reference))?,
    };
    let open = |i: usize| -> Result<Box<dyn Read>, ImportError> {
        Ok(client.blob(&manifest.layers[i].digest)?)
    };
    import_image(store, name, &config_blob, &layers, &open, options, progress)
}

struct Client {
    agent: ureq::Agent,
    base: String,
    repository: String,
    credentials: Option<(String, String)>,
    /// `Authorization` value once a challenge was answered.
    auth: std::sync::Mutex<Option<String>>,
}

impl Client {
    fn new(r: &RegistryRef, options: &PullOptions) -> Client {
        let scheme = if options.plain_http || r.is_loopback() {
            "http"
        } else {
            "https"
        };
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(15))
            .timeout_read(Duration::from_secs(120))
            .user_agent(concat!("dsec/", env!("CARGO_PKG_VERSION")))
            .build();
        Client {
            agent,
            base: format!("{scheme}://{}", r.registry),
            repository: r.repository.clone(),
            credentials: options.credentials.clone(),
            auth: std::sync::Mutex::new(None),
        }
    }

    fn url_manifest(&self, reference: &str) -> String {
        format!("{}/v2/{}/manifests/{reference}", self.base, self.repository)
    }

    fn manifest(&self, reference: &str) -> Result<(Vec<u8>, String), RegistryError> {
        let url = self.url_manifest(reference);
        let resp = self.get(&url, Some(&ACCEPT_MANIFESTS.join(", ")))?;
        let media_type = resp.content_type().to_string();
        let bytes = read_limited(&url, resp)?;
        Ok((bytes, media_type))
    }

    fn small_blob(&self, desc: &Descriptor) -> Result<Vec<u8>, RegistryError> {
        let url = format!("{}/v2/{}/blobs/{}", self.base, self.repository, desc.digest);
        read_limited(&url, self.get(&url, None)?)
    }

    fn blob(&self, digest: &str) -> Result<Box<dyn Read + Send>, RegistryError> {
        let url = format!("{}/v2/{}/blobs/{digest}", self.base, self.repository);
        Ok(self.get(&url, None)?.into_reader())
    }

    /// GET with the current authorisation; on a 401 answers the challenge
    /// once and retries.
    fn get(&self, url: &str, accept: Option<&str>) -> Result<ureq::Response, RegistryError> {
        let attempt = |auth: Option<&str>| {
            let mut req = self.agent.get(url);
            if let Some(a) = accept {
                req = req.set("Accept", a);
            }
            if let Some(a) = auth {
                req = req.set("Authorization", a);
            }
            req.call()
        };
        let current = self.auth.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match attempt(current.as_deref()) {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(401, resp)) => {
                let challenge = resp.header("www-authenticate").unwrap_or_default().to_string();
                let auth = self.answer(url, &challenge)?;
                *self.auth.lock().unwrap_or_else(|e| e.into_inner()) = Some(auth.clone());
                attempt(Some(&auth)).map_err(|e| status_error(url, e))
            }
            Err(e) => Err(status_error(url, e)),
        }
    }

    /// `Basic` -> the credentials; `Bearer realm=...,service=...,scope=...`
    /// -> a token from the realm (anonymous unless credentials are set).
    fn answer(&self, url: &str, challenge: &str) -> Result<String, RegistryError> {
        let basic = || {
            self.credentials.as_ref().map(|(u, p)| {
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
                )
            })
        };
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return basic().ok_or(RegistryError::Denied {
                url: url.to_string(),
                status: 401,
            });
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(RegistryError::Denied {
                url: url.to_string(),
                status: 401,
            });
        }
        let params = parse_challenge(params);
        let realm = params
            .iter()
            .find(|(k, _)| k == "realm")
            .map(|(_, v)| v.clone())
            .ok_or_else(|| RegistryError::Protocol {
                url: url.to_string(),
                message: format!("bearer challenge without a realm: {challenge}"),
            })?;
        let mut req = self.agent.get(&realm);
        for (k, v) in &params {
            if k == "service" || k == "scope" {
                req = req.query(k, v);
            }
        }
        if let Some(b) = basic() {
            req = req.set("Authorization", &b);
        }
        let resp = req.call().map_err(|e| status_error(&realm, e))?;
        let body = read_limited(&realm, resp)?;
        let token: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| RegistryError::Protocol {
                url: realm.clone(),
                message: format!("token response is not JSON: {e}"),
            })?;
        let token = token
            .get("token")
            .or_else(|| token.get("access_token"))
            .and_then(|t| t.as_str())
            .ok_or_else(|| RegistryError::Protocol {
                url: realm.clone(),
                message: "token response has no token".into(),
            })?;
        Ok(format!("Bearer {token}"))
    }
}

/// `realm="x",service="y"` -> pairs (values may contain commas inside
/// their quotes).
fn parse_challenge(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.split_once('"') {
                Some((v, n)) => (v.to_string(), n),
                None => (quoted.to_string(), ""),
            }
        } else {
            match after.split_once(',') {
                Some((v, n)) => (v.trim().to_string(), n),
                None => (after.trim().to_string(), ""),
            }
        };
        out.push((key, value));
        rest = next.trim_start_matches(',').trim();
    }
    out
}

fn read_limited(url: &str, resp: ureq::Response) -> Result<Vec<u8>, RegistryError> {
    let mut out = Vec::new();
    resp.into_reader()
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| RegistryError::Unreachable {
            url: url.to_string(),
            message: e.to_string(),
        })?;
    if out.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(RegistryError::Protocol {
            url: url.to_string(),
            message: "document larger than 16 MiB".into(),
        });
    }
    Ok(out)
}

fn status_error(url: &str, e: ureq::Error) -> RegistryError {
    match e {
        ureq::Error::Status(404, _) => RegistryError::NotFound {
            url: url.to_string(),
        },
        ureq::Error::Status(s @ (401 | 403), _) => RegistryError::Denied {
            url: url.to_string(),
            status: s,
        },
        ureq::Error::Status(status, resp) => RegistryError::Status {
            url: url.to_string(),
            status,
            body: resp
                .into_string()
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect(),
        },
        ureq::Error::Transport(t) => RegistryError::Unreachable {
            url: url.to_string(),
            message: t.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_resolve_like_docker_pull() {
        let r = RegistryRef::parse("busybox").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.reference.as_str()),
            (DOCKER_HUB, "library/busybox", "latest")
        );
        let r = RegistryRef::parse("127.0.0.1:5000/team/tool:1.2").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.reference.as_str()),
            ("127.0.0.1:5000", "team/tool", "1.2")
        );
        assert!(r.is_loopback());
        let d = format!("sha256:{}", "a".repeat(64));
        let r = RegistryRef::parse(&format!("ghcr.io/x/y@{d}")).unwrap();
        assert_eq!(r.reference, d);
        assert!(!r.is_loopback());
        assert!(RegistryRef::parse("Upper/Case").is_err());
        assert!(RegistryRef::parse("x@md5:00").is_err());
    }

    #[test]
    fn bearer_challenges() {
        let p = parse_challenge(
            r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(p[0], ("realm".into(), "https://auth.example/token".into()));
        assert_eq!(p[2], ("scope".into(), "repository:a/b:pull,push".into()));
    }
}
