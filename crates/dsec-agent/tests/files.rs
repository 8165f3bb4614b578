//! File operations through the real agent (plain mode).

mod common;

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

use common::*;
use dsec_agent_proto::{ErrorKind, FileKind, Op, Reply};

#[tokio::test]
async fn multi_megabyte_binary_round_trip() {
    let a = TestAgent::start().await;
    let data = noise(5 << 20, 42);
    let mut spec = write_spec("/dir/sub/blob.bin");
    spec.create_parents = true;
    spec.mode = 0o640;
    let r = a.write_file(spec, &data).await.unwrap();
    assert_eq!(r, Reply::Written { bytes: data.len() as u64 });
    let on_disk = std::fs::read(a.host("/dir/sub/blob.bin")).unwrap();
    assert!(on_disk == data, "content differs on disk");
    assert_eq!(std::fs::metadata(a.host("/dir/sub/blob.bin")).unwrap().permissions().mode() & 0o777, 0o640);
    let back = a.read_file("/dir/sub/blob.bin").await.unwrap();
    assert!(back == data, "content differs when read back");

    // Offset and limit.
    let call = a.client.open(Op::ReadFile { path: "/dir/sub/blob.bin".into(), offset: 1000, limit: Some(70_000) }).await.unwrap();
    let (out, reply) = collect(call, 10).await;
    assert_eq!(reply.unwrap(), Reply::Done);
    assert!(out.content == data[1000..71_000]);

    // Overwrite is atomic and leaves no temporary file.
    a.write_file(write_spec("/dir/sub/blob.bin"), b"small").await.unwrap();
    assert_eq!(std::fs::read(a.host("/dir/sub/blob.bin")).unwrap(), b"small");
    let names: Vec<_> = std::fs::read_dir(a.host("/dir/sub")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "{names:?}");

    // Append.
    let mut spec = write_spec("/dir/sub/blob.bin");
    spec.append = true;
    a.write_file(spec, b" more").await.unwrap();
    assert_eq!(a.read_file("/dir/sub/blob.bin").await.unwrap(), b"small more");

    // Without create_parents a missing parent is NotFound.
    assert_eq!(a.write_file(write_spec("/nope/x"), b"x").await.unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(a.read_file("/nope").await.unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(a.read_file("/dir").await.unwrap_err().kind, ErrorKind::IsADirectory);
}

#[tokio::test]
async fn owner_of_a_written_file() {
    if !is_root() {
        return;
    }
    let a = TestAgent::start().await;
    std::fs::create_dir(a.host("/etc")).unwrap();
    std::fs::write(a.host("/etc/passwd"), "app:x:1500:1600::/home/app:/bin/sh\n").unwrap();
    let mut spec = write_spec("/owned");
    spec.owner = Some("app".into());
    spec.mode = 0o600;
    a.write_file(spec, b"x").await.unwrap();
    let md = std::fs::metadata(a.host("/owned")).unwrap();
    assert_eq!((md.uid(), md.gid(), md.mode() & 0o7777), (1500, 1600, 0o600));
}

#[tokio::test]
async fn too_large_upload_leaves_nothing() {
    let a = TestAgent::start().await;
    let mut spec = write_spec("/big");
    spec.max_bytes = 100_000;
    let e = a.write_file(spec, &noise(1 << 20, 1)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::TooLarge);
    assert_eq!(std::fs::read_dir(a.root()).unwrap().count(), 0, "a file was left behind");

    // An append that overflows restores the original content.
    std::fs::write(a.host("/log"), b"keep").unwrap();
    let mut spec = write_spec("/log");
    spec.append = true;
    spec.max_bytes = 10;
    let e = a.write_file(spec, &noise(300_000, 2)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::TooLarge);
    assert_eq!(std::fs::read(a.host("/log")).unwrap(), b"keep");
}

#[tokio::test]
async fn stat_list_mkdir_remove() {
    let a = TestAgent::start().await;
    let c = &a.client;
    assert_eq!(c.call(Op::Mkdir { path: "/a/b/c".into(), parents: true, mode: 0o750 }).await.unwrap(), Reply::Done);
    assert_eq!(std::fs::metadata(a.host("/a/b/c")).unwrap().permissions().mode() & 0o7777, 0o750);
    // mkdir -p of an existing directory is fine; without -p it is not.
    c.call(Op::Mkdir { path: "/a/b/c".into(), parents: true, mode: 0o755 }).await.unwrap();
    let e = c.call(Op::Mkdir { path: "/a/b/c".into(), parents: false, mode: 0o755 }).await.unwrap_err();
    assert!(matches!(e, dsec_agent_proto::client::ClientError::Agent(ref e) if e.kind == ErrorKind::AlreadyExists), "{e}");
    std::fs::write(a.host("/a/file"), b"12345").unwrap();
    symlink("b/c", a.host("/a/link")).unwrap();

    let Reply::Stat(st) = c.call(Op::Stat { path: "/a/file".into() }).await.unwrap() else { panic!() };
    assert_eq!((st.name.as_str(), st.kind, st.size), ("file", FileKind::File, 5));
    let Reply::Stat(st) = c.call(Op::Stat { path: "/a/link".into() }).await.unwrap() else { panic!() };
    assert_eq!((st.kind, st.link_target.as_deref()), (FileKind::Symlink, Some("b/c")));
    let Reply::Stat(st) = c.call(Op::Stat { path: "/".into() }).await.unwrap() else { panic!() };
    assert_eq!(st.kind, FileKind::Dir);

    let Reply::Dir(entries) = c.call(Op::ListDir { path: "/a".into() }).await.unwrap() else { panic!() };
    let names: Vec<(&str, FileKind)> = entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(names, [("b", FileKind::Dir), ("file", FileKind::File), ("link", FileKind::Symlink)]);
    // A listing through a symlinked directory follows it (inside the root).
    let Reply::Dir(entries) = c.call(Op::ListDir { path: "/a/link".into() }).await.unwrap() else { panic!() };
    assert!(entries.is_empty());

    let kind = |r: Result<Reply, dsec_agent_proto::client::ClientError>| match r {
        Err(dsec_agent_proto::client::ClientError::Agent(e)) => e.kind,
        other => panic!("expected an agent error, got {other:?}"),
    };
    assert_eq!(kind(c.call(Op::Remove { path: "/a".into(), recursive: false }).await), ErrorKind::DirectoryNotEmpty);
    assert_eq!(kind(c.call(Op::ListDir { path: "/a/file".into() }).await), ErrorKind::NotADirectory);
    assert_eq!(kind(c.call(Op::Stat { path: "/missing".into() }).await), ErrorKind::NotFound);
    assert_eq!(kind(c.call(Op::Remove { path: "/".into(), recursive: true }).await), ErrorKind::InvalidPath);
    // Removing the symlink removes the link, not its target.
    c.call(Op::Remove { path: "/a/link".into(), recursive: false }).await.unwrap();
    assert!(a.host("/a/b/c").is_dir());
    c.call(Op::Remove { path: "/a".into(), recursive: true }).await.unwrap();
    assert!(!a.host("/a").exists());
}

#[tokio::test]
async fn paths_cannot_leave_the_root() {
    let a = TestAgent::start().await;
    let c = &a.client;
    let kind = |r: Result<Reply, dsec_agent_proto::client::ClientError>| match r {
        Err(dsec_agent_proto::client::ClientError::Agent(e)) => e.kind,
        other => panic!("expected an agent error, got {other:?}"),
    };
    for p in ["/../etc/passwd", "/a/../../etc", "relative/path", ""] {
        assert_eq!(kind(c.call(Op::Stat { path: p.into() }).await), ErrorKind::InvalidPath, "{p:?}");
    }
    // Symlinks pointing outside resolve inside the root instead.
    symlink("/etc", a.host("/abs")).unwrap();
    symlink("../../../../../../etc", a.host("/rel")).unwrap();
    for p in ["/abs/passwd", "/rel/passwd"] {
        assert_eq!(a.read_file(p).await.unwrap_err().kind, ErrorKind::NotFound, "{p} escaped");
    }
    // Writing through them cannot create anything outside either: the link
    // dangles inside the root...
    let mut spec = write_spec("/abs/dsec-escape-test");
    spec.create_parents = true;
    assert_eq!(a.write_file(spec.clone(), b"x").await.unwrap_err().kind, ErrorKind::NotFound);
    assert!(!std::path::Path::new("/etc/dsec-escape-test").exists());
    // ...and once its target exists there, that is where writes land.
    std::fs::create_dir(a.host("/etc")).unwrap();
    a.write_file(spec, b"x").await.unwrap();
    assert!(!std::path::Path::new("/etc/dsec-escape-test").exists());
    assert!(a.host("/etc/dsec-escape-test").exists(), "the link's target is taken inside the root");
    let e = a.client.call(Op::Mkdir { path: "/rel/x".into(), parents: true, mode: 0o755 }).await;
    assert!(e.is_ok());
    assert!(a.host("/etc/x").is_dir());
}

/// Unmounts on drop (even when the test fails).
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let p = std::ffi::CString::new(self.0.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: umount2 on a path we mounted.
        unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
    }
}

#[tokio::test]
async fn proc_magic_links_are_refused() {
    if !is_root() {
        return;
    }
    let a = TestAgent::start().await;
    let proc_dir = a.host("/proc");
    std::fs::create_dir(&proc_dir).unwrap();
    let p = std::ffi::CString::new(proc_dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mount(2) of a fresh procfs on our own temp dir.
    let r = unsafe { libc::mount(c"proc".as_ptr(), p.as_ptr(), c"proc".as_ptr(), 0, std::ptr::null()) };
    assert_eq!(r, 0, "mount proc: {}", std::io::Error::last_os_error());
    let _guard = Unmount(proc_dir);
    // Plain /proc files are fine...
    assert!(!a.read_file("/proc/self/status").await.unwrap().is_empty());
    // ...but magic links (root, cwd, exe, fd/N) are not followed.
    for p in ["/proc/self/root/etc/hostname", "/proc/self/cwd", "/proc/self/exe", "/proc/self/fd/0", "/proc/thread-self/root/etc/passwd"] {
        let e = a.read_file(p).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidPath, "{p}: {e:?}");
    }
    // Another process's links may fail the ptrace check first; either way
    // they are refused.
    let e = a.read_file("/proc/1/root/etc/passwd").await.unwrap_err();
    assert!(matches!(e.kind, ErrorKind::InvalidPath | ErrorKind::PermissionDenied), "{e:?}");
}

#[tokio::test]
async fn tar_round_trip() {
    let a = TestAgent::start().await;
    let src = a.host("/src");
    let long = format!("{}/{}", "d".repeat(120), "f".repeat(130));
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(src.join(long.rsplit_once('/').unwrap().0)).unwrap();
    std::fs::write(src.join(&long), b"long name").unwrap();
    std::fs::write(src.join("blob"), noise(300_000, 9)).unwrap();
    std::fs::write(src.join("empty"), b"").unwrap();
    std::fs::write(src.join("sub/deeper/x.sh"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(src.join("sub/deeper/x.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    symlink("../blob", src.join("sub/link")).unwrap();

    let call = a.client.open(Op::TarCreate { path: "/src".into() }).await.unwrap();
    let (out, reply) = collect(call, 30).await;
    assert_eq!(reply.unwrap(), Reply::Done);
    let archive = out.content;
    assert_eq!(archive.len() % 512, 0);

    // An independent reader agrees with what we wrote.
    let mut names: Vec<String> =
        tar::Archive::new(&archive[..]).entries().unwrap().map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned()).collect();
    names.sort();
    let mut expected =
        vec!["blob".to_string(), "empty".into(), "sub/".into(), "sub/deeper/".into(), "sub/deeper/x.sh".into(), "sub/link".into()];
    expected.push(format!("{}/", "d".repeat(120)));
    expected.push(long.clone());
    expected.sort();
    let names_trimmed: Vec<String> = names.iter().map(|n| n.trim_end_matches('/').to_string()).collect();
    let expected_trimmed: Vec<String> = expected.iter().map(|n| n.trim_end_matches('/').to_string()).collect();
    assert_eq!(names_trimmed, expected_trimmed);

    // Extract it elsewhere and compare.
    let call = a.client.open(Op::TarExtract { path: "/dst".into(), max_bytes: 1 << 30 }).await.unwrap();
    assert_eq!(upload(call, &archive).await.unwrap(), Reply::Done);
    let dst = a.host("/dst");
    assert_eq!(std::fs::read(dst.join(&long)).unwrap(), b"long name");
    assert_eq!(std::fs::read(dst.join("blob")).unwrap(), noise(300_000, 9));
    assert_eq!(std::fs::read(dst.join("empty")).unwrap(), b"");
    assert_eq!(std::fs::metadata(dst.join("sub/deeper/x.sh")).unwrap().permissions().mode() & 0o777, 0o755);
    assert_eq!(std::fs::read_link(dst.join("sub/link")).unwrap().to_str(), Some("../blob"));

    // A single file archives under its own name.
    let call = a.client.open(Op::TarCreate { path: "/src/empty".into() }).await.unwrap();
    let (out, _) = collect(call, 10).await;
    let n: Vec<String> =
        tar::Archive::new(&out.content[..]).entries().unwrap().map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(n, ["empty"]);
}

#[tokio::test]
async fn extract_an_archive_made_by_the_tar_crate() {
    let a = TestAgent::start().await;
    let mut b = tar::Builder::new(Vec::new());
    let long = format!("{}/file", "x".repeat(200));
    for (name, data) in [(long.as_str(), &b"gnu long name"[..]), ("top.txt", b"top")] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o600);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    }
    let archive = b.into_inner().unwrap();
    let call = a.client.open(Op::TarExtract { path: "/out".into(), max_bytes: 1 << 20 }).await.unwrap();
    assert_eq!(upload(call, &archive).await.unwrap(), Reply::Done);
    assert_eq!(std::fs::read(a.host("/out").join(&long)).unwrap(), b"gnu long name");
    assert_eq!(std::fs::metadata(a.host("/out/top.txt")).unwrap().permissions().mode() & 0o777, 0o600);
}

/// A ustar header for `name` (the tar crate refuses to write `..`).
fn raw_header(name: &str, kind: u8, size: u64, link: &str) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}

#[tokio::test]
async fn extract_refuses_escaping_entries_and_caps_size() {
    let a = TestAgent::start().await;
    std::fs::create_dir(a.host("/t")).unwrap();
    let mut archive = raw_header("../escaped", b'0', 0, "");
    archive.extend([0u8; 1024]);
    let call = a.client.open(Op::TarExtract { path: "/t".into(), max_bytes: 1 << 20 }).await.unwrap();
    assert_eq!(upload(call, &archive).await.unwrap_err().kind, ErrorKind::InvalidPath);
    assert!(!a.host("/escaped").exists());

    // A symlink entry, then a file "through" it: the second must not land
    // outside the target.
    let mut archive = raw_header("evil", b'2', 0, "/");
    archive.extend(raw_header("evil/escaped2", b'0', 0, ""));
    archive.extend([0u8; 1024]);
    let call = a.client.open(Op::TarExtract { path: "/t".into(), max_bytes: 1 << 20 }).await.unwrap();
    assert_eq!(upload(call, &archive).await.unwrap_err().kind, ErrorKind::InvalidPath);
    assert!(!a.host("/escaped2").exists());

    // The size cap.
    let mut archive = raw_header("big", b'0', 600_000, "");
    archive.extend(vec![0u8; 600_000 + 1024 + 512]);
    let call = a.client.open(Op::TarExtract { path: "/t2".into(), max_bytes: 100_000 }).await.unwrap();
    assert_eq!(upload(call, &archive).await.unwrap_err().kind, ErrorKind::TooLarge);

    // Not a tar at all.
    let call = a.client.open(Op::TarExtract { path: "/t3".into(), max_bytes: 1 << 20 }).await.unwrap();
    assert_eq!(upload(call, &noise(4096, 3)).await.unwrap_err().kind, ErrorKind::InvalidArgument);
}
