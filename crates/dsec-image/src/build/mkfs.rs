//! `mkfs.erofs` from a prepared root directory straight into a store temp
//! file, then publication through the store's checks.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use super::tool::{self, MKFS_EROFS};
use super::{io_err, BuildError, BuildOptions, Compression};
use crate::progress::{Progress, Unit};
use crate::store::{ImageStore, StoredLayer};

pub(crate) fn mkfs_into_store(
    store: &ImageStore,
    root: &Path,
    options: &BuildOptions,
    progress: &dyn Progress,
) -> Result<StoredLayer, BuildError> {
    progress.stage(&format!("mkfs.erofs ({})", describe(options.compression)));
    let temp = store.temp_file()?;
    let mut cmd = Command::new(MKFS_EROFS.name);
    // Keep every file's own mtime: a single build-time mtime would make
    // Python's .pyc caches look stale and be rewritten in every sandbox.
    cmd.arg("--preserve-mtime");
    match options.compression {
        Compression::None => {}
        Compression::Lz4 => {
            cmd.arg("-zlz4");
        }
        Compression::Lz4hc { level: None } => {
            cmd.arg("-zlz4hc");
        }
        Compression::Lz4hc { level: Some(level) } => {
            cmd.arg(format!("-zlz4hc,{level}"));
        }
    }
    cmd.arg(temp.path()).arg(root);
    tool::run(&MKFS_EROFS, cmd, None)?;

    // mkfs opens the path we gave it; make sure it wrote the inode our
    // handle points at (not a replacement file), or we would hash the wrong one.
    let by_path = std::fs::metadata(temp.path()).map_err(io_err("reading", temp.path()))?;
    let by_handle = temp.as_file().metadata().map_err(io_err("reading", temp.path()))?;
    if (by_path.dev(), by_path.ino()) != (by_handle.dev(), by_handle.ino()) {
        return Err(BuildError::ToolFailed {
            tool: MKFS_EROFS.name,
            status: "success".into(),
            output_tail: "the output file was replaced instead of written in place".into(),
        });
    }
    progress.advance(by_handle.len(), Some(by_handle.len()), Unit::Bytes);
    progress.stage("verifying and storing the layer");
    Ok(store.put_layer_from_temp(temp, None)?)
}

fn describe(c: Compression) -> String {
    match c {
        Compression::None => "uncompressed".into(),
        Compression::Lz4 => "lz4".into(),
        Compression::Lz4hc { level: None } => "lz4hc".into(),
        Compression::Lz4hc { level: Some(l) } => format!("lz4hc level {l}"),
    }
}
