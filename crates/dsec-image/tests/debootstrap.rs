//! The `python` default image from debootstrap (one or two minutes, needs
//! root and the Debian mirror). Skipped when debootstrap is not installed.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use common::{temp_entries, Env};
use dsec_image::build::DEFAULT_MIRROR;
use dsec_image::{ensure_default_images, DefaultImage, Ensured, NoProgress, ProgressEvent, ProgressFn};

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file())).unwrap_or(false)
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.extend(files_under(&e.path()));
            } else {
                out.push(e.path().display().to_string());
            }
        }
    }
    out
}

#[test]
fn default_images_from_debootstrap() {
    if !on_path("debootstrap") {
        eprintln!("debootstrap is not installed: skipping");
        return;
    }
    let env = Env::new();
    let mirror = std::env::var("DSEC_DEBIAN_MIRROR").unwrap_or_else(|_| DEFAULT_MIRROR.to_string());
    let stages = Mutex::new(Vec::new());
    let progress = ProgressFn(|e: ProgressEvent<'_>| {
        if let ProgressEvent::Stage(s) = e {
            stages.lock().unwrap().push(s.to_string());
        }
    });
    let started = Instant::now();
    let outcome = ensure_default_images(&env.store, &progress, &mirror).unwrap();
    eprintln!("first setup: {:.1?}", started.elapsed());
    assert_eq!(
        outcome,
        [(DefaultImage::Busybox, Ensured::Built), (DefaultImage::Python, Ensured::Built), (DefaultImage::Judge, Ensured::Built)]
    );
    assert!(stages.lock().unwrap().iter().any(|s| s.starts_with("I: Retrieving")), "debootstrap's output reached the progress callback");
    assert_eq!(temp_entries(&env.store), 0, "build root removed");

    let image = env.store.resolve("python").unwrap();
    assert!(image.manifest.config.env.iter().any(|e| e.starts_with("PATH=")));
    let root = env.mounts.mount_image(&image).unwrap().pop().unwrap();
    // Present, not executed: nothing from the image runs on the host.
    let python = fs::symlink_metadata(root.join("usr/bin/python3")).unwrap();
    assert!(python.file_type().is_symlink() || python.is_file());
    assert!(root.join("usr/bin/python3").exists(), "python3 resolves inside the image");
    assert!(root.join("usr/bin/git").is_file());
    assert!(root.join("usr/lib/python3/dist-packages/pytest").is_dir());
    assert!(root.join("usr/lib/python3/dist-packages/pip").is_dir());

    let passwd = fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(passwd.lines().any(|l| l.starts_with("user:x:1000:1000:")), "{passwd}");
    let shadow = fs::read_to_string(root.join("etc/shadow")).unwrap();
    assert!(shadow.lines().any(|l| l.starts_with("user:")));
    let home = fs::metadata(root.join("home/user")).unwrap();
    assert_eq!((home.uid(), home.gid()), (1000, 1000));
    assert!(root.join("home/user/.bashrc").is_file(), "skel copied");

    // Cleaned: no package lists, downloaded debs or logs.
    let lists: Vec<_> = files_under(&root.join("var/lib/apt/lists")).into_iter().filter(|f| !f.ends_with("/lock")).collect();
    assert!(lists.is_empty(), "{lists:?}");
    assert!(files_under(&root.join("var/cache/apt/archives")).iter().all(|f| !f.ends_with(".deb")));
    assert!(files_under(&root.join("var/log")).is_empty());
    eprintln!("python image: {} bytes", image.manifest.size_bytes);

    // The FnCall runners' image carries the judge's toolchains.
    let judge = env.store.resolve("judge").unwrap();
    let root = env.mounts.mount_image(&judge).unwrap().pop().unwrap();
    for tool in [
        "usr/bin/python3",
        "usr/bin/gcc",
        "usr/bin/g++",
        "usr/include/stdio.h",
        "bin/bash",
        "usr/bin/javac",
        "usr/bin/jar",
        "usr/bin/node",
        "usr/bin/go",
        "usr/bin/rustc",
        "usr/bin/php",
        "usr/bin/ruby",
        "usr/bin/perl",
        "usr/bin/lua5.4",
    ] {
        let found = resolve_in_image(&root, tool);
        assert!(found.as_ref().is_some_and(|p| p.is_file()), "judge image lacks {tool} (resolved: {found:?})");
    }
    // ... and <bits/stdc++.h> precompiled beside the header (the build
    // itself checked that g++ uses it), and no trace of that check.
    let headers: Vec<String> = files_under(&root.join("usr/include"))
        .into_iter()
        .filter(|f| f.ends_with("/bits/stdc++.h") || f.ends_with("/bits/stdc++.h.gch"))
        .collect();
    assert_eq!(headers.len(), 2, "{headers:?}");
    assert_eq!(format!("{}.gch", headers.iter().min().unwrap()), *headers.iter().max().unwrap());
    // ... and Java's class-data-sharing archives (the build itself checked
    // that each JVM maps its own).
    for archive in [dsec_fncall_runner::JAVAC_CDS_ARCHIVE, dsec_fncall_runner::JAVA_CDS_ARCHIVE] {
        let len = fs::metadata(root.join(archive.trim_start_matches('/'))).map(|m| m.len()).unwrap_or(0);
        assert!(len > 1 << 20, "{archive}: {len} bytes");
    }
    // Nothing at all in /tmp: not the check's files, nor what the packages'
    // scripts left (a JDK's postinst leaves /tmp/hsperfdata_root).
    assert_eq!(fs::read_dir(root.join("tmp")).unwrap().count(), 0);
    for which in DefaultImage::ALL {
        let image = env.store.resolve(which.name()).unwrap();
        assert_eq!(image.manifest.default_recipe, Some(which.recipe_version()), "{}", which.name());
    }

    // A second setup finds them all and builds nothing.
    let started = Instant::now();
    let again = ensure_default_images(&env.store, &NoProgress, &mirror).unwrap();
    let elapsed = started.elapsed();
    assert_eq!(
        again,
        [
            (DefaultImage::Busybox, Ensured::AlreadyPresent),
            (DefaultImage::Python, Ensured::AlreadyPresent),
            (DefaultImage::Judge, Ensured::AlreadyPresent)
        ]
    );
    assert!(elapsed.as_secs_f64() < 1.0, "second setup took {elapsed:?}");

    // An image from an older recipe is rebuilt (busybox: the quick one).
    let busybox = DefaultImage::Busybox.reference();
    let mut old = env.store.resolve_ref(&busybox).unwrap().manifest.clone();
    old.default_recipe = Some(0);
    env.store.put_image(&busybox, &old).unwrap();
    let third = ensure_default_images(&env.store, &NoProgress, &mirror).unwrap();
    assert_eq!(
        third,
        [
            (DefaultImage::Busybox, Ensured::Built),
            (DefaultImage::Python, Ensured::AlreadyPresent),
            (DefaultImage::Judge, Ensured::AlreadyPresent)
        ]
    );
    let rebuilt = env.store.resolve_ref(&busybox).unwrap();
    assert_eq!(rebuilt.manifest.default_recipe, Some(DefaultImage::Busybox.recipe_version()));

    // A `judge` with no recipe version (an older dsec's, or someone's own
    // image of that name) is kept as it is, with a word about it.
    let judge_ref = DefaultImage::Judge.reference();
    let mut unversioned = env.store.resolve_ref(&judge_ref).unwrap().manifest.clone();
    unversioned.default_recipe = None;
    env.store.put_image(&judge_ref, &unversioned).unwrap();
    let said = Mutex::new(Vec::new());
    let listen = ProgressFn(|e: ProgressEvent<'_>| {
        if let ProgressEvent::Stage(s) = e {
            said.lock().unwrap().push(s.to_string());
        }
    });
    let fourth = ensure_default_images(&env.store, &listen, &mirror).unwrap();
    assert!(fourth.iter().all(|(_, e)| *e == Ensured::AlreadyPresent), "{fourth:?}");
    assert_eq!(env.store.resolve_ref(&judge_ref).unwrap().manifest.layers, unversioned.layers);
    assert!(said.lock().unwrap().iter().any(|s| s.contains("dsec image rm judge")), "{said:?}");
}

/// `path` inside the image mounted at `root`, its symlinks followed as the
/// image's own processes see them: an absolute target (most of
/// `/etc/alternatives`) is the image's, not the host's. None past 40 links.
fn resolve_in_image(root: &Path, path: &str) -> Option<PathBuf> {
    let mut rel = PathBuf::from(path.trim_start_matches('/'));
    for _ in 0..40 {
        let here = root.join(&rel);
        let Ok(target) = fs::read_link(&here) else { return Some(here) };
        rel = if target.is_absolute() {
            target.strip_prefix("/").unwrap().to_path_buf()
        } else {
            rel.parent().unwrap_or(Path::new("")).join(target)
        };
    }
    None
}
