//! Import of OCI image layouts and `docker save` archives: whiteouts and
//! opaque directories seen through a real overlay of the resulting EROFS
//! layers, digest checks, configs, names. Needs root (mounts).

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use common::{temp_entries, tree_view, Env};
use dsec_image::oci::{import_path, ImportError, ImportOptions, Platform};
use dsec_image::{Digest, NoProgress, Reference};
use rustix::mount::{mount, unmount, MountFlags, UnmountFlags};

/// One entry of a test layer.
enum E<'a> {
    File(&'a str, &'a str),
    Dir(&'a str),
    Link(&'a str, &'a str),
}

fn layer_tar(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_ustar();
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        match e {
            E::File(p, body) => {
                h.set_mode(0o644);
                h.set_size(body.len() as u64);
                h.set_entry_type(tar::EntryType::Regular);
                b.append_data(&mut h, p, body.as_bytes()).unwrap();
            }
            E::Dir(p) => {
                h.set_mode(0o755);
                h.set_size(0);
                h.set_entry_type(tar::EntryType::Directory);
                b.append_data(&mut h, p, &[][..]).unwrap();
            }
            E::Link(p, target) => {
                h.set_mode(0o777);
                h.set_size(0);
                h.set_entry_type(tar::EntryType::Symlink);
                b.append_link(&mut h, p, target).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn sha(data: &[u8]) -> String {
    format!("sha256:{}", Digest::of_bytes(data).hex())
}

fn put_blob(dir: &Path, data: &[u8]) -> String {
    let digest = sha(data);
    let path = dir.join("blobs/sha256").join(&digest[7..]);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, data).unwrap();
    digest
}

fn config_json(diff_ids: &[String], arch: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "architecture": arch, "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin", "GREETING=hi"], "WorkingDir": "/work", "User": "1000:1000"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap()
}

/// Writes an OCI image layout of `layers` (uncompressed tars; stored
/// gzipped) tagged `tag`; returns the layer blob digests.
fn oci_layout(dir: &Path, layers: &[Vec<u8>], tag: &str, arch: &str) -> Vec<String> {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let diff_ids: Vec<String> = layers.iter().map(|l| sha(l)).collect();
    let mut descs = Vec::new();
    let mut digests = Vec::new();
    for l in layers {
        let gz = gzip(l);
        let d = put_blob(dir, &gz);
        descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": gz.len()}));
        digests.push(d);
    }
    let config = config_json(&diff_ids, arch);
    let config_digest = put_blob(dir, &config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": descs,
    }))
    .unwrap();
    let manifest_digest = put_blob(dir, &manifest);
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
        "size": manifest.len(), "annotations": {"org.opencontainers.image.ref.name": tag}}]});
    fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    digests
}

/// Three layers exercising every deletion rule.
fn layers() -> Vec<Vec<u8>> {
    vec![
        layer_tar(&[
            E::Dir("etc"),
            E::File("etc/keep", "kept\n"),
            E::File("etc/gone", "deleted by layer 2\n"),
            E::Dir("d"),
            E::File("d/old1", "hidden by opaque\n"),
            E::Dir("d/sub"),
            E::File("d/sub/old2", "hidden by opaque\n"),
            E::Dir("dirgone"),
            E::File("dirgone/x", "hidden with its dir\n"),
            E::Dir("bin"),
            E::File("bin/tool", "tool v1\n"),
            E::Link("tool-link", "bin/tool"),
        ]),
        layer_tar(&[
            E::File("etc/.wh.gone", ""),
            // The same layer's own entry survives its opaque marker, which
            // comes after it in the archive.
            E::File("d/new", "added with the opaque marker\n"),
            E::File("d/.wh..wh..opq", ""),
            E::File(".wh.dirgone", ""),
            E::File("bin/tool", "tool v2\n"),
        ]),
        layer_tar(&[E::Dir("dirgone"), E::File("dirgone/again", "recreated\n"), E::File("etc/.wh.keep-not-there", "")]),
    ]
}

/// The files (and their contents) an overlay of the image shows.
struct View {
    target: PathBuf,
}

impl View {
    fn new(env: &Env, image: &dsec_image::ResolvedImage) -> View {
        let lowers = env.mounts.mount_image(image).unwrap();
        let target = env.path().join(format!("view-{}", lowers.len()));
        fs::create_dir_all(&target).unwrap();
        if lowers.len() == 1 {
            // overlayfs wants two lower layers without an upper.
            fs::create_dir_all(env.path().join("empty")).unwrap();
        }
        let mut dirs: Vec<String> = lowers.iter().rev().map(|p| p.display().to_string()).collect();
        if dirs.len() == 1 {
            dirs.push(env.path().join("empty").display().to_string());
        }
        mount(
            "overlay",
            &target,
            "overlay",
            MountFlags::RDONLY,
            std::ffi::CString::new(format!("lowerdir={}", dirs.join(":"))).unwrap().as_c_str(),
        )
        .unwrap();
        View { target }
    }

    fn files(&self) -> BTreeSet<String> {
        tree_view(&self.target)
    }
}

impl Drop for View {
    fn drop(&mut self) {
        let _ = unmount(&self.target, UnmountFlags::DETACH);
    }
}

fn expected_view() -> BTreeSet<String> {
    [
        "bin/",
        "bin/tool=tool v2",
        "d/",
        "d/new=added with the opaque marker",
        "dirgone/",
        "dirgone/again=recreated",
        "etc/",
        "etc/keep=kept",
        "tool-link -> bin/tool",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn whiteouts_and_opaque_dirs_hold_whether_layers_are_merged_or_not() {
    let env = Env::new();
    let src = env.path().join("layout");
    oci_layout(&src, &layers(), "tool:1.0", "amd64");

    // All three merged into one dsec layer (the default for small layers).
    let merged = import_path(&env.store, &src, &ImportOptions::default(), &NoProgress).unwrap();
    assert_eq!(merged.reference.to_string(), "tool:1.0");
    assert_eq!(merged.source_layers, 3);
    assert_eq!(merged.image.layers.len(), 1);
    let view = View::new(&env, &merged.image);
    assert_eq!(view.files(), expected_view());
    drop(view);

    // Each its own dsec layer: deletions become overlay whiteouts and
    // opaque directories that hide the lower layers' files.
    let options = ImportOptions { reference: Some("tool:split".parse().unwrap()), merge_below: 0, ..ImportOptions::default() };
    let split = import_path(&env.store, &src, &options, &NoProgress).unwrap();
    assert_eq!(split.image.layers.len(), 3);
    let view = View::new(&env, &split.image);
    assert_eq!(view.files(), expected_view());
    drop(view);

    let config = &split.image.manifest.config;
    assert_eq!(config.workdir, "/work");
    assert_eq!(config.user, "1000:1000");
    assert!(config.env.contains(&"GREETING=hi".to_string()));
    assert_eq!(temp_entries(&env.store), 0);
}

#[test]
fn a_corrupt_layer_stores_nothing() {
    let env = Env::new();
    let src = env.path().join("layout");
    let digests = oci_layout(&src, &layers(), "tool:1.0", "amd64");
    // Flip a byte inside the last layer's blob, keeping its size.
    let blob = src.join("blobs/sha256").join(&digests[2][7..]);
    let mut data = fs::read(&blob).unwrap();
    let mid = data.len() - 12; // inside the gzip trailer's CRC: still decodes
    data[mid] ^= 0xff;
    fs::write(&blob, &data).unwrap();

    let err = import_path(&env.store, &src, &ImportOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(err, ImportError::DigestMismatch { .. } | ImportError::Layer { .. }), "{err}");
    assert!(env.store.list().unwrap().is_empty());
    assert_eq!(temp_entries(&env.store), 0);

    // A manifest naming a blob that is not there.
    fs::remove_file(&blob).unwrap();
    let err = import_path(&env.store, &src, &ImportOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(err, ImportError::MissingFile(_)), "{err}");
    assert_eq!(temp_entries(&env.store), 0);
}

#[test]
fn docker_save_archives_plain_and_gzipped() {
    let env = Env::new();
    let layers = layers();
    let diff_ids: Vec<String> = layers.iter().map(|l| sha(l)).collect();
    let config = config_json(&diff_ids, "amd64");
    let config_name = format!("{}.json", &sha(&config)[7..]);
    let mut b = tar::Builder::new(Vec::new());
    let add = |b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, name, data).unwrap();
    };
    let mut names = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let name = format!("id{i}/layer.tar");
        add(&mut b, &name, l);
        names.push(name);
    }
    add(&mut b, &config_name, &config);
    let manifest = serde_json::json!([{"Config": config_name,
        "RepoTags": ["registry.example/team/saved:2"], "Layers": names}]);
    add(&mut b, "manifest.json", &serde_json::to_vec(&manifest).unwrap());
    let archive = b.into_inner().unwrap();
    let plain = env.path().join("saved.tar");
    fs::write(&plain, &archive).unwrap();
    let gz = env.path().join("saved.tar.gz");
    fs::write(&gz, gzip(&archive)).unwrap();

    let a = import_path(&env.store, &plain, &ImportOptions::default(), &NoProgress).unwrap();
    assert_eq!(a.reference.to_string(), "saved:2");
    let view = View::new(&env, &a.image);
    assert_eq!(view.files(), expected_view());
    drop(view);

    let options = ImportOptions { reference: Some("saved:gz".parse::<Reference>().unwrap()), ..ImportOptions::default() };
    let b = import_path(&env.store, &gz, &options, &NoProgress).unwrap();
    assert_eq!(b.reference.to_string(), "saved:gz");
    let view = View::new(&env, &b.image);
    assert_eq!(view.files(), expected_view());
    drop(view);
    assert_eq!(temp_entries(&env.store), 0);

    // A tampered layer in a docker archive fails on its diff_id.
    let mut bad = archive.clone();
    let pos = bad.windows(9).position(|w| w == b"tool v2\n\0").unwrap();
    bad[pos + 5] = b'3';
    let bad_path = env.path().join("bad.tar");
    fs::write(&bad_path, &bad).unwrap();
    let err = import_path(&env.store, &bad_path, &ImportOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(err, ImportError::DigestMismatch { .. }), "{err}");
}

#[test]
fn bad_sources_are_refused_clearly() {
    let env = Env::new();
    // An image for another CPU.
    let src = env.path().join("arm");
    oci_layout(&src, &layers(), "tool:arm", "arm64");
    let err = import_path(&env.store, &src, &ImportOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(err, ImportError::NoMatchingPlatform { .. }), "{err}");
    let options = ImportOptions {
        platform: Some(Platform { os: "linux".into(), architecture: "arm64".into(), variant: None }),
        ..ImportOptions::default()
    };
    // (Asked for explicitly, it imports: the files are only data here.)
    import_path(&env.store, &src, &options, &NoProgress).unwrap();

    // A layer entry that climbs out of the root.
    let mut evil = layer_tar(&[E::File("placeholder", "x")]);
    let name = b"../../escaped";
    evil[..100].fill(0);
    evil[..name.len()].copy_from_slice(name);
    // Fix the header checksum after editing the name.
    let mut header = tar::Header::new_old();
    header.as_mut_bytes().copy_from_slice(&evil[..512]);
    header.set_cksum();
    evil[..512].copy_from_slice(header.as_bytes());
    let src = env.path().join("evil");
    oci_layout(&src, &[evil], "evil:1", "amd64");
    let err = import_path(&env.store, &src, &ImportOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(err, ImportError::EntryEscapes { .. }), "{err}");
    assert!(!env.path().join("escaped").exists());

    // Not an image at all.
    let plain = env.path().join("rootfs.tar");
    fs::write(&plain, layer_tar(&[E::File("a", "b")])).unwrap();
    let err = import_path(&env.store, &plain, &ImportOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(err, ImportError::NotAnImage(_)), "{err}");
    assert!(err.to_string().contains("--from-tar"), "{err}");
    assert_eq!(temp_entries(&env.store), 0);
}
