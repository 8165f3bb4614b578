//! Disk snapshots of microVMs that chain, and the overlays new sandboxes
//! start from.
//!
//! Every microVM's writable disk is a qcow2 overlay (`disks/<id>.qcow2`)
//! whose backing file is either the empty ext4 template of its size or a
//! snapshot. A snapshot is a copy of a sandbox's own overlay, taken while
//! its vCPUs are stopped (after a guest `sync`), or while it is suspended:
//! the overlay holds only what this sandbox wrote, so the copy is
//! incremental, and it keeps the overlay's backing pointer, so snapshots
//! chain (a fork's snapshot -> its parent's snapshot -> ... -> the
//! template). Snapshots and templates never change once written, which is
//! what makes them safe backing files. The copy is a sparse copy with
//! `copy_file_range` (a reflink on filesystems that have them).
//!
//! Why a copy and not `blockdev-snapshot-sync` (which would make the live
//! overlay the snapshot and give the VM a new one on top, in O(1)): that
//! lengthens the running VM's chain at every snapshot and ties a live
//! sandbox's files to snapshot lifetimes; with a copy each sandbox owns
//! exactly one file, and the cost is a copy of what it changed (bounded by
//! its disk limit), paid while its vCPUs are stopped.
//!
//! Metadata (`<snapid>.json`, next to `<snapid>.qcow2`): owner, name,
//! source sandbox and the image stack it ran.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::error::EdgeError;

/// What a snapshot records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// `snap-<random>`, unique on the node.
    pub id: String,
    /// The owner's name for it, unique per tenant.
    pub name: String,
    pub tenant: String,
    /// The sandbox it was taken from.
    pub source: String,
    pub image: String,
    pub workspace: Option<String>,
    pub toolkits: Vec<String>,
    /// Size of the disk (the ext4 filesystem inside).
    pub disk_mb: u64,
    /// The snapshot it chains onto (`None`: the empty template).
    pub parent: Option<String>,
    pub created_at_ms: u64,
    /// Bytes its own layer occupies on disk.
    pub bytes: u64,
}

/// The node's snapshots directory.
#[derive(Debug, Clone)]
pub struct SnapshotDir {
    dir: PathBuf,
}

impl SnapshotDir {
    pub fn open(dir: PathBuf) -> Result<Self, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(Self { dir })
    }

    /// The disk layer of snapshot `id`.
    pub fn layer(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.qcow2"))
    }

    fn meta_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Every snapshot on the node (unreadable entries are skipped).
    pub fn list(&self) -> Vec<SnapshotMeta> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else { return vec![] };
        let mut out: Vec<SnapshotMeta> = dir
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
            .collect();
        out.sort_by(|a, b| a.created_at_ms.cmp(&b.created_at_ms).then_with(|| a.id.cmp(&b.id)));
        out
    }

    /// The snapshot `name` of `tenant`.
    pub fn find(&self, tenant: &str, name: &str) -> Option<SnapshotMeta> {
        self.list().into_iter().find(|m| m.tenant == tenant && m.name == name)
    }

    /// The snapshot with id `id`.
    pub fn get(&self, id: &str) -> Option<SnapshotMeta> {
        serde_json::from_slice(&std::fs::read(self.meta_path(id)).ok()?).ok()
    }

    /// Copies `overlay` as the layer of a new snapshot and records `meta`
    /// (layer first, metadata last and atomically: a snapshot is listed
    /// only once it is whole).
    pub fn write(&self, overlay: &Path, mut meta: SnapshotMeta) -> Result<SnapshotMeta, EdgeError> {
        let layer = self.layer(&meta.id);
        super::disk::sparse_copy(overlay, &layer)
            .map_err(|e| EdgeError::Internal(format!("copying {} to {}: {e}", overlay.display(), layer.display())))?;
        meta.bytes = super::suspend::allocated(&layer);
        let tmp = self.dir.join(format!(".{}.json.tmp", meta.id));
        let written = serde_json::to_vec_pretty(&meta)
            .map_err(|e| e.to_string())
            .and_then(|bytes| std::fs::write(&tmp, bytes).map_err(|e| e.to_string()))
            .and_then(|()| std::fs::rename(&tmp, self.meta_path(&meta.id)).map_err(|e| e.to_string()));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_file(&layer);
            return Err(EdgeError::Internal(format!("recording snapshot {}: {e}", meta.name)));
        }
        Ok(meta)
    }
}

/// Makes `dst`, a qcow2 overlay over `backing` (raw or qcow2, by name),
/// of the backing file's size.
pub fn create_overlay(backing: &Path, dst: &Path) -> Result<(), EdgeError> {
    let out = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-o", "cluster_size=65536", "-F", super::cmdline::disk_format(backing), "-b"])
        .arg(backing)
        .arg(dst)
        .output()
        .map_err(|e| EdgeError::Internal(format!("running qemu-img (Debian package qemu-utils): {e}")))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(dst);
        return Err(EdgeError::Internal(format!(
            "qemu-img create {}: {}",
            dst.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The backing file a qcow2 image names in its header (`None`: none, or
/// not a qcow2 file).
pub fn backing_file(image: &Path) -> Option<PathBuf> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(image).ok()?;
    let mut head = [0u8; 20];
    f.read_exact(&mut head).ok()?;
    if &head[..4] != b"QFI\xfb" {
        return None;
    }
    let offset = u64::from_be_bytes(head[8..16].try_into().ok()?);
    let len = u32::from_be_bytes(head[16..20].try_into().ok()?) as usize;
    if offset == 0 || len == 0 || len > 4096 {
        return None;
    }
    f.seek(SeekFrom::Start(offset)).ok()?;
    let mut name = vec![0u8; len];
    f.read_exact(&mut name).ok()?;
    Some(PathBuf::from(String::from_utf8(name).ok()?))
}

/// Snapshot names: what a user types and a path may hold.
pub fn validate_name(name: &str) -> Result<(), EdgeError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c))
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(EdgeError::Invalid(format!(
            "snapshot name {name:?}: 1 to 128 characters of letters, digits, '.', '_', ':', '-', not starting with '.'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlays_chain_and_name_their_backing_file() {
        let dir = tempfile::tempdir().unwrap();
        let template = super::super::disk::template(dir.path(), 16).unwrap();
        let a = dir.path().join("a.qcow2");
        create_overlay(&template, &a).unwrap();
        assert_eq!(backing_file(&a), Some(template.clone()));
        let b = dir.path().join("b.qcow2");
        create_overlay(&a, &b).unwrap();
        assert_eq!(backing_file(&b), Some(a.clone()));
        assert_eq!(backing_file(&template), None, "a raw file has no backing");
        // Small: an overlay holds only its header and tables.
        assert!(super::super::suspend::allocated(&b) < 1 << 20);
    }

    #[test]
    fn snapshots_are_listed_once_whole_and_found_by_owner_and_name() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = SnapshotDir::open(dir.path().join("snaps")).unwrap();
        let overlay = dir.path().join("o.qcow2");
        std::fs::write(&overlay, b"QFI\xfbnot really").unwrap();
        let meta = SnapshotMeta {
            id: "snap-1".into(),
            name: "base:v1".into(),
            tenant: "alice".into(),
            source: "n.abc".into(),
            image: "busybox".into(),
            workspace: None,
            toolkits: vec![],
            disk_mb: 64,
            parent: None,
            created_at_ms: 1,
            bytes: 0,
        };
        let written = snaps.write(&overlay, meta).unwrap();
        assert_eq!(std::fs::read(snaps.layer("snap-1")).unwrap(), std::fs::read(&overlay).unwrap());
        assert_eq!(snaps.find("alice", "base:v1"), Some(written.clone()));
        assert_eq!(snaps.find("bob", "base:v1"), None);
        assert_eq!(snaps.get("snap-1"), Some(written));
        assert!(validate_name("ok-name_1.2:3").is_ok());
        for bad in ["", ".hidden", "a/b", "x y"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
