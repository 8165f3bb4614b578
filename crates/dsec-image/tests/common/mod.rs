//! Shared fixtures: a temp store, layer mounts that are always cleaned up
//! (even when a test panics), small source trees and archives.
#![allow(dead_code)] // not every test file uses every helper

use std::fs;
use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use dsec_image::{ImageStore, LayerMounts};

/// A store and a layer-mount directory in one temp dir. Dropping it
/// unmounts every layer and the private bind, then deletes the files.
pub struct Env {
    pub mounts: LayerMounts,
    pub store: ImageStore,
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::Builder::new().prefix("dsec-image-test-").tempdir().unwrap();
        let store = ImageStore::open(dir.path().join("images")).unwrap();
        let mounts = LayerMounts::open(dir.path().join("layers")).unwrap();
        Env { mounts, store, dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Err(e) = self.mounts.unmount_everything() {
            eprintln!("cleanup: {e}");
        }
    }
}

/// A small root: a text file, a nested file owned by 1000, an executable,
/// a symlink and an empty directory.
pub fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::create_dir_all(root.join("home/user/project")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("etc/greeting"), "hello from a layer\n").unwrap();
    fs::write(root.join("home/user/project/main.py"), "print('hi')\n").unwrap();
    chown(root.join("home/user/project/main.py"), Some(1000), Some(1000)).unwrap();
    chown(root.join("home/user"), Some(1000), Some(1000)).unwrap();
    fs::write(root.join("run.sh"), "#!/bin/sh\necho run\n").unwrap();
    fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    symlink("etc/greeting", root.join("greeting-link")).unwrap();
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Counts mounts at exactly `path` in our mount table.
pub fn mount_count(path: &Path) -> usize {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap();
    text.lines().filter(|l| l.split(' ').nth(4) == Some(want)).count()
}

/// The options field of the mount at `path`.
pub fn mount_options(path: &Path) -> Option<String> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap();
    text.lines().find(|l| l.split(' ').nth(4) == Some(want)).map(|l| l.split(' ').nth(5).unwrap().to_string())
}

pub fn blob_files(store: &ImageStore) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(store.root().join("blobs/sha256")).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

pub fn temp_entries(store: &ImageStore) -> usize {
    fs::read_dir(store.root().join("tmp")).unwrap().count()
}

/// Every entry under `root` as one line each: `dir/`, `link -> target`,
/// `file=content` (trailing whitespace trimmed), for comparing whole trees.
pub fn tree_view(root: &Path) -> std::collections::BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut std::collections::BTreeSet<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.insert(format!("{rel}/"));
                walk(root, &e.path(), out);
            } else if ft.is_symlink() {
                out.insert(format!("{rel} -> {}", fs::read_link(e.path()).unwrap().display()));
            } else {
                out.insert(format!("{rel}={}", fs::read_to_string(e.path()).unwrap().trim_end()));
            }
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(root, root, &mut out);
    out
}
