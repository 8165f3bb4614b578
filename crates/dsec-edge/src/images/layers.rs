//! The edge's `RootfsProvider` over the node's image store: resolves images
//! and mounts their EROFS layers once per node (lower dirs shared by every
//! sandbox's overlay, and page cache shared with them).
//!
//! With a shared store, an image the node lacks is either loaded on demand
//! (`LayerFetch::Lazy`, the default: manifest and chunk tables now, file
//! data chunk by chunk when read, through `dsec_image::lazy`'s FUSE files
//! under the EROFS mounts) or copied whole first (`LayerFetch::Eager`).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use dsec_image::lazy::{remove_leftover_partials, resolve_lazily, LazyLayers};
use dsec_image::shared::{S3Options, SharedStore};
use dsec_image::{Digest, ImageError, ImageStore, LayerMounts, NoProgress, Reference, ResolvedImage};

use crate::error::EdgeError;
use crate::images::error::LayerError;
use crate::images::lost_layers::LostLayers;
use crate::images::{PackInput, PackOutput, RootfsPlan, RootfsProvider};

/// Where, under the layers dir, the on-demand FUSE files are served.
const ON_DEMAND_DIR: &str = ".on-demand";
/// Written under the layers dir by a shutdown that detached layer mounts
/// of on-demand files (sandboxes left running may still use them, and
/// lose them when this process exits); read and removed at the next
/// startup. One line per lost thing: `mount <path>` or `files <path>`.
const LOST_RECORD: &str = ".on-demand-lost";

pub struct ImageLayers {
    store: ImageStore,
    mounts: LayerMounts,
    shared: Option<Shared>,
    /// What an earlier edge process served on demand, gone with it.
    lost: LostLayers,
}

/// How layers of an image the node lacks are brought in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerFetch {
    /// The sandbox starts at once; file data is fetched when first read.
    Lazy,
    /// Whole layers are copied and verified before the sandbox starts.
    Eager,
}

impl std::str::FromStr for LayerFetch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lazy" => Ok(LayerFetch::Lazy),
            "eager" => Ok(LayerFetch::Eager),
            other => Err(format!("unknown layer fetch mode {other:?} (lazy or eager)")),
        }
    }
}

/// On-demand state: the FUSE files and the images resolved through them.
struct OnDemand {
    layers: LazyLayers,
    /// A second handle on the node's store (blobs completed on demand are
    /// promoted into it from FUSE threads).
    local: Arc<ImageStore>,
    images: Mutex<HashMap<Reference, Arc<ResolvedImage>>>,
}

/// The store many nodes share, and this node's store as its cache.
struct Shared {
    store: Arc<SharedStore>,
    on_demand: Option<OnDemand>,
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
        let store = ImageStore::open(images_dir).map_err(LayerError::Store)?;
        let mounts = LayerMounts::open(layers_dir).map_err(LayerError::Mounts)?;
        let lost = forget_dead_on_demand(&store, &mounts);
        Ok(Self { store, mounts, shared: None, lost })
    }

    /// Reads images this node lacks from a store many nodes share (`location`:
    /// a directory, or `s3://bucket/prefix` reached with `s3`), on demand
    /// (`fetch`: lazy) or whole (eager), keeping this node's layers under
    /// `cache_limit_mb`. On demand, blob files are served by a FUSE mount
    /// at `<layers dir>/.on-demand`.
    pub fn with_shared_store(
        mut self,
        location: &str,
        s3: &S3Options,
        cache_limit_mb: Option<u64>,
        fetch: LayerFetch,
    ) -> Result<Self, EdgeError> {
        let store = SharedStore::open(location, s3).map_err(LayerError::SharedStore)?;
        let on_demand = match fetch {
            LayerFetch::Eager => None,
            LayerFetch::Lazy => {
                let mountpoint = self.mounts.dir().join(ON_DEMAND_DIR);
                let layers = LazyLayers::mount(&mountpoint).map_err(|source| LayerError::OnDemandMount { path: mountpoint, source })?;
                let local = ImageStore::open(self.store.root()).map_err(LayerError::Store)?;
                Some(OnDemand { layers, local: Arc::new(local), images: Mutex::new(HashMap::new()) })
            }
        };
        self.shared = Some(Shared {
            store: Arc::new(store),
            on_demand,
            cache_limit_bytes: cache_limit_mb.map(|m| m << 20),
            recent: Mutex::new(Vec::new()),
            fetching: Mutex::new(()),
        });
        Ok(self)
    }

    /// Per-layer counters of on-demand loading (digest, bytes fetched, blob
    /// size, complete), for logs and benchmarks.
    pub fn on_demand_stats(&self) -> Vec<(Digest, dsec_image::lazy::BlobStats)> {
        match self.shared.as_ref().and_then(|s| s.on_demand.as_ref()) {
            Some(od) => od.layers.stats(),
            None => Vec::new(),
        }
    }

    pub fn store(&self) -> &ImageStore {
        &self.store
    }

    pub(crate) fn resolve_image(&self, what: &str, reference: &str) -> Result<Arc<ResolvedImage>, EdgeError> {
        let first = self.store.resolve(reference);
        let result = match (first, &self.shared) {
            (Err(ImageError::ImageNotFound(_) | ImageError::MissingBlob { .. }), Some(shared)) => match &shared.on_demand {
                Some(od) => self.resolve_on_demand(shared, od, reference),
                None => {
                    self.fetch(shared, reference)?;
                    self.store.resolve(reference)
                }
            },
            (r, _) => r,
        };
        result.map_err(|e| match e {
            ImageError::ImageNotFound(_) => EdgeError::ImageNotFound(format!("{what} image {reference:?} not found")),
            ImageError::InvalidReference(r) => EdgeError::Invalid(format!("{what} image {reference:?}: {r}")),
            source => LayerError::Resolve { what: what.into(), reference: reference.into(), source }.into(),
        })
    }

    /// An image of the shared store whose layers are served on demand:
    /// resolved once (manifest, chunk tables checked), then remembered.
    fn resolve_on_demand(&self, shared: &Shared, od: &OnDemand, reference: &str) -> Result<Arc<ResolvedImage>, ImageError> {
        let parsed: Reference = reference.parse()?;
        let known = |od: &OnDemand| od.images.lock().unwrap_or_else(|p| p.into_inner()).get(&parsed).cloned();
        if let Some(img) = known(od) {
            return Ok(img);
        }
        let _one = shared.fetching.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(img) = known(od) {
            return Ok(img); // resolved while we waited
        }
        let (image, stats) = resolve_lazily(&shared.store, &od.local, &od.layers, &parsed)?;
        tracing::info!(
            image = reference,
            on_demand = stats.on_demand,
            local = stats.local,
            copied = stats.copied,
            "image resolved from the shared store; layer data is fetched when read"
        );
        let image = Arc::new(image);
        od.images.lock().unwrap_or_else(|p| p.into_inner()).insert(parsed, Arc::clone(&image));
        self.evict_over_limit(shared, image.layers.iter().map(|l| l.digest));
        Ok(image)
    }

    /// Copies `reference` from the shared store (whole layers, each checked
    /// against its digest), then evicts least recently used layers beyond
    /// the cache bound.
    fn fetch(&self, shared: &Shared, reference: &str) -> Result<(), EdgeError> {
        let _one = shared.fetching.lock().unwrap_or_else(|p| p.into_inner());
        let parsed: dsec_image::Reference = reference.parse().map_err(|e| EdgeError::Invalid(format!("image {reference:?}: {e}")))?;
        if self.store.resolve_ref(&parsed).is_ok() {
            return Ok(()); // fetched while we waited
        }
        let stats = match dsec_image::shared::fetch_image(&shared.store, &self.store, &parsed, &NoProgress) {
            Ok(s) => s,
            Err(ImageError::ImageNotFound(_)) => return Ok(()), // the caller reports it
            Err(source) => return Err(LayerError::Fetch { reference: reference.into(), source }.into()),
        };
        tracing::info!(image = reference, layers = stats.layers_copied, bytes = stats.bytes_copied, "fetched from the shared store");
        if let Ok(img) = self.store.resolve_ref(&parsed) {
            self.evict_over_limit(shared, img.layers.iter().map(|l| l.digest));
        }
        Ok(())
    }

    /// Evicts least recently used layers beyond the cache bound, sparing
    /// mounted layers and `keep`.
    fn evict_over_limit(&self, shared: &Shared, keep: impl Iterator<Item = Digest>) {
        if let Some(limit) = shared.cache_limit_bytes {
            let mut keep: HashSet<Digest> = keep.collect();
            keep.extend(self.mounts.mounted().unwrap_or_default());
            keep.extend(self.on_demand_layers());
            let order = shared.recent.lock().unwrap_or_else(|p| p.into_inner()).clone();
            match dsec_image::shared::evict(&self.store, &shared.store, limit, &order, &keep) {
                Ok(0) => {}
                Ok(freed) => tracing::info!(freed_bytes = freed, "evicted least recently used layers"),
                Err(e) => tracing::warn!(error = %e, "layer cache eviction failed"),
            }
        }
    }

    /// Layers of images resolved on demand (kept mounted like local ones).
    fn on_demand_layers(&self) -> Vec<Digest> {
        match self.shared.as_ref().and_then(|s| s.on_demand.as_ref()) {
            Some(od) => {
                od.images.lock().unwrap_or_else(|p| p.into_inner()).values().flat_map(|i| i.layers.iter().map(|l| l.digest)).collect()
            }
            None => Vec::new(),
        }
    }

    /// Marks layers as just used (for the cache's LRU order).
    fn touch(&self, layers: &[Digest]) {
        let Some(shared) = &self.shared else { return };
        let mut recent = shared.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.retain(|d| !layers.contains(d));
        recent.extend_from_slice(layers);
    }
}

/// Clears what an earlier edge process (killed, or stopped while its
/// sandboxes ran on) left of its on-demand layers, before this one serves
/// any: layer mounts reading from its FUSE files, the dead FUSE mount, and
/// the cache files of blobs it had not completed. Returns what was lost,
/// for recovery to fail the sandboxes that used it. Problems are logged:
/// they must not keep the node from starting.
fn forget_dead_on_demand(store: &ImageStore, mounts: &LayerMounts) -> LostLayers {
    let dir = mounts.dir().join(ON_DEMAND_DIR);
    // What a clean shutdown detached (gone from the mount table since).
    let record = mounts.dir().join(LOST_RECORD);
    let mut lost = match std::fs::read_to_string(&record) {
        Ok(text) => parse_lost_record(&text),
        Err(_) => LostLayers::default(),
    };
    let _ = std::fs::remove_file(&record);
    // What a killed process left mounted.
    match mounts.unmount_backed_by(&dir) {
        Ok(dead) => lost.mounts.extend(dead.iter().map(|d| mounts.path_of(d))),
        Err(e) => tracing::warn!(error = %e, "could not detach the layer mounts of the previous on-demand files"),
    }
    match LazyLayers::detach_left_over(&dir) {
        Ok(true) => lost.files = Some(dir),
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "could not detach the previous on-demand layer filesystem"),
    }
    match remove_leftover_partials(store) {
        Ok(0) => {}
        Ok(n) => tracing::info!(files = n, "removed the previous process's incomplete on-demand cache files"),
        Err(e) => tracing::warn!(error = %e, "could not remove the previous process's on-demand cache files"),
    }
    if !lost.is_empty() {
        tracing::info!(
            layer_mounts = lost.mounts.len(),
            "the previous edge process's on-demand layers are gone; sandboxes still using them are failed"
        );
    }
    lost
}

fn parse_lost_record(text: &str) -> LostLayers {
    let mut lost = LostLayers::default();
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("mount", path)) => lost.mounts.push(path.into()),
            Some(("files", path)) => lost.files = Some(path.into()),
            _ => {}
        }
    }
    lost
}

/// Detaches the layer mounts of on-demand files (before the FUSE server
/// goes) and records them, with the files' directory, for the next
/// startup: a sandbox left running on them cannot read them once this
/// process is gone.
fn record_lost_on_demand(mounts: &LayerMounts) {
    let dir = mounts.dir().join(ON_DEMAND_DIR);
    let detached = match mounts.unmount_backed_by(&dir) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "could not detach the layer mounts of on-demand files");
            return;
        }
    };
    let mut text: String = detached.iter().map(|d| format!("mount {}\n", mounts.path_of(d).display())).collect();
    text.push_str(&format!("files {}\n", dir.display()));
    if let Err(e) = std::fs::write(mounts.dir().join(LOST_RECORD), text) {
        tracing::warn!(error = %e, "could not record the on-demand layers this shutdown takes away");
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
            let mounted = self.mounts.mount_image(img).map_err(LayerError::Mount)?;
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
        let env = cfg.env.iter().filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))).collect();
        Ok(RootfsPlan {
            lower_dirs: dirs,
            layers,
            layer_files: files,
            env,
            workdir: cfg.workdir.clone(),
            user: cfg.user.clone(),
            volumes: Vec::new(),
        })
    }

    fn reap(&self) -> usize {
        let keep: HashSet<_> = match self.store.list() {
            Ok(images) => images.iter().flat_map(|i| i.manifest.layers.iter().map(|l| l.digest)).chain(self.on_demand_layers()).collect(),
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
        // Layer mounts first: an EROFS mount of an on-demand blob holds its
        // FUSE file, and the FUSE server ends only once none does.
        if self.shared.as_ref().is_some_and(|s| s.on_demand.is_some()) {
            record_lost_on_demand(&self.mounts);
        }
        if let Err(e) = self.mounts.unmount_all_except(&HashSet::new()) {
            tracing::warn!(error = %e, "could not unmount the layer mounts");
        }
        if let Some(od) = self.shared.as_ref().and_then(|s| s.on_demand.as_ref()) {
            for (digest, s) in od.layers.stats() {
                tracing::info!(layer = %digest, fetched_bytes = s.fetched_bytes, size = s.size, complete = s.promoted, "on-demand layer released");
            }
            od.images.lock().unwrap_or_else(|p| p.into_inner()).clear();
            if let Err(e) = od.layers.unmount() {
                tracing::warn!(error = %e, "could not unmount the on-demand layer filesystem");
            }
        }
        if let Err(e) = self.mounts.unmount_everything() {
            tracing::warn!(error = %e, "could not unmount the layer mounts");
        }
    }

    fn pack(&self, input: PackInput<'_>, copied: &mut dyn FnMut()) -> Result<PackOutput, EdgeError> {
        crate::images::pack::pack_into_store(self, input, copied)
    }

    fn lost_layers(&self) -> LostLayers {
        self.lost.clone()
    }
}
