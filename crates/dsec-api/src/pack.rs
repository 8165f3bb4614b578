//! `POST /v1/sandboxes/{id}/pack`: a sandbox's changes as a new image.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Request body of `pack`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PackRequest {
    /// `name[:tag]` of the image to write (replaced if it exists).
    pub name: String,
    /// Absolute path patterns (`*` within one component) left out of the
    /// layer, never removed from the sandbox. Default: shell histories,
    /// /tmp, /var/tmp, caches, logs, apt lists (docs/images.md lists them).
    #[serde(default)]
    pub scrub: Option<Vec<String>>,
}

/// Response of `pack`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PackResult {
    /// The image written: start new sandboxes from it.
    pub image: String,
    /// The new layer (`sha256:...`) and its size in bytes.
    pub layer: String,
    pub layer_size: u64,
    /// Layers of the new image (the sandbox's, earlier packs, the new one).
    pub layers: usize,
    /// True if only the changes since this sandbox's previous pack went in.
    pub incremental: bool,
    /// Files, links and directories copied; bytes of file content.
    pub entries: u64,
    pub bytes: u64,
    /// Deletions recorded as whiteouts.
    pub whiteouts: u64,
    /// Entries left out by the scrub list.
    pub scrubbed: u64,
    /// How long the sandbox was frozen for the copy, and the layer build.
    pub frozen_ms: f64,
    pub build_ms: f64,
    /// False if an earlier request with the same `Idempotency-Key` packed
    /// it (this is that pack's report; nothing was packed now).
    #[serde(default = "yes")]
    pub created: bool,
}

fn yes() -> bool {
    true
}
