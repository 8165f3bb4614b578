//! One dsec layer (an EROFS blob) as an OCI layer blob: a gzip-compressed
//! tar (`layer_tar`) in the store's temp space, with the two digests OCI
//! needs (of the compressed blob for the manifest, of the tar for the
//! config's `diff_ids`), both computed in the pass that writes it.
//!
//! The blob is read through a kernel EROFS mount that exists only in a
//! private mount namespace of one short-lived thread: no other process
//! ever sees it, and it disappears with the thread, whatever happens to the
//! export (an error, a panic, the process being killed). Needs root, like
//! every layer mount.

use std::io::{self, BufWriter, Write};
use std::path::Path;

use flate2::write::GzEncoder;
use rustix::mount::{mount, mount_change, MountFlags, MountPropagationFlags};
use tempfile::NamedTempFile;

use super::layer_tar::{write_layer_tar, TarStats};
use crate::digest::{Digest, HashingWriter};
use crate::progress::Progress;
use crate::store::ImageStore;

/// An OCI layer blob waiting to be uploaded (deleted when dropped).
pub(crate) struct ExportedLayer {
    pub file: NamedTempFile,
    /// sha256 of the compressed blob.
    pub digest: Digest,
    pub size: u64,
    /// sha256 of the uncompressed tar.
    pub diff_id: Digest,
    pub stats: TarStats,
}

/// Writes the EROFS layer at `blob` as a `tar+gzip` OCI layer.
pub(crate) fn export_layer(store: &ImageStore, blob: &Path, progress: &dyn Progress) -> io::Result<ExportedLayer> {
    let mountpoint = tempfile::Builder::new().prefix("export-").tempdir_in(store.temp_dir())?;
    let out = store.temp_file().map_err(|e| io::Error::other(e.to_string()))?;
    let target = mountpoint.path();
    let file = out.reopen()?;
    let (digest, size, diff_id, stats) = std::thread::scope(|s| {
        s.spawn(|| -> io::Result<(Digest, u64, Digest, TarStats)> {
            enter_private_mount_namespace()?;
            mount(blob, target, "erofs", MountFlags::RDONLY | MountFlags::NODEV | MountFlags::NOSUID, None)
                .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("mounting {} read-only: {e}", blob.display())))?;
            let compressed = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
            // Level 6 (gzip's default): registries and clients expect gzip;
            // the CPU it costs is paid once per push.
            let gz = GzEncoder::new(compressed, flate2::Compression::default());
            let (tar, stats) = write_layer_tar(target, HashingWriter::new(gz), progress)?;
            let (diff_id, _, gz) = tar.into_parts();
            let (digest, size, mut file) = gz.finish()?.into_parts();
            file.flush()?;
            Ok((digest, size, diff_id, stats))
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the layer export thread panicked")))
    })?;
    Ok(ExportedLayer { file: out, digest, size, diff_id, stats })
}

/// Moves the calling thread into a mount namespace of its own in which
/// nothing propagates back to the host's.
fn enter_private_mount_namespace() -> io::Result<()> {
    // SAFETY: NEWNS (which implies unsharing the filesystem context, cwd
    // and root) leaves the fd table and memory shared, which is what makes
    // unshare unsafe in general; this thread only mounts and reads files.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("unshare(CLONE_NEWNS): {e}")))?;
    mount_change("/", MountPropagationFlags::PRIVATE | MountPropagationFlags::REC)
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("making / private: {e}")))
}
