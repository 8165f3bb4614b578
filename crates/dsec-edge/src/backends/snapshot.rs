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
//!
//! Deletion (`SnapshotDir::remove`) is refused while anything backs onto
//! the layer: a snapshot that chains onto it, or a sandbox disk started
//! from it (the edge checks both under `SnapshotDir::guard`, which a new
//! sandbox's overlay creation holds too, so a disk never comes to back
//! onto a layer being deleted). The metadata goes first, so a crash in
//! between leaves an unlisted layer, which `open` removes.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::backends::Unavailable;
use crate::error::EdgeError;
use crate::model::BackendKind;

/// Snapshots written before full VMs had them are microVMs'.
fn microvm_kind() -> BackendKind {
    BackendKind::Microvm
}

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
    /// The snapshot it chains onto (`None`: the empty template, or a
    /// full VM's base image).
    pub parent: Option<String>,
    /// What sandboxes started from it are: a microVM (the disk is its
    /// writable layer) or a full VM (the disk is its whole disk, over the
    /// image's base disk).
    #[serde(default = "microvm_kind")]
    pub backend: BackendKind,
    pub created_at_ms: u64,
    /// Bytes its own layer occupies on disk.
    pub bytes: u64,
    /// A memory snapshot (microVMs): the source's RAM and device state
    /// too (`<id>.ram`, `<id>.vmstate`), so sandboxes started from it
    /// continue the source's processes instead of booting.
    #[serde(default)]
    pub memory: Option<SnapshotMemory>,
}

/// What a memory snapshot's sandboxes must match: the machine the memory
/// was saved from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotMemory {
    pub memory_mb: u64,
    pub cpu_cores: f64,
    /// The image's layer files, topmost first: the guest has them mounted.
    pub layer_files: Vec<PathBuf>,
}

/// The node's snapshots directory.
#[derive(Debug, Clone)]
pub struct SnapshotDir {
    dir: PathBuf,
}

/// Held while a snapshot is checked and deleted, and while a new disk is
/// chained onto one (one lock for the process: both are short and rare).
static GUARD: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl SnapshotDir {
    /// Opens (makes) the directory and removes what an interrupted write
    /// or deletion left: temporary metadata, layers without metadata.
    /// Called at edge start, before any snapshot is written.
    pub fn open(dir: PathBuf) -> Result<Self, Unavailable> {
        std::fs::create_dir_all(&dir).map_err(Unavailable::state_dir(&dir))?;
        let snaps = Self { dir };
        let removed = snaps.remove_orphans();
        if removed > 0 {
            tracing::info!(removed, dir = %snaps.dir.display(), "removed incomplete snapshot files");
        }
        Ok(snaps)
    }

    /// Serialises deletion against new disks chaining onto a snapshot.
    pub fn guard(&self) -> std::sync::MutexGuard<'static, ()> {
        GUARD.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remove_orphans(&self) -> usize {
        let Ok(dir) = std::fs::read_dir(&self.dir) else { return 0 };
        let mut gone = 0;
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let orphan = name.ends_with(".json.tmp")
                || [".qcow2", ".ram", ".vmstate"].iter().any(|sfx| name.strip_suffix(sfx).is_some_and(|id| !self.meta_path(id).is_file()));
            if orphan && std::fs::remove_file(e.path()).is_ok() {
                gone += 1;
            }
        }
        gone
    }

    /// The snapshots that chain onto `id`.
    pub fn children(&self, id: &str) -> Vec<SnapshotMeta> {
        self.list().into_iter().filter(|m| m.parent.as_deref() == Some(id)).collect()
    }

    /// Makes `disk`, a new overlay on snapshot `id`, unless the snapshot
    /// was deleted since the request named it.
    pub fn chain_onto(&self, id: &str, disk: &Path) -> Result<(), EdgeError> {
        let _guard = self.guard();
        let meta = self.get(id).ok_or_else(|| EdgeError::SnapshotNotFound(id.to_string()))?;
        create_overlay(&self.layer(&meta.id), disk)
    }

    /// Deletes snapshot `id` (metadata first: unlisted at once). The
    /// caller holds `guard` and checked that nothing backs onto it.
    pub fn remove(&self, id: &str) -> Result<(), EdgeError> {
        for path in [self.meta_path(id), self.layer(id), self.ram(id), self.vmstate(id)] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(EdgeError::Io { action: "removing", path, source: e }),
            }
        }
        Ok(())
    }

    /// The disk layer of snapshot `id`.
    pub fn layer(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.qcow2"))
    }

    /// The snapshot whose layer `path` is (`None`: not a snapshot's, e.g.
    /// an empty template or a VM image's base disk).
    pub fn id_of_layer(&self, path: &Path) -> Option<String> {
        let id = path.strip_prefix(&self.dir).ok()?.to_str()?.strip_suffix(".qcow2")?;
        self.meta_path(id).is_file().then(|| id.to_string())
    }

    /// The guest RAM of memory snapshot `id`.
    pub fn ram(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.ram"))
    }

    /// The device state of memory snapshot `id`.
    pub fn vmstate(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.vmstate"))
    }

    /// Copies a suspended VM's RAM file and device state as those of
    /// snapshot `id` (before `write` lists it; removed again on error).
    pub fn write_memory(&self, id: &str, ram: &Path, vmstate: &Path) -> Result<(), EdgeError> {
        let copied =
            super::qemu::disk::sparse_copy(ram, &self.ram(id)).and_then(|()| super::qemu::disk::sparse_copy(vmstate, &self.vmstate(id)));
        copied.map_err(|e| {
            let _ = std::fs::remove_file(self.ram(id));
            let _ = std::fs::remove_file(self.vmstate(id));
            EdgeError::Io { action: "copying into a snapshot", path: ram.to_path_buf(), source: e }
        })
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
        super::qemu::disk::sparse_copy(overlay, &layer).map_err(EdgeError::io("copying into a snapshot", overlay))?;
        meta.bytes = super::qemu::suspend::allocated(&layer);
        let tmp = self.dir.join(format!(".{}.json.tmp", meta.id));
        let written = serde_json::to_vec_pretty(&meta)
            .map_err(|source| EdgeError::Stored { what: format!("snapshot {}", meta.name), source })
            .and_then(|bytes| std::fs::write(&tmp, bytes).map_err(EdgeError::io("writing", &tmp)))
            .and_then(|()| std::fs::rename(&tmp, self.meta_path(&meta.id)).map_err(EdgeError::io("renaming", &tmp)));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_file(&layer);
            return Err(e);
        }
        Ok(meta)
    }
}

/// Makes `dst`, a qcow2 overlay over `backing` (raw or qcow2, by name),
/// of the backing file's size.
pub fn create_overlay(backing: &Path, dst: &Path) -> Result<(), EdgeError> {
    create_overlay_of_size(backing, dst, None)
}

/// `create_overlay`, with a virtual size of `size` bytes (larger than the
/// backing file's: the guest sees a bigger disk) when given.
pub fn create_overlay_of_size(backing: &Path, dst: &Path, size: Option<u64>) -> Result<(), EdgeError> {
    let mut cmd = Command::new("qemu-img");
    cmd.args(["create", "-q", "-f", "qcow2", "-o", "cluster_size=65536", "-F", super::qemu::cmdline::disk_format(backing), "-b"])
        .arg(backing)
        .arg(dst);
    if let Some(size) = size {
        cmd.arg(size.to_string());
    }
    let out = cmd.output().map_err(EdgeError::sys("running qemu-img (Debian package qemu-utils)"))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(dst);
        return Err(EdgeError::Command { program: "qemu-img create", detail: String::from_utf8_lossy(&out.stderr).trim().to_string() });
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

/// The disks (`<sandbox id>.qcow2`) in `dirs` whose backing file is
/// `layer`: the sandboxes started from that snapshot whose files exist.
pub fn disks_backed_by(dirs: &[&Path], layer: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_suffix(".qcow2") {
                if backing_file(&e.path()).as_deref() == Some(layer) {
                    out.push(id.to_string());
                }
            }
        }
    }
    out.sort();
    out
}

/// The virtual size (bytes) a qcow2 image's header states (`None`: not a
/// qcow2 file).
pub fn virtual_size(image: &Path) -> Option<u64> {
    use std::io::Read;
    let mut head = [0u8; 32];
    std::fs::File::open(image).ok()?.read_exact(&mut head).ok()?;
    (&head[..4] == b"QFI\xfb").then(|| u64::from_be_bytes(head[24..32].try_into().unwrap_or_default()))
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
        let template = super::super::microvm::disk::template(dir.path(), 16).unwrap();
        let a = dir.path().join("a.qcow2");
        create_overlay(&template, &a).unwrap();
        assert_eq!(backing_file(&a), Some(template.clone()));
        let b = dir.path().join("b.qcow2");
        create_overlay(&a, &b).unwrap();
        assert_eq!(backing_file(&b), Some(a.clone()));
        assert_eq!(backing_file(&template), None, "a raw file has no backing");
        assert_eq!(virtual_size(&b), Some(16 << 20));
        assert_eq!(virtual_size(&template), None);
        let big = dir.path().join("big.qcow2");
        create_overlay_of_size(&a, &big, Some(32 << 20)).unwrap();
        assert_eq!(virtual_size(&big), Some(32 << 20));
        // Small: an overlay holds only its header and tables.
        assert!(super::super::qemu::suspend::allocated(&b) < 1 << 20);
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
            backend: BackendKind::Microvm,
            created_at_ms: 1,
            bytes: 0,
            memory: None,
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

    #[test]
    fn removal_unlists_first_and_open_removes_what_a_crash_left() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = SnapshotDir::open(dir.path().join("snaps")).unwrap();
        let template = super::super::microvm::disk::template(dir.path(), 16).unwrap();
        let overlay = dir.path().join("o.qcow2");
        create_overlay(&template, &overlay).unwrap();
        let meta = |id: &str, parent: Option<&str>| SnapshotMeta {
            id: id.into(),
            name: id.into(),
            tenant: "t".into(),
            source: "n.x".into(),
            image: "busybox".into(),
            workspace: None,
            toolkits: vec![],
            disk_mb: 16,
            parent: parent.map(Into::into),
            backend: BackendKind::Microvm,
            created_at_ms: 1,
            bytes: 0,
            memory: None,
        };
        snaps.write(&overlay, meta("snap-a", None)).unwrap();
        snaps.write(&overlay, meta("snap-b", Some("snap-a"))).unwrap();
        assert_eq!(snaps.children("snap-a").iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["snap-b"]);
        assert!(snaps.children("snap-b").is_empty());
        // A sandbox disk started from snap-b backs onto its layer.
        let disks = dir.path().join("disks");
        std::fs::create_dir(&disks).unwrap();
        create_overlay(&snaps.layer("snap-b"), &disks.join("n.kid.qcow2")).unwrap();
        create_overlay(&template, &disks.join("n.other.qcow2")).unwrap();
        assert_eq!(disks_backed_by(&[&disks], &snaps.layer("snap-b")), ["n.kid"]);
        assert!(disks_backed_by(&[&disks], &snaps.layer("snap-a")).is_empty());
        assert_eq!(snaps.id_of_layer(&snaps.layer("snap-a")).as_deref(), Some("snap-a"));
        assert_eq!(snaps.id_of_layer(&template), None);
        snaps.remove("snap-b").unwrap();
        assert!(snaps.get("snap-b").is_none() && !snaps.layer("snap-b").exists());
        snaps.remove("snap-b").unwrap();
        // What a crash between the two removals, or during a write, leaves.
        std::fs::remove_file(snaps.meta_path("snap-a")).unwrap();
        std::fs::write(snaps.dir.join(".snap-c.json.tmp"), b"{").unwrap();
        let reopened = SnapshotDir::open(snaps.dir.clone()).unwrap();
        assert_eq!(std::fs::read_dir(&reopened.dir).unwrap().count(), 0, "orphans removed");
    }
}
