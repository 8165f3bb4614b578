//! On-demand layers against the real kernel: a blob pushed to a shared
//! directory store, served by the FUSE filesystem, EROFS-mounted straight
//! on the FUSE file; chunks fetched on first read and checked against the
//! chunk table; a corrupt chunk or a lost store is EIO, never bad data.
//! Needs root.

mod common;

use std::fs;
use std::io::Write;
use std::sync::Arc;

use common::{make_tree, Env};
use dsec_image::build::{build_image, build_layer_from_dir};
use dsec_image::lazy::{resolve_lazily, LazyLayers};
use dsec_image::shared::{push_image, SharedStore};
use dsec_image::{BuildOptions, Digest, ImageConfig, ImageStore, LayerKind, NoProgress, Reference};

const BIG: usize = 8 << 20;

/// A store "a" with image `name` (a small tree plus `big.bin`, 8 MiB of
/// pseudo-random bytes) pushed to the shared directory store.
fn pushed(env: &Env, name: &str, seed: u64) -> (Arc<SharedStore>, Reference, Vec<u8>) {
    let node_a = ImageStore::open(env.path().join("a")).unwrap();
    let shared = Arc::new(SharedStore::Dir(ImageStore::open(env.path().join("shared")).unwrap()));
    let src = env.path().join(format!("src-{name}"));
    make_tree(&src);
    let mut x = seed;
    let big: Vec<u8> = (0..BIG)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    fs::File::create(src.join("big.bin")).unwrap().write_all(&big).unwrap();
    let r: Reference = name.parse().unwrap();
    build_image(&node_a, &r, LayerKind::Base, ImageConfig::default(), || {
        build_layer_from_dir(&node_a, &src, &BuildOptions::default(), &NoProgress)
    })
    .unwrap();
    push_image(&node_a, &shared, &r, &NoProgress).unwrap();
    (shared, r, big)
}

/// Unmounts the layers before the FUSE filesystem they read from.
struct Node {
    lazy: LazyLayers,
    env: Env,
    store: Arc<ImageStore>,
}

impl Node {
    fn new() -> Node {
        let env = Env::new();
        let store = Arc::new(ImageStore::open(env.path().join("b")).unwrap());
        let lazy = LazyLayers::mount(&env.path().join("fuse")).unwrap();
        Node { lazy, env, store }
    }

    fn tmp_files(&self) -> usize {
        fs::read_dir(self.store.root().join("tmp")).unwrap().count()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.env.mounts.unmount_everything().unwrap();
        self.lazy.unmount().unwrap();
    }
}

#[test]
fn reads_fetch_only_what_they_touch_then_the_blob_is_promoted() {
    let node = Node::new();
    let (shared, r, big) = pushed(&node.env, "lazy:1", 7);
    let (image, stats) = resolve_lazily(&shared, &node.store, &node.lazy, &r).unwrap();
    assert_eq!((stats.on_demand, stats.local, stats.copied), (1, 0, 0));
    let layer = &image.layers[0];
    assert!(layer.path.starts_with(node.lazy.mountpoint()));
    let root = node.env.mounts.mount(&layer.digest, &layer.path).unwrap();

    // Small files: a few chunks of an 8+ MiB blob.
    assert_eq!(fs::read_to_string(root.join("etc/greeting")).unwrap(), "hello from a layer\n");
    let blob = node.lazy.get(&layer.digest).unwrap();
    let s = blob.stats();
    assert!(s.fetched_bytes > 0 && s.fetched_bytes * 4 < s.size, "{s:?}");
    assert!(!node.store.has_blob(&layer.digest));
    assert_eq!(node.tmp_files(), 1, "one sparse cache file");

    // Reading everything completes the blob: checked whole, then it is an
    // ordinary blob of the node's store, and nothing is left in tmp/.
    assert_eq!(fs::read(root.join("big.bin")).unwrap(), big);
    let mut all = Vec::new();
    fs::File::open(&layer.path).and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut all)).unwrap();
    assert_eq!(Digest::of_bytes(&all), layer.digest);
    let s = blob.stats();
    assert!(s.promoted, "{s:?}");
    assert!(s.fetched_bytes <= s.size, "each chunk fetched once: {s:?}");
    assert!(node.store.has_blob(&layer.digest));
    assert_eq!(node.tmp_files(), 0);
}

#[test]
fn a_corrupt_chunk_or_a_lost_store_is_eio_and_nothing_is_kept() {
    let node = Node::new();
    let (shared, r, _) = pushed(&node.env, "lazy:2", 11);
    let SharedStore::Dir(shared_dir) = &*shared else { unreachable!() };
    let (image, _) = resolve_lazily(&shared, &node.store, &node.lazy, &r).unwrap();
    let layer = &image.layers[0];
    let root = node.env.mounts.mount(&layer.digest, &layer.path).unwrap();
    // Flip one byte in the middle of the blob in the shared store: the
    // chunk holding it fails its check; the reader gets EIO.
    let blob_path = shared_dir.blob_path(&layer.digest);
    let file = fs::OpenOptions::new().write(true).open(&blob_path).unwrap();
    let middle = layer.size / 2;
    let mut byte = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(&fs::File::open(&blob_path).unwrap(), &mut byte, middle).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[byte[0] ^ 0xff], middle).unwrap();
    let err = fs::read(root.join("big.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let blob = node.lazy.get(&layer.digest).unwrap();
    let s = blob.stats();
    assert!(s.chunks_present < s.chunks_total && !s.promoted, "{s:?}");
    assert!(!node.store.has_blob(&layer.digest));

    // A store that is gone: EIO at once, not a hang.
    fs::remove_file(&blob_path).unwrap();
    let started = std::time::Instant::now();
    let err = fs::read(root.join("big.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(started.elapsed().as_secs() < 5);

    // Releasing the blob deletes its incomplete cache file.
    drop(blob);
    node.env.mounts.unmount(&layer.digest).unwrap();
    assert!(node.lazy.remove(&layer.digest));
    assert_eq!(node.tmp_files(), 0);
}
