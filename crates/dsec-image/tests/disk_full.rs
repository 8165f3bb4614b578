//! A store on a full filesystem: a clear error, and nothing half-written
//! left behind. Needs root (mounts a small tmpfs).

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use dsec_image::build::build_layer_from_dir;
use dsec_image::{BuildOptions, ImageError, ImageStore, NoProgress};
use rustix::mount::{mount, unmount, MountFlags, UnmountFlags};

/// A 1 MiB tmpfs, unmounted on drop (also when the test panics).
struct SmallFs(PathBuf);

impl SmallFs {
    fn new(at: &Path) -> SmallFs {
        fs::create_dir_all(at).unwrap();
        mount("tmpfs", at, "tmpfs", MountFlags::empty(), c"size=1m").unwrap();
        SmallFs(at.to_path_buf())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = unmount(&self.0, UnmountFlags::DETACH);
    }
}

/// Every file under `dir`, recursively, but the store's lock file.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else if p.file_name().is_none_or(|n| n != "gc.lock") {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_full_store_refuses_layers_cleanly() {
    let env = common::Env::new();
    let small = SmallFs::new(&env.path().join("small"));
    let store = ImageStore::open(small.0.join("images")).unwrap();

    // A layer bigger than the filesystem, streamed as a pull would.
    let big = vec![0x5au8; 3 << 20];
    let err = store.put_layer_from_reader(&big[..], None).expect_err("a 3 MiB layer on a 1 MiB store");
    assert!(matches!(err, ImageError::DiskFull { .. }), "{err:?}");
    assert!(err.to_string().contains("disk full"), "{err}");
    assert_eq!(files_under(&small.0.join("images")), Vec::<PathBuf>::new(), "nothing half-written stays");

    // A build that cannot fit fails too, and leaves nothing either.
    let src = env.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let noise: Vec<u8> = (0..(3u32 << 20)).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    fs::write(src.join("data.bin"), noise).unwrap();
    let built = build_layer_from_dir(&store, &src, &BuildOptions::default(), &NoProgress);
    assert!(built.is_err(), "a 3 MiB layer built into a 1 MiB store");
    assert_eq!(files_under(&small.0.join("images")), Vec::<PathBuf>::new(), "nothing half-built stays");

    // Once there is room again (a small layer fits), the store works.
    let tiny = env.path().join("tiny");
    fs::create_dir_all(&tiny).unwrap();
    fs::write(tiny.join("hello"), "hi\n").unwrap();
    let layer = build_layer_from_dir(&store, &tiny, &BuildOptions::default(), &NoProgress).expect("a small layer fits");
    assert!(layer.path.is_file());
}
