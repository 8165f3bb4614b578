//! Named volumes: directories on a node's disk, bounded by their size,
//! mounted into any number of sandboxes and kept until removed.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Where a creation request mounts a volume (`volumes` maps a sandbox path
/// to one): its name, read-write, or its name with options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum VolumeMount {
    /// `"NAME"`: mounted read-write.
    Name(String),
    /// `{"name": "NAME", "read_only": true}`.
    Options(VolumeMountOptions),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMountOptions {
    pub name: String,
    #[serde(default)]
    pub read_only: bool,
}

impl VolumeMount {
    pub fn name(&self) -> &str {
        match self {
            VolumeMount::Name(n) => n,
            VolumeMount::Options(o) => &o.name,
        }
    }

    pub fn read_only(&self) -> bool {
        matches!(self, VolumeMount::Options(VolumeMountOptions { read_only: true, .. }))
    }
}

/// `POST /v1/volumes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeRequest {
    /// 1 to 63 of lowercase letters, digits, `.`, `_` and `-`, starting
    /// with a letter or digit; unique per tenant on the node.
    pub name: String,
    /// What the volume may hold, in MiB (default 1024).
    #[serde(default)]
    pub size_mb: Option<u64>,
}

/// A named volume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Volume {
    pub name: String,
    pub size_mb: u64,
    /// Bytes its files hold now.
    pub used_bytes: u64,
    /// RFC 3339.
    pub created_at: String,
    /// The sandboxes, not yet stopped, that mount it.
    pub sandboxes: Vec<String>,
}

/// `GET /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VolumeList {
    pub volumes: Vec<Volume>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_is_a_name_or_a_name_with_options() {
        let m: std::collections::BTreeMap<String, VolumeMount> =
            serde_json::from_str(r#"{"/data": "cache", "/ro": {"name": "ref", "read_only": true}}"#).unwrap();
        assert_eq!(m["/data"].name(), "cache");
        assert!(!m["/data"].read_only());
        assert_eq!(m["/ro"].name(), "ref");
        assert!(m["/ro"].read_only());
        assert!(serde_json::from_str::<VolumeMount>(r#"{"name": "x", "mode": "ro"}"#).is_err());
    }
}
