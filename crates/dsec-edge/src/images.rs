//! How the edge turns image names into mounted read-only layers.

use std::path::PathBuf;

use crate::error::EdgeError;

/// The read-only part of a sandbox's root filesystem, ready to mount.
#[derive(Debug, Clone, PartialEq)]
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
}
