//! Layers from tar and tar.gz archives, including hostile ones. Needs root.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;

use common::{make_tree, temp_entries, Env};
use dsec_image::build::build_layer_from_tar;
use dsec_image::{BuildError, BuildOptions, NoProgress, ProgressEvent, ProgressFn, Unit};
use flate2::write::GzEncoder;

/// Archives `src` (owners and modes as they are) plus a hard link entry.
fn write_archive(src: &Path, out: &Path, gzip: bool) {
    let file = fs::File::create(out).unwrap();
    let sink: Box<dyn Write> = if gzip { Box::new(GzEncoder::new(file, flate2::Compression::fast())) } else { Box::new(file) };
    let mut builder = tar::Builder::new(sink);
    builder.follow_symlinks(false);
    builder.append_dir_all(".", src).unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Link);
    header.set_size(0);
    header.set_mode(0o644);
    builder.append_link(&mut header, "etc/greeting-hardlink", "etc/greeting").unwrap();
    builder.into_inner().unwrap().flush().unwrap();
}

#[test]
fn tar_gz_layer_keeps_modes_owners_links() {
    let env = Env::new();
    let src = env.path().join("src");
    make_tree(&src);
    // A read-only directory with content: must not block its own entries.
    fs::create_dir(src.join("locked")).unwrap();
    fs::write(src.join("locked/inside"), "in").unwrap();
    fs::set_permissions(src.join("locked"), std::os::unix::fs::PermissionsExt::from_mode(0o555)).unwrap();
    let archive = env.path().join("rootfs.tar.gz");
    write_archive(&src, &archive, true);

    let events = Mutex::new(Vec::new());
    let progress = ProgressFn(|e: ProgressEvent<'_>| {
        if let ProgressEvent::Advance { done, total, unit: Unit::Bytes } = e {
            events.lock().unwrap().push((done, total));
        }
    });
    let layer = build_layer_from_tar(&env.store, &archive, &BuildOptions::default(), &progress).unwrap();
    let total = fs::metadata(&archive).unwrap().len();
    assert!(events.lock().unwrap().contains(&(total, Some(total))));
    assert_eq!(temp_entries(&env.store), 0, "scratch root removed");

    let root = env.mounts.mount(&layer.digest, &layer.path).unwrap();
    assert_eq!(fs::read_to_string(root.join("etc/greeting")).unwrap(), "hello from a layer\n");
    let main = fs::metadata(root.join("home/user/project/main.py")).unwrap();
    assert_eq!((main.uid(), main.gid()), (1000, 1000));
    assert_eq!(fs::metadata(root.join("run.sh")).unwrap().mode() & 0o7777, 0o755);
    assert_eq!(fs::metadata(root.join("locked")).unwrap().mode() & 0o7777, 0o555);
    assert_eq!(fs::read_to_string(root.join("locked/inside")).unwrap(), "in");
    assert_eq!(fs::read_link(root.join("greeting-link")).unwrap().to_str(), Some("etc/greeting"));
    let a = fs::metadata(root.join("etc/greeting")).unwrap();
    let b = fs::metadata(root.join("etc/greeting-hardlink")).unwrap();
    assert_eq!(a.ino(), b.ino(), "hard link kept");
    assert_eq!(fs::metadata(&root).unwrap().mode() & 0o777, 0o755, "root is traversable");
}

#[test]
fn plain_tar_works_too() {
    let env = Env::new();
    let src = env.path().join("src");
    make_tree(&src);
    let archive = env.path().join("rootfs.tar");
    write_archive(&src, &archive, false);
    let layer = build_layer_from_tar(&env.store, &archive, &BuildOptions::default(), &NoProgress).unwrap();
    let root = env.mounts.mount(&layer.digest, &layer.path).unwrap();
    assert!(root.join("home/user/project/main.py").is_file());
}

/// A raw header whose name the tar crate's safe setters would refuse.
fn raw_entry(builder: &mut tar::Builder<fs::File>, name: &str, kind: tar::EntryType, link: &str, data: &[u8]) {
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    header.set_entry_type(kind);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(1_700_000_000);
    header.set_size(data.len() as u64);
    header.set_cksum();
    builder.append(&header, data).unwrap();
}

#[test]
fn escaping_entries_are_refused() {
    let env = Env::new();
    let outside = env.path().join("outside");
    let cases: [&[(&str, tar::EntryType, &str)]; 3] = [
        // Plain `..` traversal.
        &[("../outside", tar::EntryType::Regular, "")],
        // Through a symlink that points up and out.
        &[("evil", tar::EntryType::Symlink, "../../../../../.."), ("evil/pwned", tar::EntryType::Regular, "")],
        // A hard link to a file outside the root.
        &[("hl", tar::EntryType::Link, "../../../../../../etc/hostname")],
    ];
    for (i, entries) in cases.iter().enumerate() {
        let archive = env.path().join(format!("evil-{i}.tar"));
        let mut builder = tar::Builder::new(fs::File::create(&archive).unwrap());
        for (name, kind, link) in entries.iter() {
            raw_entry(&mut builder, name, *kind, link, if *kind == tar::EntryType::Regular { b"x" } else { b"" });
        }
        builder.finish().unwrap();
        drop(builder);
        let err = build_layer_from_tar(&env.store, &archive, &BuildOptions::default(), &NoProgress).unwrap_err();
        assert!(matches!(err, BuildError::TarEntryEscapes { .. }), "case {i}: {err}");
        assert!(!outside.exists());
        assert_eq!(temp_entries(&env.store), 0, "case {i}: scratch removed");
    }
    assert!(common::blob_files(&env.store).is_empty());
}

#[test]
fn a_damaged_archive_is_an_error_not_a_layer() {
    let env = Env::new();
    let src = env.path().join("src");
    make_tree(&src);
    let archive = env.path().join("rootfs.tar.gz");
    write_archive(&src, &archive, true);
    let bytes = fs::read(&archive).unwrap();
    fs::write(&archive, &bytes[..bytes.len() / 2]).unwrap();
    let err = build_layer_from_tar(&env.store, &archive, &BuildOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(err, BuildError::Tar { .. }), "{err}");
    assert_eq!(temp_entries(&env.store), 0);
    assert!(common::blob_files(&env.store).is_empty());
}
