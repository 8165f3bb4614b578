//! Directory builds, the store (resolve, list, remove, gc, refusals) and
//! host layer mounts, against the real kernel and mkfs.erofs. Needs root.

mod common;

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Barrier};

use common::{blob_files, make_tree, mount_count, mount_options, temp_entries, Env};
use dsec_image::build::build_layer_from_dir;
use dsec_image::{
    BuildOptions, Compression, Digest, ImageConfig, ImageError, LayerDescriptor, LayerKind, LayerMounts, Manifest, MountError, NoProgress,
    Reference, StoredLayer,
};

fn dir_layer(env: &Env, name: &str, extra: &str) -> StoredLayer {
    let src = env.path().join(format!("src-{name}"));
    make_tree(&src);
    fs::write(src.join("etc/extra"), extra).unwrap();
    build_layer_from_dir(&env.store, &src, &BuildOptions::default(), &NoProgress).unwrap()
}

fn put_single(env: &Env, reference: &str, layer: &StoredLayer, kind: LayerKind) -> Reference {
    let reference: Reference = reference.parse().unwrap();
    let manifest = Manifest::new(vec![LayerDescriptor { digest: layer.digest, kind, size: layer.size }], ImageConfig::default());
    env.store.put_image(&reference, &manifest).unwrap();
    reference
}

#[test]
fn build_store_resolve_mount_read() {
    let env = Env::new();
    let layer = dir_layer(&env, "a", "a");
    assert!(layer.path.starts_with(env.store.root()));
    assert_eq!(fs::metadata(&layer.path).unwrap().len(), layer.size);
    assert_eq!(fs::metadata(&layer.path).unwrap().mode() & 0o777, 0o444);
    // The blob is named by its content.
    let (digest, _) = Digest::of_reader(fs::File::open(&layer.path).unwrap()).unwrap();
    assert_eq!(digest, layer.digest);
    assert_eq!(temp_entries(&env.store), 0, "no scratch files left behind");

    put_single(&env, "tests/small:v1", &layer, LayerKind::Base);
    let image = env.store.resolve("tests/small:v1").unwrap();
    assert_eq!(image.reference.to_string(), "tests/small:v1");
    assert_eq!(image.layers.len(), 1);
    assert_eq!(image.layers[0].path, layer.path);
    assert_eq!(image.layers[0].kind, LayerKind::Base);
    assert_eq!(image.manifest.size_bytes, layer.size);
    assert!(image.layers[0].path.is_absolute());
    // Cached: the same allocation comes back while the manifest is unchanged.
    assert!(Arc::ptr_eq(&image, &env.store.resolve("tests/small:v1").unwrap()));

    let paths = env.mounts.mount_image(&image).unwrap();
    assert_eq!(paths, vec![env.mounts.path_of(&layer.digest)]);
    let root = &paths[0];
    assert_eq!(fs::read_to_string(root.join("etc/greeting")).unwrap(), "hello from a layer\n");
    let main = fs::metadata(root.join("home/user/project/main.py")).unwrap();
    assert_eq!((main.uid(), main.gid()), (1000, 1000));
    assert_eq!(fs::metadata(root.join("run.sh")).unwrap().mode() & 0o777, 0o755);
    assert_eq!(fs::read_link(root.join("greeting-link")).unwrap().to_str(), Some("etc/greeting"));
    assert!(root.join("empty").is_dir());
    let opts = mount_options(root).unwrap();
    for flag in ["ro", "nosuid", "nodev"] {
        assert!(opts.split(',').any(|o| o == flag), "{opts}");
    }
    // Really read-only.
    assert!(fs::write(root.join("etc/new"), "x").is_err());

    assert_eq!(env.mounts.mounted().unwrap(), vec![layer.digest]);
    assert!(env.mounts.unmount(&layer.digest).unwrap());
    assert!(!root.exists(), "mountpoint removed");
    assert!(env.mounts.mounted().unwrap().is_empty());
    assert!(!env.mounts.unmount(&layer.digest).unwrap(), "second unmount is a no-op");
}

#[test]
fn concurrent_mounts_mount_once() {
    let env = Env::new();
    let layer = dir_layer(&env, "c", "c");
    let barrier = Barrier::new(16);
    let paths: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    env.mounts.mount(&layer.digest, &layer.path).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let target = env.mounts.path_of(&layer.digest);
    assert!(paths.iter().all(|p| *p == target));
    assert_eq!(mount_count(&target), 1);

    // A second instance (an edge restarted) adopts the mount from mountinfo.
    let again = LayerMounts::open(env.mounts.dir()).unwrap();
    assert_eq!(again.mounted().unwrap(), vec![layer.digest]);
    again.mount(&layer.digest, &layer.path).unwrap();
    assert_eq!(mount_count(&target), 1);
    assert!(fs::read_to_string(target.join("etc/extra")).unwrap() == "c");
}

#[test]
fn mount_adopts_a_layer_mounted_by_someone_else() {
    let env = Env::new();
    let layer = dir_layer(&env, "o", "o");
    // Opened before the mount exists, so its in-memory set does not know it.
    let other = LayerMounts::open(env.mounts.dir()).unwrap();
    env.mounts.mount(&layer.digest, &layer.path).unwrap();
    other.mount(&layer.digest, &layer.path).unwrap();
    assert_eq!(mount_count(&env.mounts.path_of(&layer.digest)), 1);
}

#[test]
fn unmount_all_except_keeps_what_is_asked() {
    let env = Env::new();
    let a = dir_layer(&env, "a", "1");
    let b = dir_layer(&env, "b", "2");
    assert_ne!(a.digest, b.digest);
    env.mounts.mount(&a.digest, &a.path).unwrap();
    env.mounts.mount(&b.digest, &b.path).unwrap();
    let removed = env.mounts.unmount_all_except(&HashSet::from([b.digest])).unwrap();
    assert_eq!(removed, vec![a.digest]);
    assert_eq!(env.mounts.mounted().unwrap(), vec![b.digest]);
    // Unmounting detaches lazily: a file opened through the mount stays readable.
    let mut open = fs::File::open(env.mounts.path_of(&b.digest).join("etc/extra")).unwrap();
    env.mounts.unmount(&b.digest).unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut open, &mut text).unwrap();
    assert_eq!(text, "2");
}

#[test]
fn corrupt_blobs_and_wrong_digests_are_refused() {
    let env = Env::new();
    let layer = dir_layer(&env, "x", "x");
    let good = fs::read(&layer.path).unwrap();
    let blobs_before = blob_files(&env.store);

    // Truncated copy.
    let truncated = env.path().join("truncated.erofs");
    fs::write(&truncated, &good[..good.len() - 4096]).unwrap();
    let err = env.store.put_layer_from_file(&truncated, None).unwrap_err();
    assert!(matches!(err, ImageError::CorruptBlob { .. }), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");

    // A flipped byte in the superblock.
    let flipped = env.path().join("flipped.erofs");
    let mut bad = good.clone();
    bad[1024 + 64] ^= 0xff; // volume name, covered by the checksum
    fs::write(&flipped, &bad).unwrap();
    let err = env.store.put_layer_from_file(&flipped, None).unwrap_err();
    assert!(matches!(err, ImageError::CorruptBlob { .. }), "{err}");

    // Not EROFS at all.
    let junk = env.path().join("junk");
    fs::write(&junk, vec![0u8; 8192]).unwrap();
    let err = env.store.put_layer_from_file(&junk, None).unwrap_err();
    assert!(err.to_string().contains("magic"), "{err}");

    // Good content, wrong expected digest.
    let copy = env.path().join("copy.erofs");
    fs::write(&copy, &good).unwrap();
    let wrong = Digest::of_bytes(b"not it");
    match env.store.put_layer_from_file(&copy, Some(&wrong)).unwrap_err() {
        ImageError::DigestMismatch { expected, actual } => {
            assert_eq!((expected, actual), (wrong, layer.digest));
        }
        other => panic!("{other}"),
    }
    // Right digest: accepted, deduplicated onto the existing blob.
    let again = env.store.put_layer_from_file(&copy, Some(&layer.digest)).unwrap();
    assert_eq!(again, layer);

    assert_eq!(blob_files(&env.store), blobs_before, "nothing half-written became visible");
    assert_eq!(temp_entries(&env.store), 0, "temp files cleaned on every error path");

    // The mount path checks too, and leaves no mountpoint behind.
    let fake = Digest::of_bytes(b"fake");
    match env.mounts.mount(&fake, &truncated).unwrap_err() {
        MountError::CorruptBlob { .. } => {}
        other => panic!("{other}"),
    }
    assert!(!env.mounts.path_of(&fake).exists());
}

#[test]
fn missing_blobs_are_reported() {
    let env = Env::new();
    let layer = dir_layer(&env, "m", "m");
    let reference = put_single(&env, "gone", &layer, LayerKind::Base);
    env.store.resolve_ref(&reference).unwrap();
    fs::remove_file(&layer.path).unwrap();
    match env.store.resolve("gone").unwrap_err() {
        ImageError::MissingBlob { reference, digest, .. } => {
            assert_eq!((reference.as_str(), digest), ("gone:latest", layer.digest));
        }
        other => panic!("{other}"),
    }
    // And a manifest naming a missing blob cannot be stored.
    let manifest = env.store.resolve("gone").err().map(|_| {
        Manifest::new(vec![LayerDescriptor { digest: layer.digest, kind: LayerKind::Base, size: layer.size }], ImageConfig::default())
    });
    let err = env.store.put_image(&"other".parse().unwrap(), &manifest.unwrap()).unwrap_err();
    assert!(matches!(err, ImageError::MissingBlob { .. }), "{err}");
}

#[test]
fn manifests_replace_list_remove_and_gc() {
    let env = Env::new();
    let a = dir_layer(&env, "a", "1");
    let b = dir_layer(&env, "b", "2");
    let c = dir_layer(&env, "c", "3");
    let r = put_single(&env, "app", &a, LayerKind::Base);
    let first = env.store.resolve("app").unwrap();

    // Replacing a manifest is seen by the next resolve (cache invalidated).
    let two_layers = Manifest::new(
        vec![
            LayerDescriptor { digest: a.digest, kind: LayerKind::Base, size: a.size },
            LayerDescriptor { digest: b.digest, kind: LayerKind::Toolkit, size: b.size },
        ],
        ImageConfig { workdir: "/work".into(), ..ImageConfig::default() },
    );
    env.store.put_image(&r, &two_layers).unwrap();
    let second = env.store.resolve("app:latest").unwrap();
    assert!(!Arc::ptr_eq(&first, &second));
    assert_eq!(second.manifest, two_layers);
    assert_eq!(second.manifest.size_bytes, a.size + b.size);
    assert_eq!(second.layers[1].kind, LayerKind::Toolkit);

    put_single(&env, "ws/task-1:v2", &c, LayerKind::Workspace);
    let listed: Vec<String> = env.store.list().unwrap().iter().map(|e| e.reference.to_string()).collect();
    assert_eq!(listed, ["app:latest", "ws/task-1:v2"]);

    // All referenced: gc removes nothing.
    assert_eq!(env.store.gc(&HashSet::new()).unwrap().blobs_removed, 0);
    // Drop the workspace image: its blob goes, unless kept (e.g. mounted).
    env.store.remove("ws/task-1:v2").unwrap();
    assert!(matches!(env.store.resolve("ws/task-1:v2"), Err(ImageError::ImageNotFound(_))));
    assert_eq!(env.store.gc(&HashSet::from([c.digest])).unwrap().blobs_removed, 0);
    let stats = env.store.gc(&HashSet::new()).unwrap();
    assert_eq!((stats.blobs_removed, stats.bytes_removed), (1, c.size));
    assert!(!c.path.exists() && a.path.exists() && b.path.exists());

    env.store.remove("app").unwrap();
    let stats = env.store.gc(&HashSet::new()).unwrap();
    assert_eq!((stats.blobs_removed, stats.bytes_removed), (2, a.size + b.size));
    assert!(blob_files(&env.store).is_empty());
    assert!(env.store.list().unwrap().is_empty());
}

#[test]
fn compressed_layers_mount_and_read() {
    let env = Env::new();
    let src = env.path().join("src");
    make_tree(&src);
    fs::write(src.join("big.txt"), "compressible line\n".repeat(50_000)).unwrap();
    let plain = build_layer_from_dir(&env.store, &src, &BuildOptions::default(), &NoProgress).unwrap();
    let options = BuildOptions { compression: Compression::Lz4hc { level: Some(9) } };
    let packed = build_layer_from_dir(&env.store, &src, &options, &NoProgress).unwrap();
    assert!(packed.size < plain.size, "{} >= {}", packed.size, plain.size);
    let root = env.mounts.mount(&packed.digest, &packed.path).unwrap();
    assert_eq!(fs::read(root.join("big.txt")).unwrap(), fs::read(src.join("big.txt")).unwrap());
}

#[test]
fn building_from_a_missing_dir_is_a_typed_error() {
    let env = Env::new();
    let err = build_layer_from_dir(&env.store, &env.path().join("nope"), &BuildOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(err, dsec_image::BuildError::NotADirectory(_)), "{err}");
}
