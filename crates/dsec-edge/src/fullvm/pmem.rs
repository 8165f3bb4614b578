//! Layer files as virtio-pmem regions the guest reads through DAX.
//!
//! A layer as stored is not fit for that as it is:
//! - Linux reads an EROFS file through DAX only if its data is flat-plain,
//!   and `mkfs.erofs` stores each file's tail inline with its inode by
//!   default: a guest mounting the stored layer with `dax=always` still
//!   copies almost every file into its own page cache (measured: +320 MiB
//!   of guest cache for a 291 MiB layer, i.e. no sharing at all);
//! - the guest maps a pmem region only if its size is a multiple of 2 MiB
//!   (`nd_pmem ... misaligned, unable to map` otherwise), and QEMU maps a
//!   read-only file no larger than the file itself.
//!
//! So the node keeps one DAX copy of each layer: rewritten from the layer's
//! host mount with inline data off, padded with a hole to 2 MiB (made once,
//! ~8 s for a 291 MiB layer). Every VM maps that one file, so the host's
//! page cache holds the layer once for all of them.

use std::path::{Path, PathBuf};

use crate::error::EdgeError;

pub const ALIGN: u64 = 2 << 20;

/// One copy at a time: VMs created together with the same layer wait for
/// the first to make it rather than each copying it.
static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The DAX copy of `layer` (mounted on the host at `mounted`) in `dir`,
/// named like the layer (which is content-addressed), made if absent
/// (temp + rename).
pub fn dax_copy(dir: &Path, layer: &Path, mounted: &Path) -> Result<PathBuf, EdgeError> {
    let err = |what: &str, e: String| EdgeError::Internal(format!("{what} the pmem copy of {}: {e}", layer.display()));
    let name = layer.file_name().ok_or_else(|| EdgeError::Internal(format!("layer path {} has no name", layer.display())))?;
    // `.dax`: copies made before inline data was turned off are not reused.
    let out = dir.join(format!("{}.dax", name.to_string_lossy()));
    let ready = || std::fs::metadata(&out).is_ok_and(|m| m.len() > 0 && m.len() % ALIGN == 0);
    if ready() {
        return Ok(out);
    }
    let _one = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    if ready() {
        return Ok(out);
    }
    std::fs::create_dir_all(dir).map_err(|e| err("creating the directory of", e.to_string()))?;
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let made = dsec_image::build::build_dax_image(mounted, &tmp, ALIGN)
        .map_err(|e| e.to_string())
        .and_then(|()| std::fs::rename(&tmp, &out).map_err(|e| e.to_string()));
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(err("making", e));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_is_rewritten_once_and_padded_to_2_mib() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::write(tree.join("f"), vec![7u8; 3 << 20]).unwrap();
        let layer = dir.path().join("abc.erofs");
        let cache = dir.path().join("pmem");
        let p = dax_copy(&cache, &layer, &tree).unwrap();
        assert_eq!(p, cache.join("abc.erofs.dax"));
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len >= 3 << 20 && len % ALIGN == 0, "{len}");
        std::fs::remove_file(tree.join("f")).unwrap();
        assert_eq!(dax_copy(&cache, &layer, &tree).unwrap(), p, "made once");
        assert_eq!(std::fs::metadata(&p).unwrap().len(), len);
        let e = dax_copy(&cache, &dir.path().join("other.erofs"), &dir.path().join("missing")).unwrap_err().to_string();
        assert!(e.contains("pmem copy"), "{e}");
        assert!(!std::fs::read_dir(&cache).unwrap().flatten().any(|e| e.file_name().to_string_lossy().ends_with(".tmp")));
    }
}
