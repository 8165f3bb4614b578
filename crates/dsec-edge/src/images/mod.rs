//! How the edge turns image names into mounted read-only layers.

pub mod error;
pub mod layers;
pub mod lost_layers;
pub(crate) mod pack;
pub(crate) mod vm_snapshot;

use std::path::{Path, PathBuf};

use crate::error::EdgeError;

/// The read-only part of a sandbox's root filesystem, ready to mount.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RootfsPlan {
    /// Mounted layer directories, topmost first (overlayfs lowerdir order).
    pub lower_dirs: Vec<PathBuf>,
    /// Layer digests, bottom first.
    pub layers: Vec<String>,
    /// The layers' EROFS image files, topmost first (a VM gets them as
    /// read-only disks).
    pub layer_files: Vec<PathBuf>,
    pub env: Vec<(String, String)>,
    pub workdir: String,
    pub user: String,
    /// Named volumes bound into the root, resolved for the sandbox's owner
    /// by the edge (not by the image store).
    pub volumes: Vec<crate::disk::volumes::VolumeBind>,
}

/// The edge's view of the node's image store.
pub trait RootfsProvider: Send + Sync + 'static {
    /// Resolves a base image plus optional workspace and toolkit layers
    /// (toolkits last = topmost) and makes sure every layer is mounted.
    fn plan(&self, image: &str, workspace: Option<&str>, toolkits: &[String]) -> Result<RootfsPlan, EdgeError>;

    /// Unmounts layers that no image references any more (sandboxes still
    /// using one keep it alive: the unmount is lazy). Returns how many.
    fn reap(&self) -> usize;

    /// Unmounts every layer (lazily: running sandboxes keep theirs) when
    /// the edge shuts down, so a stopped platform leaves no host mounts.
    fn release(&self);

    /// On-demand layers an earlier edge process served and that died with
    /// it (found at startup); recovery fails the sandboxes that used them.
    fn lost_layers(&self) -> crate::images::lost_layers::LostLayers {
        crate::images::lost_layers::LostLayers::default()
    }

    /// Packs a sandbox's writable layer into a new image (`pack_diff`):
    /// copies its changes, calls `copied` (the sandbox may run again from
    /// then on), builds the layer and writes the image's manifest.
    fn pack(&self, input: PackInput<'_>, copied: &mut dyn FnMut()) -> Result<PackOutput, EdgeError> {
        let _ = (input, copied);
        Err(EdgeError::Invalid("this node's image store cannot pack sandboxes".into()))
    }
}

/// What `RootfsProvider::pack` works from.
pub struct PackInput<'a> {
    /// The sandbox's overlay upper directory.
    pub upper: &'a Path,
    /// `name[:tag]` of the image to write.
    pub name: &'a str,
    /// The sandbox's image, workspace and toolkits (the first pack's stack).
    pub image: &'a str,
    pub workspace: Option<&'a str>,
    pub toolkits: &'a [String],
    /// The sandbox's previous pack, for an incremental one.
    pub previous: Option<&'a PackState>,
    pub scrub: &'a [String],
    /// Where the changes are gathered before the layer is built: the
    /// node's writable-layer filesystem when it has one (`None`: the image
    /// store's temp space).
    pub scratch: Option<&'a Path>,
    pub built_by: &'a str,
    pub sandbox: &'a str,
}

/// What a sandbox's last pack left for the next one.
#[derive(Debug, Clone)]
pub struct PackState {
    /// The image it wrote.
    pub image: String,
    /// That image's layers, bottom first.
    pub layers: Vec<dsec_image::LayerDescriptor>,
    /// What the upper held then.
    pub index: dsec_image::pack::PackIndex,
}

/// What one pack did.
#[derive(Debug, Clone)]
pub struct PackOutput {
    pub image: String,
    /// The new layer (`sha256:...`) and its size.
    pub layer: String,
    pub layer_size: u64,
    /// Layers of the new image.
    pub layers: usize,
    pub stats: dsec_image::pack::DiffStats,
    pub incremental: bool,
    pub state: PackState,
    /// Time spent copying (the sandbox is frozen meanwhile) and building.
    pub copy_ms: f64,
    pub build_ms: f64,
}
