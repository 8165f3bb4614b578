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
//!
//! Beside each copy, `NAME.dax.src` holds the path of the layer it was made
//! from. A copy whose layer is gone (its image removed and collected, or a
//! toolkit upgraded away) can never be asked for again, so the reaper
//! removes it (`reap`); a VM still running on it keeps its mapping, as the
//! kernel keeps an unlinked file's pages for whoever maps them.

use std::os::unix::ffi::OsStrExt;
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
    let name = layer.file_name().ok_or(EdgeError::Invariant("a layer's path ends in its file name"))?;
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
    std::fs::create_dir_all(dir).map_err(EdgeError::io("creating the directory of pmem copies", dir))?;
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    // The source record first: a copy is never there without one (a crash
    // in between leaves a record the reaper removes with its missing copy).
    let record = source_record(&out);
    let made = std::fs::write(&record, layer.as_os_str().as_bytes())
        .map_err(EdgeError::io("writing the source record of a pmem copy", &record))
        .and_then(|()| dsec_image::build::build_dax_image(mounted, &tmp, ALIGN).map_err(|e| EdgeError::PmemCopy(Box::new(e))))
        .and_then(|()| std::fs::rename(&tmp, &out).map_err(EdgeError::io("renaming the pmem copy", &tmp)));
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(out)
}

fn source_record(copy: &Path) -> PathBuf {
    let mut name = copy.as_os_str().to_owned();
    name.push(".src");
    PathBuf::from(name)
}

/// Removes from `dir` what no VM can be given again: copies whose layer is
/// gone (or whose record is), records without a copy, copies in the format
/// before `.dax` (never reused), and temporary files of copies no longer
/// being made. Returns how many files went. Blocking; call it with no copy
/// being made in this process (it takes the same lock).
pub fn reap(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let _one = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    let names: Vec<String> = entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    // A copy is stale without a record or when its layer is gone; its
    // record goes with it.
    let copy_stale = |copy: &str| match std::fs::read(dir.join(format!("{copy}.src"))) {
        Ok(src) => !Path::new(std::ffi::OsStr::from_bytes(&src)).exists(),
        Err(_) => true,
    };
    let stale = |name: &str| -> bool {
        if name.starts_with('.') && name.ends_with(".tmp") {
            return true; // nobody is making a copy: we hold the lock
        }
        if let Some(copy) = name.strip_suffix(".src") {
            return !names.iter().any(|n| n == copy) || copy_stale(copy);
        }
        if name.ends_with(".dax") {
            return copy_stale(name);
        }
        true // a copy of the old format
    };
    names.iter().filter(|n| stale(n)).filter(|n| std::fs::remove_file(dir.join(n)).is_ok()).count()
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

    #[test]
    fn copies_of_layers_that_are_gone_are_reaped_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::write(tree.join("f"), b"x").unwrap();
        let cache = dir.path().join("pmem");
        let (kept, gone) = (dir.path().join("kept.erofs"), dir.path().join("gone.erofs"));
        std::fs::write(&kept, b"layer").unwrap();
        std::fs::write(&gone, b"layer").unwrap();
        let kept_copy = dax_copy(&cache, &kept, &tree).unwrap();
        dax_copy(&cache, &gone, &tree).unwrap();
        std::fs::remove_file(&gone).unwrap();
        // Leftovers: the old format, a crashed copy's temp file, a record
        // whose copy never came.
        for junk in ["old.erofs", ".x.erofs.123.tmp", "lost.erofs.dax.src"] {
            std::fs::write(cache.join(junk), b"").unwrap();
        }
        assert_eq!(reap(&cache), 5, "the gone layer's copy and record, and the three leftovers");
        let mut left: Vec<String> =
            std::fs::read_dir(&cache).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["kept.erofs.dax", "kept.erofs.dax.src"]);
        assert_eq!(dax_copy(&cache, &kept, &tree).unwrap(), kept_copy, "the kept copy is still used");
        assert_eq!(reap(&cache), 0);
        assert_eq!(reap(&dir.path().join("no-such-dir")), 0);
    }
}
