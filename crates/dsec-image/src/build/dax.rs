//! An EROFS image a guest can read through DAX (virtio-pmem).
//!
//! Linux gives an EROFS file DAX only if its data layout is flat-plain
//! (`erofs_fill_inode` sets `S_DAX` for `EROFS_INODE_FLAT_PLAIN` alone).
//! `mkfs.erofs` packs each file's last partial block inline with its inode
//! by default (flat-inline), and such files are read through the guest's
//! page cache even on a `dax=always` mount: a layer built the default way
//! gives a guest almost nothing by DAX. This writes a copy of a mounted
//! layer with inline data off (and uncompressed, which DAX needs too),
//! padded with a hole to a multiple of `align` bytes.

use std::path::Path;
use std::process::Command;

use super::tool::{self, MKFS_EROFS};
use super::{io_err, BuildError};

/// Writes the tree at `src` (a mounted layer: its owners, modes, xattrs and
/// mtimes are kept) to `out` as an EROFS image whose regular files are all
/// flat-plain, its length rounded up to a multiple of `align`.
pub fn build_dax_image(src: &Path, out: &Path, align: u64) -> Result<(), BuildError> {
    let mut cmd = Command::new(MKFS_EROFS.name);
    cmd.arg("--quiet").arg("-Enoinline_data").arg("--preserve-mtime").arg(out).arg(src);
    tool::run(&MKFS_EROFS, cmd, None)?;
    let file = std::fs::OpenOptions::new().write(true).open(out).map_err(io_err("opening", out))?;
    let len = file.metadata().map_err(io_err("sizing", out))?.len();
    file.set_len(len.next_multiple_of(align.max(1))).map_err(io_err("padding", out))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dump.erofs --path` names the data layout of one file (0: flat-plain).
    fn layout(image: &Path, path: &str) -> String {
        let out = Command::new("dump.erofs").arg(format!("--path={path}")).arg(image).output().expect("dump.erofs (erofs-utils)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split("Layout:").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or_default().to_string()
    }

    #[test]
    fn every_file_is_flat_plain_and_the_image_is_aligned() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("d")).unwrap();
        // 5000 bytes: one full block and a tail mkfs.erofs would inline.
        std::fs::write(tree.join("d/f"), vec![b'x'; 5000]).unwrap();
        let default = dir.path().join("default.erofs");
        let st = Command::new("mkfs.erofs").arg("--quiet").arg(&default).arg(&tree).status().unwrap();
        assert!(st.success());
        assert_eq!(layout(&default, "/d/f"), "2", "mkfs.erofs inlines the tail by default");
        let dax = dir.path().join("dax.erofs");
        build_dax_image(&tree, &dax, 2 << 20).unwrap();
        assert_eq!(layout(&dax, "/d/f"), "0");
        assert_eq!(std::fs::metadata(&dax).unwrap().len() % (2 << 20), 0);
    }
}
