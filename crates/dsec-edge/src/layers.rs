//! The edge's `RootfsProvider` over the node's image store: resolves images
//! and mounts their EROFS layers once per node (lower dirs shared by every
//! sandbox's overlay, and page cache shared with them).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Mutex;

use dsec_image::{Digest, ImageError, ImageStore, LayerMounts, NoProgress, ResolvedImage};

use crate::error::EdgeError;
use crate::images::{PackInput, PackOutput, RootfsPlan, RootfsProvider};

pub struct ImageLayers {
    store: ImageStore,
    mounts: LayerMounts,
    shared: Option<SharedStore>,
}

/// The store many nodes share, and this node's store as its cache.
struct SharedStore {
    store: ImageStore,
    /// Bound on this node's layer blobs (None: unbounded).
    cache_limit_bytes: Option<u64>,
    /// Layers by last use, least recent first.
    recent: Mutex<Vec<Digest>>,
    /// One fetch at a time: concurrent creations of a missing image wait
    /// for the first one's fetch instead of copying it N times.
    fetching: Mutex<()>,
}

impl ImageLayers {
    /// `images_dir` holds the store; `layers_dir` the layer mount points.
    pub fn open(images_dir: &Path, layers_dir: &Path) -> Result<Self, EdgeError> {
        let store = ImageStore::open(images_dir).map_err(|e| EdgeError::Internal(format!("image store: {e}")))?;
        let mounts = LayerMounts::open(layers_dir).map_err(|e| EdgeError::Internal(format!("layer mounts: {e}")))?;
        Ok(Self { store, mounts, shared: None })
    }

    /// Fetches images this node lacks from the store in `dir` (a directory
    /// many nodes share), keeping this node's layers under `cache_limit_mb`.
    pub fn with_shared_store(mut self, dir: &Path, cache_limit_mb: Option<u64>) -> Result<Self, EdgeError> {
        let store = ImageStore::open(dir).map_err(|e| EdgeError::Internal(format!("shared image store: {e}")))?;
        self.shared = Some(SharedStore {
            store,
            cache_limit_bytes: cache_limit_mb.map(|m| m << 20),
            recent: Mutex::new(Vec::new()),
            fetching: Mutex::new(()),
        });
        Ok(self)
    }

    pub fn store(&self) -> &ImageStore {
        &self.store
    }

    pub(crate) fn resolve_image(&self, what: &str, reference: &str) -> Result<std::sync::Arc<ResolvedImage>, EdgeError> {
        let first = self.store.resolve(reference);
        let result = match (first, &self.shared) {
            (Err(ImageError::ImageNotFound(_) | ImageError::MissingBlob { .. }), Some(shared)) => {
                self.fetch(shared, reference)?;
                self.store.resolve(reference)
            }
            (r, _) => r,
        };
        result.map_err(|e| match e {
            ImageError::ImageNotFound(_) => EdgeError::ImageNotFound(format!("{what} image {reference:?} not found")),
            ImageError::InvalidReference(r) => EdgeError::Invalid(format!("{what} image {reference:?}: {r}")),
            other => EdgeError::Internal(format!("{what} image {reference:?}: {other}")),
        })
    }

    /// Copies `reference` from the shared store (whole layers, each checked
    /// against its digest), then evicts least recently used layers beyond
    /// the cache bound.
    fn fetch(&self, shared: &SharedStore, reference: &str) -> Result<(), EdgeError> {
        let _one = shared.fetching.lock().unwrap_or_else(|p| p.into_inner());
        let parsed: dsec_image::Reference =
            reference.parse().map_err(|e| EdgeError::Invalid(format!("image {reference:?}: {e}")))?;
        if self.store.resolve_ref(&parsed).is_ok() {
            return Ok(()); // fetched while we waited
        }
        let stats = match dsec_image::shared::copy_image(&shared.store, &self.store, &parsed, &NoProgress) {
            Ok(s) => s,
            Err(ImageError::ImageNotFound(_)) => return Ok(()), // the caller reports it
            Err(e) => return Err(EdgeError::Internal(format!("fetching image {reference:?} from the shared store: {e}"))),
        };
        tracing::info!(image = reference, layers = stats.layers_copied, bytes = stats.bytes_copied, "fetched from the shared store");
        if let Some(limit) = shared.cache_limit_bytes {
            let mut keep: HashSet<Digest> = self.mounts.mounted().unwrap_or_default().into_iter().collect();
            if let Ok(img) = self.store.resolve_ref(&parsed) {
                keep.extend(img.layers.iter().map(|l| l.digest));
            }
            let order = shared.recent.lock().unwrap_or_else(|p| p.into_inner()).clone();
            match dsec_image::shared::evict(&self.store, &shared.store, limit, &order, &keep) {
                Ok(0) => {}
                Ok(freed) => tracing::info!(freed_bytes = freed, "evicted least recently used layers"),
                Err(e) => tracing::warn!(error = %e, "layer cache eviction failed"),
            }
        }
        Ok(())
    }

    /// Marks layers as just used (for the cache's LRU order).
    fn touch(&self, layers: &[Digest]) {
        let Some(shared) = &self.shared else { return };
        let mut recent = shared.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.retain(|d| !layers.contains(d));
        recent.extend_from_slice(layers);
    }
}

impl RootfsProvider for ImageLayers {
    fn plan(&self, image: &str, workspace: Option<&str>, toolkits: &[String]) -> Result<RootfsPlan, EdgeError> {
        let base = self.resolve_image("base", image)?;
        let mut stack = vec![base.clone()];
        if let Some(ws) = workspace {
            stack.push(self.resolve_image("workspace", ws)?);
        }
        for tk in toolkits {
            stack.push(self.resolve_image("toolkit", tk)?);
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
        let used: Vec<Digest> = stack.iter().flat_map(|img| img.layers.iter().map(|l| l.digest)).collect();
        self.touch(&used);
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

    fn pack(&self, input: PackInput<'_>, copied: &mut dyn FnMut()) -> Result<PackOutput, EdgeError> {
        crate::pack::pack_into_store(self, input, copied)
    }
}
