//! Layer from an existing directory (used as is: modes, owners, xattrs).

use std::path::Path;

use super::{mkfs::mkfs_into_store, BuildError, BuildOptions};
use crate::progress::Progress;
use crate::store::{ImageStore, StoredLayer};

pub fn build_layer_from_dir(
    store: &ImageStore,
    dir: &Path,
    options: &BuildOptions,
    progress: &dyn Progress,
) -> Result<StoredLayer, BuildError> {
    if !dir.is_dir() {
        return Err(BuildError::NotADirectory(dir.to_path_buf()));
    }
    mkfs_into_store(store, dir, options, progress)
}
