//! Image manifests: an ordered list of layers (bottom first) plus the
//! process defaults a sandbox starts with. Stored as versioned JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;

/// The manifest format this crate writes and the only one it reads.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("manifest schema_version {found} is not supported (this build reads version {SCHEMA_VERSION})")]
    UnsupportedSchema { found: u32 },
    #[error("invalid manifest: {0}")]
    Invalid(String),
}

/// What a layer is for; it decides where the layer sits in a sandbox's
/// overlay (base at the bottom, then workspace, then toolkits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerKind {
    Base,
    Workspace,
    Toolkit,
}

impl LayerKind {
    pub const ALL: [LayerKind; 3] = [LayerKind::Base, LayerKind::Workspace, LayerKind::Toolkit];

    /// The word manifests, OCI annotations and the CLI use.
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::Base => "base",
            LayerKind::Workspace => "workspace",
            LayerKind::Toolkit => "toolkit",
        }
    }

    /// The kind `name` gives, if it names one.
    pub fn parse(name: &str) -> Option<LayerKind> {
        LayerKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerDescriptor {
    pub digest: Digest,
    pub kind: LayerKind,
    /// Size of the EROFS blob in bytes.
    pub size: u64,
}

/// Defaults for processes started in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `KEY=value` entries.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default = "default_workdir")]
    pub workdir: String,
    #[serde(default = "default_user")]
    pub user: String,
    /// What the image runs by default (`ENTRYPOINT`, then `CMD` as its
    /// arguments), as an OCI config records them. dsec starts its own agent
    /// as a sandbox's init, so these are recorded for the image's users
    /// (and kept across export), not run by dsec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `port/protocol` entries (`80/tcp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
    /// The shell of shell-form commands in builds (`SHELL`); absent:
    /// `/bin/sh -c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthcheck: Option<HealthcheckConfig>,
}

/// A container health check as an OCI config records it: `test` is
/// `["NONE"]`, `["CMD", args...]` or `["CMD-SHELL", command]`; durations
/// in nanoseconds, 0 meaning the default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthcheckConfig {
    pub test: Vec<String>,
    #[serde(default)]
    pub interval_ns: u64,
    #[serde(default)]
    pub timeout_ns: u64,
    #[serde(default)]
    pub start_period_ns: u64,
    #[serde(default)]
    pub start_interval_ns: u64,
    #[serde(default)]
    pub retries: u32,
}

fn default_workdir() -> String {
    "/".to_string()
}

fn default_user() -> String {
    "root".to_string()
}

impl Default for ImageConfig {
    fn default() -> Self {
        ImageConfig {
            env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(), "LANG=C.UTF-8".to_string()],
            workdir: default_workdir(),
            user: default_user(),
            entrypoint: None,
            cmd: None,
            labels: BTreeMap::new(),
            exposed_ports: Vec::new(),
            volumes: Vec::new(),
            stop_signal: None,
            shell: None,
            healthcheck: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    /// Bottom first; when overlaid, later layers win.
    pub layers: Vec<LayerDescriptor>,
    pub config: ImageConfig,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// Sum of the layer sizes.
    pub size_bytes: u64,
    /// Who made the image from what, for images packed from a sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    /// Layer digest -> digest of its chunk table (`lazy::ChunkTable`),
    /// written by a push to a shared store: the root of trust for the
    /// chunks a node fetches on demand. Empty in a node's own store.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub chunk_tables: BTreeMap<Digest, Digest>,
    /// For a default image (`busybox`, `python`, `judge`): the version of
    /// the recipe it was built from, so that setup rebuilds one whose
    /// recipe has changed since. Absent: not a default image, or one built
    /// before versions were recorded; setup keeps such an image
    /// (`defaults::find_default_image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_recipe: Option<u32>,
}

/// Where a packed image came from (`pack_diff`): kept with the image so a
/// task environment can always be traced to the sandbox and account that
/// built it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// The tenant (account) whose sandbox was packed.
    pub built_by: String,
    /// The sandbox packed.
    pub sandbox: String,
    /// The image the sandbox started from (`name:tag`).
    pub base_image: String,
    /// The packed image this pack builds on, if any (the previous pack of
    /// the same sandbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// Patterns whose matches were left out of the layer.
    #[serde(default)]
    pub scrubbed: Vec<String>,
}

/// Just enough of a manifest to read its version before committing to the
/// full v1 shape, so a newer manifest gives "unsupported version" rather
/// than a confusing missing-field error.
#[derive(Deserialize)]
struct VersionProbe {
    schema_version: u32,
}

impl Manifest {
    /// A manifest created now, with `size_bytes` computed from the layers.
    pub fn new(layers: Vec<LayerDescriptor>, config: ImageConfig) -> Self {
        let size_bytes = layers.iter().map(|l| l.size).sum();
        Manifest {
            schema_version: SCHEMA_VERSION,
            layers,
            config,
            created_at: crate::time::now_rfc3339(),
            provenance: None,
            size_bytes,
            chunk_tables: BTreeMap::new(),
            default_recipe: None,
        }
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, ManifestError> {
        let probe: VersionProbe = serde_json::from_slice(bytes)?;
        if probe.schema_version != SCHEMA_VERSION {
            return Err(ManifestError::UnsupportedSchema { found: probe.schema_version });
        }
        let manifest: Manifest = serde_json::from_slice(bytes)?;
        manifest.validate()?;
        Ok(manifest)
    }

    pub fn to_json(&self) -> Result<Vec<u8>, ManifestError> {
        self.validate()?;
        let mut out = serde_json::to_vec_pretty(self)?;
        out.push(b'\n');
        Ok(out)
    }

    /// Checks the invariants every stored manifest must hold.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(ManifestError::UnsupportedSchema { found: self.schema_version });
        }
        if self.layers.is_empty() {
            return Err(ManifestError::Invalid("an image needs at least one layer".into()));
        }
        let sum: u64 = self.layers.iter().map(|l| l.size).sum();
        if sum != self.size_bytes {
            return Err(ManifestError::Invalid(format!("size_bytes is {} but the layers add up to {sum}", self.size_bytes)));
        }
        if !self.config.workdir.starts_with('/') {
            return Err(ManifestError::Invalid(format!("workdir `{}` is not an absolute path", self.config.workdir)));
        }
        if self.config.user.is_empty() {
            return Err(ManifestError::Invalid("user is empty".into()));
        }
        if let Some(bad) = self.config.env.iter().find(|e| !e.contains('=') || e.starts_with('=')) {
            return Err(ManifestError::Invalid(format!("env entry `{bad}` is not KEY=value")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest::new(
            vec![
                LayerDescriptor { digest: Digest::of_bytes(b"a"), kind: LayerKind::Base, size: 10 },
                LayerDescriptor { digest: Digest::of_bytes(b"b"), kind: LayerKind::Toolkit, size: 5 },
            ],
            ImageConfig::default(),
        )
    }

    #[test]
    fn kind_names_match_serde() {
        for k in LayerKind::ALL {
            assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{}\"", k.name()));
            assert_eq!(LayerKind::parse(k.name()), Some(k));
        }
        assert_eq!(LayerKind::parse("Base"), None);
    }

    #[test]
    fn round_trip() {
        let m = sample();
        assert_eq!(m.size_bytes, 15);
        let json = m.to_json().unwrap();
        let text = std::str::from_utf8(&json).unwrap();
        assert!(text.contains("\"schema_version\": 1"), "{text}");
        assert!(text.contains("\"kind\": \"toolkit\""), "{text}");
        assert!(text.contains(&format!("\"{}\"", Digest::of_bytes(b"a"))), "{text}");
        assert_eq!(Manifest::from_json(&json).unwrap(), m);
    }

    #[test]
    fn unknown_version_is_refused_clearly() {
        let json = br#"{"schema_version": 7, "something": "new"}"#;
        assert!(matches!(Manifest::from_json(json), Err(ManifestError::UnsupportedSchema { found: 7 })));
    }

    #[test]
    fn invariants() {
        let mut m = sample();
        m.size_bytes = 1;
        assert!(matches!(Manifest::from_json(&serde_json::to_vec(&m).unwrap()), Err(ManifestError::Invalid(_))));
        let mut m = sample();
        m.layers.clear();
        m.size_bytes = 0;
        assert!(m.to_json().is_err());
        let mut m = sample();
        m.config.workdir = "rel".into();
        assert!(m.validate().is_err());
        let mut m = sample();
        m.config.env.push("NOEQUALS".into());
        assert!(m.validate().is_err());
        assert!(matches!(Manifest::from_json(b"{"), Err(ManifestError::Json(_))));
    }

    #[test]
    fn config_defaults_when_absent() {
        let d = Digest::of_bytes(b"a");
        let json = format!(
            r#"{{"schema_version":1,"layers":[{{"digest":"{d}","kind":"base","size":3}}],
                "config":{{}},"created_at":"2026-01-01T00:00:00Z","size_bytes":3}}"#
        );
        let m = Manifest::from_json(json.as_bytes()).unwrap();
        assert_eq!(m.config.workdir, "/");
        assert_eq!(m.config.user, "root");
        assert!(m.config.env.is_empty());
    }
}
