use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileType {
    File,
    Dir,
    Symlink,
    Other,
}

/// `GET /v1/sandboxes/{id}/files/stat`, and each entry of a listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FileInfo {
    pub name: String,
    pub path: String,
    #[serde(rename = "type")]
    pub file_type: FileType,
    pub size: u64,
    /// Permission bits, e.g. 420 (0o644).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since the epoch.
    pub mtime: i64,
    pub link_target: Option<String>,
}

/// `GET /v1/sandboxes/{id}/files/list`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DirListing {
    pub path: String,
    pub entries: Vec<FileInfo>,
}

/// `POST /v1/sandboxes/{id}/files/mkdir`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    pub path: String,
    #[serde(default = "default_true")]
    pub parents: bool,
    /// Permission bits; default 0o755.
    #[serde(default)]
    pub mode: Option<u32>,
}

fn default_true() -> bool {
    true
}

/// Answer to a file or archive upload.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WriteResult {
    pub path: String,
    pub bytes: u64,
}
