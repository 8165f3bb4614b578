//! The shared store: push/fetch between stores, digest checks of fetched
//! blobs, LRU eviction of a node's cache. Plain files, no root needed.

mod common;

use std::collections::HashSet;
use std::fs;

use common::{make_tree, temp_entries};
use dsec_image::build::{build_image, build_layer_from_dir};
use dsec_image::shared::{evict, fetch_image, push_image, SharedStore};
use dsec_image::{BuildOptions, ImageConfig, ImageError, ImageStore, LayerKind, NoProgress, Reference};

fn store(dir: &std::path::Path, name: &str) -> ImageStore {
    ImageStore::open(dir.join(name)).unwrap()
}

#[test]
fn push_fetch_verify_and_evict() {
    let dir = tempfile::tempdir().unwrap();
    let (node_a, node_b) = (store(dir.path(), "a"), store(dir.path(), "b"));
    let shared = SharedStore::Dir(store(dir.path(), "shared"));
    let SharedStore::Dir(shared_dir) = &shared else { unreachable!() };
    let src = dir.path().join("src");
    make_tree(&src);
    let r1: Reference = "task:1".parse().unwrap();
    let img = build_image(&node_a, &r1, LayerKind::Base, ImageConfig::default(), || {
        build_layer_from_dir(&node_a, &src, &BuildOptions::default(), &NoProgress)
    })
    .unwrap();
    let digest = img.layers[0].digest;

    // Push, then push again: the layer is not copied twice.
    let s = push_image(&node_a, &shared, &r1, &NoProgress).unwrap();
    assert_eq!((s.layers_copied, s.layers_present), (1, 0));
    let s = push_image(&node_a, &shared, &r1, &NoProgress).unwrap();
    assert_eq!((s.layers_copied, s.layers_present), (0, 1));
    // The pushed manifest names each layer's chunk table, which is there.
    let pushed = shared_dir.resolve_ref(&r1).unwrap();
    assert_eq!(pushed.manifest.chunk_tables.len(), 1);
    assert!(shared_dir.chunk_table_path(&digest).is_file());

    // A second tag of the same content shares the layer on the node.
    let r2: Reference = "task:2".parse().unwrap();
    shared_dir.put_image(&r2, &shared_dir.resolve_ref(&r1).unwrap().manifest).unwrap();
    fetch_image(&shared, &node_b, &r1, &NoProgress).unwrap();
    let s = fetch_image(&shared, &node_b, &r2, &NoProgress).unwrap();
    assert_eq!(s.layers_present, 1);
    assert_eq!(node_b.resolve_ref(&r2).unwrap().layers[0].digest, digest);

    // Eviction: over the bound, an unused layer the shared store holds goes;
    // the manifest stays and resolving it says the blob is missing.
    let freed = evict(&node_b, &shared, 0, &[], &HashSet::new()).unwrap();
    assert!(freed > 0);
    assert!(matches!(node_b.resolve_ref(&r1), Err(ImageError::MissingBlob { .. })));
    // ...and a layer in use is spared.
    fetch_image(&shared, &node_b, &r1, &NoProgress).unwrap();
    let keep: HashSet<_> = [digest].into();
    assert_eq!(evict(&node_b, &shared, 0, &[], &keep).unwrap(), 0);

    // A corrupt blob on the shared store is refused; nothing half-written.
    let node_c = store(dir.path(), "c");
    let blob = shared_dir.blob_path(&digest);
    let mut bytes = fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&blob, &bytes).unwrap();
    let err = fetch_image(&shared, &node_c, &r1, &NoProgress).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert!(node_c.list().unwrap().is_empty());
    assert!(!node_c.has_blob(&digest));
    assert_eq!(temp_entries(&node_c), 0);
}

#[test]
fn gc_removes_chunk_tables_with_their_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let node = store(dir.path(), "a");
    let shared = SharedStore::Dir(store(dir.path(), "shared"));
    let SharedStore::Dir(shared_dir) = &shared else { unreachable!() };
    let src = dir.path().join("src");
    make_tree(&src);
    let r: Reference = "t:1".parse().unwrap();
    let img = build_image(&node, &r, LayerKind::Base, ImageConfig::default(), || {
        build_layer_from_dir(&node, &src, &BuildOptions::default(), &NoProgress)
    })
    .unwrap();
    push_image(&node, &shared, &r, &NoProgress).unwrap();
    let table = shared_dir.chunk_table_path(&img.layers[0].digest);
    assert!(table.is_file());
    shared_dir.remove("t:1").unwrap();
    let stats = shared_dir.gc(&HashSet::new()).unwrap();
    assert_eq!(stats.blobs_removed, 1);
    assert!(!table.exists());
}
