//! `pack_diff`: a running sandbox's changes become a new image (its layers
//! plus one workspace layer holding the changes), incrementally when the
//! sandbox was packed before, while the sandbox keeps running.
//!
//! The agent keeps an O_PATH descriptor of the sandbox's overlay upper at a
//! well-known fd (no path leads to it after pivot_root); the edge takes a
//! copy with pidfd_getfd, freezes the sandbox for the copy of its changes
//! (a consistent view; the freeze lasts as long as the copy, not the
//! mkfs), thaws, and builds the layer (`dsec_image::pack`).

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use dsec_image::pack::{PackScratch, ScrubPattern};
use dsec_image::{BuildOptions, LayerDescriptor, LayerKind, Manifest, NoProgress, Provenance, Reference};

use crate::edge::Edge;
use crate::error::EdgeError;
use crate::images::error::LayerError;
use crate::images::layers::ImageLayers;
use crate::images::{PackInput, PackOutput, PackState};
use crate::model::{Caller, State};

/// Longest freeze a pack waits for.
const FREEZE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the caller asks for.
#[derive(Debug, Clone)]
pub struct PackRequest {
    /// `name[:tag]` of the new image.
    pub name: String,
    /// Patterns left out of the layer (None: the default residue list).
    pub scrub: Option<Vec<String>>,
}

/// What a pack reports, as kept for an idempotent retry (the journal holds
/// it as JSON next to the sandbox's id).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PackSummary {
    pub image: String,
    pub layer: String,
    pub layer_size: u64,
    pub layers: usize,
    pub incremental: bool,
    pub entries: u64,
    pub bytes: u64,
    pub whiteouts: u64,
    pub scrubbed: u64,
    pub copy_ms: f64,
    pub build_ms: f64,
    /// False: an earlier request with the same idempotency key packed it,
    /// and this is its report.
    #[serde(skip, default)]
    pub created: bool,
}

impl From<&PackOutput> for PackSummary {
    fn from(o: &PackOutput) -> Self {
        PackSummary {
            image: o.image.clone(),
            layer: o.layer.clone(),
            layer_size: o.layer_size,
            layers: o.layers,
            incremental: o.incremental,
            entries: o.stats.entries,
            bytes: o.stats.bytes,
            whiteouts: o.stats.whiteouts,
            scrubbed: o.stats.scrubbed,
            copy_ms: o.copy_ms,
            build_ms: o.build_ms,
            created: true,
        }
    }
}

impl Edge {
    /// `pack_diff`, once per idempotency key: a retry with `key` gets the
    /// first request's report (`created: false`) without packing again; the
    /// same key with another sandbox, name or scrub list is an error.
    pub async fn pack_diff_keyed(&self, caller: &Caller, id: &str, req: PackRequest, key: Option<&str>) -> Result<PackSummary, EdgeError> {
        let (edge, caller, id) = (self.clone(), caller.clone(), id.to_string());
        let key = key.map(str::to_string);
        // Finish (and settle the key) even if the caller goes away.
        tokio::spawn(async move {
            let Some(key) = key else { return edge.pack_diff(&caller, &id, req).await.map(|o| PackSummary::from(&o)) };
            let fingerprint = format!("{id}\n{}\n{:?}", req.name, req.scrub);
            let work = async {
                let out = PackSummary::from(&edge.pack_diff(&caller, &id, req).await?);
                let json = serde_json::to_string(&out).map_err(LayerError::PackReport)?;
                Ok((out, format!("{id}\n{json}")))
            };
            let replay = |target: &str| {
                let json = target.split_once('\n').map_or("", |(_, j)| j);
                serde_json::from_str::<PackSummary>(json).map_err(|e| LayerError::PackReport(e).into())
            };
            edge.once(&caller.tenant, crate::lifecycle::idempotency::SCOPE_PACK, &key, &fingerprint, work, replay).await
        })
        .await
        .map_err(EdgeError::task("pack"))?
    }

    /// Packs the sandbox's changes into the image `req.name`.
    pub async fn pack_diff(&self, caller: &Caller, id: &str, req: PackRequest) -> Result<PackOutput, EdgeError> {
        let (entry, inst) = self.running(caller, id).await?;
        let _activity = entry.begin();
        let _op = entry.op_lock.lock().await;
        if entry.state() != State::Running {
            return Err(EdgeError::NotRunning { id: id.to_string(), state: entry.state().as_str() });
        }
        let upper = self.inner.backends.get(entry.record().spec.backend)?.writable_layer(id, &inst)?;
        let record = entry.record();
        let previous = crate::edge::lock(&entry.pack).clone();
        let scrub = req.scrub.unwrap_or_else(|| dsec_image::pack::DEFAULT_SCRUB.iter().map(|s| s.to_string()).collect());
        let cgroups = self.inner.cgroups.clone();
        let rootfs = self.inner.rootfs.clone();
        let scratch = self.scratch_dir();
        let id_owned = id.to_string();
        let out = tokio::task::spawn_blocking(move || {
            let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", upper.as_raw_fd()));
            cgroups.freeze(&id_owned, FREEZE_TIMEOUT)?;
            let mut thawed = false;
            let mut thaw = || {
                if !thawed {
                    thawed = true;
                    if let Err(e) = cgroups.thaw(&id_owned) {
                        tracing::warn!(sandbox = %id_owned, error = %e, "thaw after pack copy failed");
                    }
                }
            };
            let input = PackInput {
                upper: &path,
                name: &req.name,
                image: &record.spec.image,
                workspace: record.spec.workspace.as_deref(),
                toolkits: &record.spec.toolkits,
                previous: previous.as_ref(),
                scrub: &scrub,
                built_by: &record.tenant,
                sandbox: &id_owned,
                scratch: scratch.as_deref(),
            };
            let result = rootfs.pack(input, &mut thaw);
            thaw();
            drop(upper);
            result
        })
        .await
        .map_err(EdgeError::task("pack"))?;
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                // Never leave the sandbox frozen, whatever failed.
                let _ = self.inner.cgroups.thaw(id);
                return Err(e);
            }
        };
        *crate::edge::lock(&entry.pack) = Some(out.state.clone());
        Ok(out)
    }
}

/// The image-store side of a pack (`ImageLayers::pack`).
pub(crate) fn pack_into_store(layers: &ImageLayers, input: PackInput<'_>, copied: &mut dyn FnMut()) -> Result<PackOutput, EdgeError> {
    let store = layers.store();
    let reference: Reference = input.name.parse().map_err(|e| EdgeError::Invalid(format!("image name {:?}: {e}", input.name)))?;
    let scrub = input.scrub.iter().map(|p| ScrubPattern::parse(p).map_err(EdgeError::Invalid)).collect::<Result<Vec<_>, _>>()?;
    let base = layers.resolve_image("base", input.image)?;
    // The layers under the new one: the previous pack's image, or the
    // sandbox's own stack for a first pack.
    let under: Vec<LayerDescriptor> = match input.previous {
        Some(p) => p.layers.clone(),
        None => {
            let mut stack = base.manifest.layers.clone();
            if let Some(ws) = input.workspace {
                stack.extend(layers.resolve_image("workspace", ws)?.manifest.layers.clone());
            }
            for tk in input.toolkits {
                stack.extend(layers.resolve_image("toolkit", tk)?.manifest.layers.clone());
            }
            stack
        }
    };
    let t0 = Instant::now();
    let collected = PackScratch::collect(store, input.scratch, input.upper, input.previous.map(|p| &p.index), &scrub);
    copied();
    let scratch = collected.map_err(LayerError::Pack)?;
    let copy_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (stats, index) = (scratch.stats, scratch.index.clone());

    let t1 = Instant::now();
    // Held from the layer's commit to the manifest's: a gc in between would
    // collect the fresh blob.
    let _lock = store.write_lock().map_err(LayerError::PackStore)?;
    let layer = scratch.build(store, &BuildOptions::default(), &NoProgress).map_err(LayerError::Pack)?;
    let mut stack = under;
    stack.push(LayerDescriptor { digest: layer.digest, kind: LayerKind::Workspace, size: layer.size });
    let mut manifest = Manifest::new(stack.clone(), base.manifest.config.clone());
    manifest.provenance = Some(Provenance {
        built_by: input.built_by.to_string(),
        sandbox: input.sandbox.to_string(),
        base_image: input.image.to_string(),
        previous: input.previous.map(|p| p.image.clone()),
        scrubbed: input.scrub.to_vec(),
    });
    store.put_image(&reference, &manifest).map_err(LayerError::PackStore)?;
    let build_ms = t1.elapsed().as_secs_f64() * 1e3;
    Ok(PackOutput {
        image: reference.to_string(),
        layer: format!("sha256:{}", layer.digest.hex()),
        layer_size: layer.size,
        layers: stack.len(),
        stats,
        incremental: input.previous.is_some(),
        state: PackState { image: reference.to_string(), layers: stack, index },
        copy_ms,
        build_ms,
    })
}
