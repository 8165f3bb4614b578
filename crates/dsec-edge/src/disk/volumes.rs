//! Named volumes: a btrfs subvolume each, bounded by its size, kept until
//! its owner removes it. The filesystem is their only record: a volume is
//! the directory `volumes/<tenant, hex>/<name>`, its size the limit of its
//! quota group, its creation time the directory's. Which sandboxes use one
//! is the edge's registry's to say (`Edge::volumes`).

use std::path::PathBuf;

use super::{btrfs, io, open_dir, DiskError, NodeDisk};

/// A volume resolved for a sandbox: its host directory and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeBind {
    pub name: String,
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// One volume as the node holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    pub tenant: String,
    pub name: String,
    pub size_mb: u64,
    pub used_bytes: u64,
    pub created_ms: u64,
}

/// A volume name: 1 to 63 of `[a-z0-9._-]`, starting with a letter or digit.
pub fn check_name(name: &str) -> Result<(), DiskError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(DiskError::Invalid(format!(
            "volume name {name:?}: 1 to 63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"
        )))
    }
}

impl NodeDisk {
    fn tenant_dir(&self, tenant: &str) -> PathBuf {
        self.volumes.join(hex::encode(tenant))
    }

    /// Makes volume `name` of `tenant`, bounded to `size_mb`.
    pub fn create_volume(&self, tenant: &str, name: &str, size_mb: u64) -> Result<VolumeInfo, DiskError> {
        check_name(name)?;
        if size_mb == 0 {
            return Err(DiskError::Invalid("a volume's size must be at least 1 MiB".into()));
        }
        let dir = self.tenant_dir(tenant);
        std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        match super::make_subvolume(&dir, name, size_mb << 20) {
            Ok(_) => {}
            Err(DiskError::Io { source, .. }) if source.raw_os_error() == Some(libc::EEXIST) => {
                return Err(DiskError::VolumeExists(name.to_string()))
            }
            Err(e) => return Err(e),
        }
        // Anyone in a sandbox may write to it (the sandbox's users are the
        // image's, not the host's).
        let path = dir.join(name);
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o1777)).map_err(io("opening up", &path))?;
        self.volume(tenant, name)
    }

    /// The host directory of volume `name` of `tenant`.
    pub fn volume_path(&self, tenant: &str, name: &str) -> Result<PathBuf, DiskError> {
        check_name(name)?;
        let path = self.tenant_dir(tenant).join(name);
        if path.is_dir() {
            Ok(path)
        } else {
            Err(DiskError::VolumeNotFound(name.to_string()))
        }
    }

    /// Volume `name` of `tenant`, with its size and use.
    pub fn volume(&self, tenant: &str, name: &str) -> Result<VolumeInfo, DiskError> {
        let path = self.volume_path(tenant, name)?;
        let fd = open_dir(&path)?;
        let sid = btrfs::subvolume_id(std::os::fd::AsFd::as_fd(&fd)).map_err(io("reading the id of subvolume", &path))?;
        let qgroup = self.qgroups.join(format!("0_{sid}"));
        let max = std::fs::read_to_string(qgroup.join("max_referenced")).ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
        let created_ms = std::fs::metadata(&path)
            .and_then(|m| m.created().or_else(|_| m.modified()))
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64);
        Ok(VolumeInfo {
            tenant: tenant.to_string(),
            name: name.to_string(),
            size_mb: max >> 20,
            used_bytes: self.used_bytes(sid).unwrap_or(0),
            created_ms,
        })
    }

    /// Every volume of `tenant`, or of every tenant (`None`), by name.
    pub fn list_volumes(&self, tenant: Option<&str>) -> Vec<VolumeInfo> {
        let tenants: Vec<String> = match tenant {
            Some(t) => vec![t.to_string()],
            None => std::fs::read_dir(&self.volumes)
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| hex::decode(e.file_name().as_encoded_bytes()).ok())
                        .filter_map(|b| String::from_utf8(b).ok())
                        .collect()
                })
                .unwrap_or_default(),
        };
        let mut out = Vec::new();
        for t in tenants {
            let Ok(entries) = std::fs::read_dir(self.tenant_dir(&t)) else { continue };
            for name in entries.flatten().filter_map(|e| e.file_name().into_string().ok()) {
                if let Ok(v) = self.volume(&t, &name) {
                    out.push(v);
                }
            }
        }
        out.sort_by(|a, b| (&a.tenant, &a.name).cmp(&(&b.tenant, &b.name)));
        out
    }

    /// Removes volume `name` of `tenant` and everything in it (the caller
    /// has checked that no sandbox uses it).
    pub fn remove_volume(&self, tenant: &str, name: &str) -> Result<(), DiskError> {
        self.volume_path(tenant, name)?;
        super::remove_subvolume(&self.tenant_dir(tenant), name)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn volume_names_are_plain() {
        for ok in ["data", "a", "cache-1.2_x", "0abc"] {
            assert!(super::check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", ".x", "A", "a/b", "a b", &"x".repeat(64), ".."] {
            assert!(super::check_name(bad).is_err(), "{bad}");
        }
    }
}
