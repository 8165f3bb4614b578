//! A VM's writable disk as the host copies it: a snapshot of a running
//! VM's disk, taken while its vCPUs stand (both VM backends), and the
//! sparse copy snapshots are made with.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Instant;

use super::cmdline::VmFiles;
use super::qmp;
use crate::backends::snapshot;
use crate::error::EdgeError;

/// Copies the writable disk `files.disk` of a VM into a new snapshot in
/// `snaps` (shared by both VM backends). `running`: its vCPUs are stopped
/// for the copy (the caller synced the guest; QEMU's `stop` flushes its
/// own caches to the image); otherwise it is suspended and its disk
/// quiet. Returns the snapshot and how long the vCPUs were stopped.
pub(crate) async fn snapshot_disk(
    snaps: &snapshot::SnapshotDir,
    files: VmFiles,
    running: bool,
    mut meta: snapshot::SnapshotMeta,
) -> Result<(snapshot::SnapshotMeta, f64), EdgeError> {
    meta.parent = snapshot::backing_file(&files.disk).and_then(|b| snaps.id_of_layer(&b));
    let qmp = files.qmp_socket();
    if running {
        qmp::execute(&qmp, "stop").await?;
    }
    let t0 = Instant::now();
    let snaps = snaps.clone();
    let copied =
        tokio::task::spawn_blocking(move || snaps.write(&files.disk, meta)).await.map_err(EdgeError::task("snapshot")).and_then(|r| r);
    let frozen_ms = t0.elapsed().as_secs_f64() * 1000.0;
    if running {
        qmp::execute(&qmp, "cont").await?;
    }
    copied.map(|m| (m, frozen_ms))
}

/// Copies `src` to a new file `dst` keeping its holes (SEEK_DATA /
/// SEEK_HOLE + copy_file_range).
pub fn sparse_copy(src: &Path, dst: &Path) -> std::io::Result<()> {
    use rustix::fs::{copy_file_range, seek, SeekFrom};
    let from = File::open(src)?;
    let len = from.metadata()?.len();
    let to = std::fs::OpenOptions::new().write(true).create_new(true).open(dst)?;
    let copy = || -> std::io::Result<()> {
        to.set_len(len)?;
        let mut pos = 0u64;
        while pos < len {
            let data = match seek(from.as_fd(), SeekFrom::Data(pos)) {
                Ok(d) => d,
                // No data after pos: the rest is a hole.
                Err(rustix::io::Errno::NXIO) => break,
                Err(e) => return Err(e.into()),
            };
            let hole = seek(from.as_fd(), SeekFrom::Hole(data))?;
            let (mut off_in, mut off_out) = (data, data);
            while off_in < hole {
                let want = (hole - off_in) as usize;
                let n = copy_file_range(from.as_fd(), Some(&mut off_in), to.as_fd(), Some(&mut off_out), want)?;
                if n == 0 {
                    break;
                }
            }
            pos = hole;
        }
        Ok(())
    };
    copy().inspect_err(|_| {
        let _ = std::fs::remove_file(dst);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, Write};
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_sparse_copy_keeps_data_and_holes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let mut f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.seek(std::io::SeekFrom::Start(10 << 20)).unwrap();
        f.write_all(b"middle").unwrap();
        f.seek(std::io::SeekFrom::Start((64 << 20) - 4)).unwrap();
        f.write_all(b"end!").unwrap();
        drop(f);
        let dst = dir.path().join("dst");
        sparse_copy(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        let blocks = std::fs::metadata(&dst).unwrap().blocks() * 512;
        assert!(blocks < 1 << 20, "the copy allocated {blocks} bytes");
        // A second copy onto an existing file is refused, not truncated.
        assert!(sparse_copy(&src, &dst).is_err());
    }
}
