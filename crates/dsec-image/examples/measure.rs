//! Measures what the design choices rest on: build time and size of the
//! `python` image uncompressed vs lz4hc, cold read time through each, and
//! the latency of `resolve` and of layer mounts.
//!
//! `cargo run --release -p dsec-image --example measure -- [--skip-python]`
//! Needs root (and the Debian mirror unless `--skip-python`). Works in a
//! temp dir that it removes.

use std::collections::HashSet;
use std::fs;
use std::io::Read;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dsec_image::build::{build_layer_busybox, build_layer_debootstrap, BusyboxRecipe, DebootstrapRecipe};
use dsec_image::{
    BuildOptions, Compression, ImageConfig, ImageStore, LayerDescriptor, LayerKind, LayerMounts, Manifest, NoProgress, ProgressEvent,
    ProgressFn, Reference, PYTHON_PACKAGES, PYTHON_SUITE,
};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() * 99 / 100]
}

/// Reads every regular file under `dir`; returns bytes read.
fn read_tree(dir: &Path) -> u64 {
    let mut total = 0;
    let mut buf = vec![0u8; 1 << 16];
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let ft = entry.file_type().unwrap();
        if ft.is_dir() {
            total += read_tree(&entry.path());
        } else if ft.is_file() {
            let mut f = fs::File::open(entry.path()).unwrap();
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
        }
    }
    total
}

fn drop_caches() {
    // Needs root; a failure only makes the
    // "cold" numbers warm, so report it.
    if let Err(e) = fs::write("/proc/sys/vm/drop_caches", "3") {
        eprintln!("could not drop caches: {e}");
    }
}

fn main() {
    let skip_python = std::env::args().any(|a| a == "--skip-python");
    let tmp = tempfile::Builder::new().prefix("dsec-measure-").tempdir().unwrap();
    let store = ImageStore::open(tmp.path().join("images")).unwrap();
    let mounts = LayerMounts::open(tmp.path().join("layers")).unwrap();

    if !skip_python {
        let mut recipe = DebootstrapRecipe::new(PYTHON_SUITE);
        recipe.include = PYTHON_PACKAGES.iter().map(|s| s.to_string()).collect();
        for compression in [Compression::None, Compression::Lz4hc { level: None }] {
            let mkfs_started = Mutex::new(None);
            let mkfs_done = Mutex::new(None);
            let progress = ProgressFn(|e: ProgressEvent<'_>| {
                if let ProgressEvent::Stage(s) = e {
                    if s.starts_with("mkfs.erofs") {
                        *mkfs_started.lock().unwrap() = Some(Instant::now());
                    } else if s.starts_with("verifying") {
                        *mkfs_done.lock().unwrap() = Some(Instant::now());
                    }
                }
            });
            let started = Instant::now();
            let options = BuildOptions { compression };
            let layer = build_layer_debootstrap(&store, &recipe, &options, &progress).unwrap();
            let total = started.elapsed();
            let mkfs = mkfs_done.lock().unwrap().unwrap() - mkfs_started.lock().unwrap().unwrap();
            let root = mounts.mount(&layer.digest, &layer.path).unwrap();
            drop_caches();
            let t = Instant::now();
            let bytes = read_tree(&root);
            let cold = t.elapsed();
            let t = Instant::now();
            read_tree(&root);
            let warm = t.elapsed();
            println!(
                "python {compression:?}: size {:.1} MiB, build {total:.1?} (mkfs.erofs {mkfs:.2?}), \
                 read all {:.0} MiB: cold {cold:.2?}, warm {warm:.2?}",
                layer.size as f64 / 1048576.0,
                bytes as f64 / 1048576.0
            );
        }
    }

    // Resolve: a store with 1000 images of 3 layers, like base+workspace+toolkit.
    let layer = build_layer_busybox(&store, &BusyboxRecipe::default(), &BuildOptions::default(), &NoProgress).unwrap();
    let manifest = Manifest::new(
        [LayerKind::Base, LayerKind::Workspace, LayerKind::Toolkit]
            .into_iter()
            .map(|kind| LayerDescriptor { digest: layer.digest, kind, size: layer.size })
            .collect(),
        ImageConfig::default(),
    );
    let refs: Vec<String> = (0..1000).map(|i| format!("bench/img-{i}:v1")).collect();
    for r in &refs {
        store.put_image(&r.parse::<Reference>().unwrap(), &manifest).unwrap();
    }
    let mut cold = Vec::new();
    let fresh = ImageStore::open(store.root()).unwrap();
    for r in &refs {
        let t = Instant::now();
        fresh.resolve(r).unwrap();
        cold.push(t.elapsed());
    }
    let mut warm = Vec::new();
    for _ in 0..20 {
        for r in &refs {
            let t = Instant::now();
            fresh.resolve(r).unwrap();
            warm.push(t.elapsed());
        }
    }
    println!(
        "resolve (3 layers): uncached p50 {:?} p99 {:?}; cached p50 {:?} p99 {:?}",
        median(cold.clone()),
        p99(cold),
        median(warm.clone()),
        p99(warm)
    );

    // Mount: first mount (syscall) and repeat mounts (in-memory set).
    let mut first = Vec::new();
    let mut repeat = Vec::new();
    let mut unmount = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        mounts.mount(&layer.digest, &layer.path).unwrap();
        first.push(t.elapsed());
        for _ in 0..10 {
            let t = Instant::now();
            mounts.mount(&layer.digest, &layer.path).unwrap();
            repeat.push(t.elapsed());
        }
        let t = Instant::now();
        mounts.unmount(&layer.digest).unwrap();
        unmount.push(t.elapsed());
    }
    println!(
        "layer mount: first p50 {:?} (incl. superblock check, mkdir), repeat p50 {:?}, unmount p50 {:?}",
        median(first),
        median(repeat),
        median(unmount)
    );

    mounts.unmount_all_except(&HashSet::new()).unwrap();
    mounts.unmount_everything().unwrap();
}
