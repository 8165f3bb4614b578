//! Builders that turn a root filesystem (a directory, a tar archive, a
//! debootstrap run, a busybox recipe) into an EROFS layer in the store.
//!
//! Every builder works in a scratch directory inside the store's `tmp/`,
//! which is deleted on every exit path, and publishes the layer only after
//! `mkfs.erofs` succeeded and the result passed the store's checks.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::manifest::{ImageConfig, LayerDescriptor, LayerKind, Manifest};
use crate::reference::Reference;
use crate::store::{ImageError, ImageStore, ResolvedImage, StoredLayer};

mod busybox;
mod dax;
mod debootstrap;
mod dir;
mod java_cds;
mod mkfs;
mod pch;
mod tar;
pub(crate) mod tool;
mod users;

pub use busybox::{build_layer_busybox, BusyboxRecipe};
pub use dax::build_dax_image;
pub use debootstrap::{build_layer_debootstrap, DebootstrapRecipe, DEFAULT_MIRROR};
pub(crate) use debootstrap::{build_layer_debootstrap_then, debootstrap_tree};
pub use dir::build_layer_from_dir;
pub(crate) use java_cds::archive_java_classes;
pub(crate) use mkfs::mkfs_into_store;
pub(crate) use pch::precompile_stdcpp;
pub use tar::build_layer_from_tar;
pub(crate) use tar::{unpack_entry_in, UnpackError};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("`{tool}` was not found on PATH (Debian package: {package})")]
    ToolMissing { tool: &'static str, package: &'static str },
    #[error("`{tool}` failed ({status}); its last output:\n{output_tail}")]
    ToolFailed { tool: &'static str, status: String, output_tail: String },
    #[error("tar entry `{entry}` would be written outside the root filesystem")]
    TarEntryEscapes { entry: String },
    #[error("unpacking tar archive {path}: {source}")]
    Tar {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid build recipe: {0}")]
    InvalidRecipe(String),
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("{path} is not statically linked; a busybox image needs a static busybox (Debian package: busybox-static)")]
    BusyboxNotStatic { path: PathBuf },
    #[error("`busybox --list` printed an unusable applet path `{0}`")]
    BadApplet(String),
    #[error("precompiling <bits/stdc++.h>: {0}")]
    PrecompiledHeader(String),
    #[error("archiving Java's classes: {0}")]
    JavaCds(String),
    #[error("disk full while building ({0})")]
    DiskFull(String),
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Store(#[from] ImageError),
}

pub(crate) fn io_err<'a>(context: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> BuildError + 'a {
    move |source| {
        if crate::fsutil::is_enospc(&source) {
            BuildError::DiskFull(format!("{context} {}", path.display()))
        } else {
            BuildError::Io { context, path: path.to_path_buf(), source }
        }
    }
}

/// How `mkfs.erofs` stores file data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Uncompressed (the default). Measured on the `python` image: mkfs
    /// 1.3 s vs 5.8 s for lz4hc, reading every file from a cold cache
    /// 0.30 s vs 0.60 s, at 282 MiB vs 168 MiB. Reads are plain page-cache
    /// fills with no decompression and no second cached copy, and only
    /// uncompressed layers can be mapped with DAX (virtio-pmem) into
    /// microVMs. Prefer lz4hc when layers travel over a slow network.
    #[default]
    None,
    Lz4,
    /// lz4hc at `level` (1..=12; mkfs's default when `None`).
    Lz4hc {
        level: Option<u8>,
    },
}

#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    pub compression: Compression,
}

/// A scratch directory under the store's temp space, removed (mounts
/// detached first, never crossing filesystems) when dropped.
pub(crate) struct BuildDir {
    path: PathBuf,
}

impl BuildDir {
    pub(crate) fn new(store: &ImageStore, what: &str) -> Result<BuildDir, BuildError> {
        Self::new_in(store.temp_dir(), what)
    }

    /// A build directory under `tmp` instead of the store's temp space.
    pub(crate) fn new_in(tmp: &Path, what: &str) -> Result<BuildDir, BuildError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("build-{what}-"))
            .tempdir_in(tmp)
            .map_err(io_err("creating build directory in", tmp))?;
        Ok(BuildDir { path: dir.keep() })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// `<build dir>/root`, created with mode 0755: the image's `/` takes its
    /// mode from here and a 0700 temp dir would lock non-root users out.
    pub(crate) fn make_root(&self) -> Result<PathBuf, BuildError> {
        use std::os::unix::fs::DirBuilderExt;
        let root = self.path.join("root");
        std::fs::DirBuilder::new().mode(0o755).create(&root).map_err(io_err("creating", &root))?;
        set_mode(&root, 0o755)?;
        Ok(root)
    }
}

impl Drop for BuildDir {
    fn drop(&mut self) {
        if let Err(e) = crate::fsutil::remove_tree(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove build directory");
        }
    }
}

/// chmod that ignores the umask (mkdir/create do not).
pub(crate) fn set_mode(path: &Path, mode: u32) -> Result<(), BuildError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err("setting permissions of", path))
}

/// Stores a one-layer image named `reference` for a freshly built layer.
/// Takes the store's write lock before the layer is committed by the
/// caller's closure, so a concurrent gc cannot collect the blob in between.
pub fn build_image(
    store: &ImageStore,
    reference: &Reference,
    kind: LayerKind,
    config: ImageConfig,
    build: impl FnOnce() -> Result<StoredLayer, BuildError>,
) -> Result<Arc<ResolvedImage>, BuildError> {
    build_image_from_recipe(store, reference, kind, config, None, build)
}

/// [`build_image`], recording in the manifest the version of the recipe a
/// default image was built from (`Manifest::default_recipe`).
pub(crate) fn build_image_from_recipe(
    store: &ImageStore,
    reference: &Reference,
    kind: LayerKind,
    config: ImageConfig,
    default_recipe: Option<u32>,
    build: impl FnOnce() -> Result<StoredLayer, BuildError>,
) -> Result<Arc<ResolvedImage>, BuildError> {
    let _lock = store.write_lock()?;
    let layer = build()?;
    let mut manifest = Manifest::new(vec![LayerDescriptor { digest: layer.digest, kind, size: layer.size }], config);
    manifest.default_recipe = default_recipe;
    store.put_image(reference, &manifest)?;
    Ok(store.resolve_ref(reference)?)
}
