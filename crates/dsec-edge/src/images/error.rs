//! What can go wrong with the node's image layers: opening the store and
//! the mounts, reading from a store many nodes share, resolving and
//! mounting an image, packing a sandbox's changes into a new one. Every
//! variant is the node's fault (HTTP 500, `internal`); what the caller got
//! wrong (an unknown image, a bad name) is an `EdgeError` of its own.

use std::path::PathBuf;

use dsec_image::{BuildError, ImageError, MountError};

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("image store: {0}")]
    Store(#[source] ImageError),
    #[error("layer mounts: {0}")]
    Mounts(#[source] MountError),
    #[error("shared image store: {0}")]
    SharedStore(#[source] ImageError),
    #[error("mounting the on-demand layer filesystem at {}: {source}", .path.display())]
    OnDemandMount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} image {reference:?}: {source}")]
    Resolve {
        what: String,
        reference: String,
        #[source]
        source: ImageError,
    },
    #[error("fetching image {reference:?} from the shared store: {source}")]
    Fetch {
        reference: String,
        #[source]
        source: ImageError,
    },
    #[error("mounting layers: {0}")]
    Mount(#[source] MountError),
    #[error("pack: {0}")]
    Pack(#[source] BuildError),
    #[error("pack: {0}")]
    PackStore(#[source] ImageError),
    /// A kept idempotent pack's report that cannot be written or read back.
    #[error("pack report: {0}")]
    PackReport(#[source] serde_json::Error),
}
