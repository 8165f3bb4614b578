//! The template of a microVM's writable disk: an empty ext4 image of the
//! sandbox's `disk_limit_mb`, under which each VM's disk is a qcow2 overlay.
//!
//! ext4 because the guest kernel has it built in and a filesystem of its
//! own is how the disk limit is enforced (ENOSPC in the guest). Templates
//! are made once per size with `mkfs.ext4` (lazy inode tables, so almost
//! nothing of the file is written) and copied extent by extent: a copy is
//! a few small writes, not `disk_limit_mb` of zeros.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::EdgeError;

/// The template for `size_mb`, made if absent (atomically: temp + rename).
pub fn template(dir: &Path, size_mb: u64) -> Result<PathBuf, EdgeError> {
    let path = dir.join(format!("ext4-{size_mb}M.img"));
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).map_err(EdgeError::io("creating", dir))?;
    let tmp = dir.join(format!(".ext4-{size_mb}M.{}.tmp", std::process::id()));
    let made = (|| -> Result<(), EdgeError> {
        let f = File::create(&tmp).map_err(EdgeError::io("creating the disk template", &tmp))?;
        f.set_len(size_mb << 20).map_err(EdgeError::io("sizing the disk template", &tmp))?;
        drop(f);
        let out = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"])
            .arg(&tmp)
            .output()
            .map_err(EdgeError::sys("running mkfs.ext4 (Debian package e2fsprogs)"))?;
        if !out.status.success() {
            return Err(EdgeError::Command { program: "mkfs.ext4", detail: String::from_utf8_lossy(&out.stderr).trim().to_string() });
        }
        std::fs::rename(&tmp, &path).map_err(EdgeError::io("renaming the disk template", &tmp))
    })();
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn templates_are_ext4_of_the_asked_size_and_cached() {
        let dir = tempfile::tempdir().unwrap();
        let t = template(dir.path(), 64).unwrap();
        let meta = std::fs::metadata(&t).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        assert!(meta.blocks() * 512 < 16 << 20, "template not sparse");
        let magic = std::fs::read(&t).unwrap()[1024 + 0x38..1024 + 0x3a].to_vec();
        assert_eq!(magic, [0x53, 0xef], "no ext4 superblock");
        assert_eq!(template(dir.path(), 64).unwrap(), t);
    }
}
