//! The edge's named-volume operations: create, list (with the sandboxes
//! that use each), remove (refused while one does), and resolving a
//! creation's volumes for its owner.

use std::sync::Arc;

use super::volumes::{VolumeBind, VolumeInfo};
use super::NodeDisk;
use crate::error::EdgeError;
use crate::model::{Caller, SandboxSpec};
use crate::Edge;

/// A volume's size when its creation names none.
pub const DEFAULT_VOLUME_MB: u64 = 1024;

/// A volume and the sandboxes, not yet stopped, that mount it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeUse {
    pub volume: VolumeInfo,
    pub sandboxes: Vec<String>,
}

impl Edge {
    fn node_disk(&self) -> Result<&Arc<NodeDisk>, EdgeError> {
        self.inner.backends.disk().ok_or_else(|| {
            EdgeError::VolumesUnavailable(format!(
                "node {} keeps writable layers in memory (--writable-layer tmpfs): it has no disk for named volumes",
                self.inner.config.node
            ))
        })
    }

    /// Makes volume `name` of the caller's, bounded to `size_mb`.
    pub async fn create_volume(&self, caller: &Caller, name: &str, size_mb: Option<u64>) -> Result<VolumeUse, EdgeError> {
        let disk = self.node_disk()?.clone();
        let size = size_mb.unwrap_or(DEFAULT_VOLUME_MB);
        let max = self.inner.config.policy.max_disk_mb;
        if size == 0 || size > max {
            return Err(EdgeError::InvalidLimits(format!("size_mb must be between 1 and {max} (got {size})")));
        }
        let (tenant, name) = (caller.tenant.clone(), name.to_string());
        let volume = tokio::task::spawn_blocking(move || disk.create_volume(&tenant, &name, size))
            .await
            .map_err(EdgeError::task("volume creation"))??;
        Ok(VolumeUse { volume, sandboxes: Vec::new() })
    }

    /// The caller's volumes (an admin's: every tenant's), with their users;
    /// none on a node without a disk.
    pub async fn volumes(&self, caller: &Caller) -> Result<Vec<VolumeUse>, EdgeError> {
        let Some(disk) = self.inner.backends.disk().cloned() else { return Ok(Vec::new()) };
        let tenant = (!caller.admin).then(|| caller.tenant.clone());
        let list =
            tokio::task::spawn_blocking(move || disk.list_volumes(tenant.as_deref())).await.map_err(EdgeError::task("volume listing"))?;
        Ok(list
            .into_iter()
            .map(|v| {
                let sandboxes = self.volume_users(&v.tenant, &v.name);
                VolumeUse { volume: v, sandboxes }
            })
            .collect())
    }

    /// Removes volume `name` of the caller's and what it holds; refused
    /// while a sandbox that is not yet stopped mounts it.
    pub async fn delete_volume(&self, caller: &Caller, name: &str) -> Result<(), EdgeError> {
        let disk = self.node_disk()?.clone();
        // A creation resolves its volumes just before it enters the
        // registry: one that raced this check finds the directory gone
        // when its agent binds it, and fails whole (nothing half-made).
        let users = self.volume_users(&caller.tenant, name);
        if !users.is_empty() {
            return Err(EdgeError::VolumeInUse(format!(
                "volume {name:?} is mounted in sandboxes {}: stop or delete them first",
                users.join(", ")
            )));
        }
        let (tenant, name) = (caller.tenant.clone(), name.to_string());
        tokio::task::spawn_blocking(move || disk.remove_volume(&tenant, &name)).await.map_err(EdgeError::task("volume removal"))??;
        Ok(())
    }

    /// Sandboxes of `tenant`, not yet stopped, that mount volume `name`.
    fn volume_users(&self, tenant: &str, name: &str) -> Vec<String> {
        let reg = self.inner.registry.read().unwrap_or_else(|p| p.into_inner());
        let mut ids: Vec<String> = reg
            .values()
            .map(|e| e.record())
            .filter(|r| r.tenant == tenant && !r.state.is_terminal() && r.spec.volumes.values().any(|v| v.name == name))
            .map(|r| r.id)
            .collect();
        ids.sort();
        ids
    }

    /// The host directories of `spec`'s volumes, which must be `tenant`'s.
    pub(crate) fn resolve_volumes(&self, tenant: &str, spec: &SandboxSpec) -> Result<Vec<VolumeBind>, EdgeError> {
        if spec.volumes.is_empty() {
            return Ok(Vec::new());
        }
        let disk = self.node_disk()?;
        spec.volumes
            .iter()
            .map(|(target, v)| -> Result<VolumeBind, EdgeError> {
                Ok(VolumeBind {
                    name: v.name.clone(),
                    source: disk.volume_path(tenant, &v.name)?,
                    target: target.clone(),
                    read_only: v.read_only,
                })
            })
            .collect()
    }
}
