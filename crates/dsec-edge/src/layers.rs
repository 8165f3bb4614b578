//! The edge's `RootfsProvider` over the node's image store: resolves images
//! and mounts their EROFS layers once per node (lower dirs shared by every
//! sandbox's overlay, and page cache shared with them).

use std::collections::HashSet;
use std::path::Path;

use dsec_image::{ImageError, ImageStore, LayerMounts, ResolvedImage};

use crate::error::EdgeError;
use crate::images::{RootfsPlan, RootfsProvider};

pub struct ImageLayers {
    store: ImageStore,
    mounts: LayerMounts,
}

impl ImageLayers {
    /// `images_dir` holds the store; `layers_dir` the layer mount points.
    pub fn open(images_dir: &Path, layers_dir: &Path) -> Result<Self, EdgeError> {
        let store = ImageStore::open(images_dir).map_err(|e| EdgeError::Internal(format!("image store: {e}")))?;
        let mounts = LayerMounts::open(layers_dir).map_err(|e| EdgeError::Internal(format!("layer mounts: {e}")))?;
        Ok(Self { store, mounts })
    }

    pub fn store(&self) -> &ImageStore {
        &self.store
    }

    fn resolve(&self, what: &str, reference: &str) -> Result<std::sync::Arc<ResolvedImage>, EdgeError> {
        self.store.resolve(reference).map_err(|e| match e {
            ImageError::ImageNotFound(_) => EdgeError::ImageNotFound(format!("{what} image {reference:?} not found")),
            ImageError::InvalidReference(r) => EdgeError::Invalid(format!("{what} image {reference:?}: {r}")),
            other => EdgeError::Internal(format!("{what} image {reference:?}: {other}")),
        })
    }
}

impl RootfsProvider for ImageLayers {
    fn plan(&self, image: &str, workspace: Option<&str>, toolkits: &[String]) -> Result<RootfsPlan, EdgeError> {
        let base = self.resolve("base", image)?;
        let mut stack = vec![base.clone()];
        if let Some(ws) = workspace {
            stack.push(self.resolve("workspace", ws)?);
        }
        for tk in toolkits {
            stack.push(self.resolve("toolkit", tk)?);
        }
        let mut dirs = Vec::new();
        let mut layers = Vec::new();
        let mut files = Vec::new();
        for img in &stack {
            let mounted = self.mounts.mount_image(img).map_err(|e| EdgeError::Internal(e.to_string()))?;
            dirs.extend(mounted);
            layers.extend(img.layers.iter().map(|l| l.digest.to_string()));
            files.extend(img.layers.iter().map(|l| l.path.clone()));
        }
        // overlayfs wants the topmost layer first.
        dirs.reverse();
        files.reverse();
        let cfg = &base.manifest.config;
        let env = cfg
            .env
            .iter()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect();
        Ok(RootfsPlan { lower_dirs: dirs, layers, layer_files: files, env, workdir: cfg.workdir.clone(), user: cfg.user.clone() })
    }

    fn reap(&self) -> usize {
        let keep: HashSet<_> = match self.store.list() {
            Ok(images) => images.iter().flat_map(|i| i.manifest.layers.iter().map(|l| l.digest)).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "reaper cannot list images; leaving layer mounts alone");
                return 0;
            }
        };
        match self.mounts.unmount_all_except(&keep) {
            Ok(gone) => gone.len(),
            Err(e) => {
                tracing::warn!(error = %e, "reaper could not unmount unused layers");
                0
            }
        }
    }

    fn release(&self) {
        if let Err(e) = self.mounts.unmount_everything() {
            tracing::warn!(error = %e, "could not unmount the layer mounts");
        }
    }
}
