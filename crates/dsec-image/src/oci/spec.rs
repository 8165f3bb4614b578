//! The parts of the OCI image spec (and of `docker save`'s manifest.json)
//! that an import reads. Unknown fields are ignored: producers add many.

use std::collections::BTreeMap;

use serde::Deserialize;

pub const MEDIA_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// Manifest media types a registry is asked for, best first.
pub const ACCEPT_MANIFESTS: &[&str] = &[MEDIA_OCI_INDEX, MEDIA_OCI_MANIFEST, MEDIA_DOCKER_LIST, MEDIA_DOCKER_MANIFEST];

/// The annotation OCI layouts use for a manifest's tag (`skopeo copy ...
/// oci:DIR:TAG` writes it).
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

#[derive(Debug, Clone, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl Descriptor {
    pub fn is_index(&self) -> bool {
        self.media_type == MEDIA_OCI_INDEX || self.media_type == MEDIA_DOCKER_LIST
    }

    pub fn ref_name(&self) -> Option<&str> {
        self.annotations.get(ANNOTATION_REF_NAME).map(String::as_str)
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
}

/// An image index (OCI) or manifest list (Docker); also an OCI layout's
/// `index.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Index {
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

/// One image: its config blob and its layers, bottom first.
#[derive(Debug, Clone, Deserialize)]
pub struct ImageManifest {
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// The image config blob; only what a sandbox uses.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct ImageConfigBlob {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: Option<RunConfig>,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct RunConfig {
    #[serde(rename = "Env", default)]
    pub env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: Option<String>,
    #[serde(rename = "User", default)]
    pub user: Option<String>,
    #[serde(rename = "Entrypoint", default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    pub cmd: Option<Vec<String>>,
    #[serde(rename = "Labels", default)]
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    /// Keys only (`"80/tcp": {}`).
    #[serde(rename = "ExposedPorts", default)]
    pub exposed_ports: Option<std::collections::BTreeMap<String, serde_json::Value>>,
    #[serde(rename = "Volumes", default)]
    pub volumes: Option<std::collections::BTreeMap<String, serde_json::Value>>,
    #[serde(rename = "StopSignal", default)]
    pub stop_signal: Option<String>,
    #[serde(rename = "Shell", default)]
    pub shell: Option<Vec<String>>,
    #[serde(rename = "Healthcheck", default)]
    pub healthcheck: Option<OciHealthcheck>,
}

/// Docker's health check (durations in nanoseconds).
#[derive(Debug, Clone, Deserialize, Default)]
pub struct OciHealthcheck {
    #[serde(rename = "Test", default)]
    pub test: Vec<String>,
    #[serde(rename = "Interval", default)]
    pub interval: u64,
    #[serde(rename = "Timeout", default)]
    pub timeout: u64,
    #[serde(rename = "StartPeriod", default)]
    pub start_period: u64,
    #[serde(rename = "StartInterval", default)]
    pub start_interval: u64,
    #[serde(rename = "Retries", default)]
    pub retries: u32,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct RootFs {
    /// sha256 of each layer's *uncompressed* tar, bottom first.
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// One entry of `docker save`'s manifest.json.
#[derive(Debug, Clone, Deserialize)]
pub struct DockerSaveEntry {
    #[serde(rename = "Config")]
    pub config: String,
    #[serde(rename = "RepoTags", default)]
    pub repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    pub layers: Vec<String>,
}

/// The platform of this build, in OCI's words.
pub fn host_platform() -> Platform {
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    Platform { architecture: architecture.to_string(), os: "linux".to_string(), variant: None }
}

/// Parses `os/arch[/variant]`.
pub fn parse_platform(s: &str) -> Option<Platform> {
    let mut parts = s.split('/');
    let os = parts.next().filter(|p| !p.is_empty())?;
    let architecture = parts.next().filter(|p| !p.is_empty())?;
    let variant = parts.next().map(str::to_string);
    if parts.next().is_some() {
        return None;
    }
    Some(Platform { architecture: architecture.to_string(), os: os.to_string(), variant })
}

impl Platform {
    /// Whether an index entry for `other` fits what was asked for (a
    /// missing variant on our side accepts any).
    pub fn accepts(&self, other: &Platform) -> bool {
        self.os == other.os && self.architecture == other.architecture && (self.variant.is_none() || self.variant == other.variant)
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms() {
        let p = parse_platform("linux/arm64/v8").unwrap();
        assert_eq!(p.to_string(), "linux/arm64/v8");
        assert!(parse_platform("linux").is_none());
        assert!(parse_platform("linux/amd64/x/y").is_none());
        let want = parse_platform("linux/arm64").unwrap();
        assert!(want.accepts(&p));
        assert!(!p.accepts(&want));
    }

    #[test]
    fn docker_config_fields() {
        let c: ImageConfigBlob = serde_json::from_str(
            r#"{"architecture":"amd64","os":"linux","config":{"Env":["A=1"],"WorkingDir":"/w","User":"1000"},
               "rootfs":{"type":"layers","diff_ids":["sha256:00"]},"history":[]}"#,
        )
        .unwrap();
        let rc = c.config.unwrap();
        assert_eq!(rc.env.unwrap(), vec!["A=1"]);
        assert_eq!(rc.working_dir.as_deref(), Some("/w"));
        assert_eq!(c.rootfs.unwrap().diff_ids.len(), 1);
    }
}
