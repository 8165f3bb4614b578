use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An image: an ordered list of read-only layers plus defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ImageInfo {
    /// `name:tag`.
    pub name: String,
    /// Layer digests (`sha256:...`), bottom first.
    pub layers: Vec<String>,
    pub size_bytes: u64,
    pub created_at: String,
    pub env: Vec<String>,
    pub workdir: String,
    pub user: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ImageList {
    pub images: Vec<ImageInfo>,
}
