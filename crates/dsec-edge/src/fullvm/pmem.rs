//! Layer files as virtio-pmem regions.
//!
//! The guest maps a pmem region only if its size is a multiple of 2 MiB
//! (`nd_pmem ... misaligned, unable to map` otherwise), and QEMU maps a
//! read-only file no larger than the file itself. A layer blob is a whole
//! number of 4 KiB blocks, so the node keeps one copy of each layer padded
//! with a hole to the next 2 MiB (made once, by `copy_file_range`, which
//! shares extents where the filesystem can): every VM maps that one file,
//! so the host's page cache holds the layer once for all of them.

use std::path::{Path, PathBuf};

use crate::error::EdgeError;

pub const ALIGN: u64 = 2 << 20;

/// One copy at a time: VMs created together with the same layer wait for
/// the first to make it rather than each copying it.
static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The 2 MiB-aligned copy of `layer` in `dir` (named like the layer, which
/// is content-addressed), made if absent (temp + rename).
pub fn aligned(dir: &Path, layer: &Path) -> Result<PathBuf, EdgeError> {
    let err = |what: &str, e: std::io::Error| EdgeError::Internal(format!("{what} the pmem copy of {}: {e}", layer.display()));
    let len = std::fs::metadata(layer).map_err(|e| err("sizing", e))?.len();
    if len % ALIGN == 0 {
        return Ok(layer.to_path_buf());
    }
    let name = layer.file_name().ok_or_else(|| EdgeError::Internal(format!("layer path {} has no name", layer.display())))?;
    let out = dir.join(name);
    let ready = || std::fs::metadata(&out).is_ok_and(|m| m.len() == len.next_multiple_of(ALIGN));
    if ready() {
        return Ok(out);
    }
    let _one = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    if ready() {
        return Ok(out);
    }
    std::fs::create_dir_all(dir).map_err(|e| err("creating the directory of", e))?;
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let made = (|| -> std::io::Result<()> {
        let _ = std::fs::remove_file(&tmp);
        crate::microvm::disk::sparse_copy(layer, &tmp)?;
        std::fs::OpenOptions::new().write(true).open(&tmp)?.set_len(len.next_multiple_of(ALIGN))?;
        std::fs::rename(&tmp, &out)
    })();
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
    fn layers_are_padded_to_2_mib_once_and_aligned_ones_used_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let layer = dir.path().join("abc.erofs");
        std::fs::write(&layer, vec![7u8; 3 << 20]).unwrap();
        let cache = dir.path().join("pmem");
        let p = aligned(&cache, &layer).unwrap();
        assert_eq!(p, cache.join("abc.erofs"));
        let data = std::fs::read(&p).unwrap();
        assert_eq!(data.len() as u64, 4 << 20);
        assert!(data[..3 << 20].iter().all(|&b| b == 7) && data[3 << 20..].iter().all(|&b| b == 0));
        assert_eq!(aligned(&cache, &layer).unwrap(), p, "made once");
        let even = dir.path().join("even.erofs");
        std::fs::write(&even, vec![1u8; 2 << 20]).unwrap();
        assert_eq!(aligned(&cache, &even).unwrap(), even);
        assert!(aligned(&cache, &dir.path().join("missing")).is_err());
    }
}
