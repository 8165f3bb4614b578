//! The busybox recipe and the busybox default image. Needs root and
//! Debian's busybox-static.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;

use common::{temp_entries, Env};
use dsec_image::build::{build_layer_busybox, BusyboxRecipe};
use dsec_image::{build_default_image, BuildError, BuildOptions, DefaultImage, LayerKind, NoProgress};

#[test]
fn busybox_recipe_builds_a_usable_root() {
    let env = Env::new();
    let layer = build_layer_busybox(&env.store, &BusyboxRecipe::default(), &BuildOptions::default(), &NoProgress).unwrap();
    assert_eq!(temp_entries(&env.store), 0);
    let root = env.mounts.mount(&layer.digest, &layer.path).unwrap();

    let busybox = fs::metadata(root.join("bin/busybox")).unwrap();
    assert!(busybox.is_file() && busybox.mode() & 0o111 != 0);
    let sh = fs::read_link(root.join("bin/sh")).unwrap();
    assert!(sh.ends_with("busybox"), "{}", sh.display());
    for applet in ["bin/ls", "bin/cat"] {
        assert!(fs::read_link(root.join(applet)).unwrap().ends_with("busybox"), "{applet}");
    }

    let passwd = fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(passwd.lines().any(|l| l.starts_with("root:x:0:0:")), "{passwd}");
    assert!(passwd.lines().any(|l| l == "user:x:1000:1000:user:/home/user:/bin/sh"), "{passwd}");
    let group = fs::read_to_string(root.join("etc/group")).unwrap();
    assert!(group.lines().any(|l| l == "user:x:1000:"), "{group}");

    let mode = |p: &str| fs::metadata(root.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("tmp"), 0o1777);
    assert_eq!(mode("root"), 0o700);
    assert_eq!(mode("."), 0o755);
    let home = fs::metadata(root.join("home/user")).unwrap();
    assert_eq!((home.uid(), home.gid()), (1000, 1000));
    for dir in ["proc", "sys", "dev", "etc", "usr/bin"] {
        assert!(root.join(dir).is_dir(), "{dir}");
    }
}

#[test]
fn busybox_default_image_is_named_and_resolvable() {
    let env = Env::new();
    let image = build_default_image(&env.store, DefaultImage::Busybox, &NoProgress, "unused").unwrap();
    assert_eq!(image.reference.to_string(), "busybox:latest");
    assert_eq!(image.layers.len(), 1);
    assert_eq!(image.layers[0].kind, LayerKind::Base);
    assert_eq!(env.store.resolve("busybox").unwrap().manifest, image.manifest);
}

#[test]
fn a_dynamic_busybox_is_refused() {
    let env = Env::new();
    // Any dynamically linked program stands in for a non-static busybox.
    let recipe = BusyboxRecipe { busybox: Some(std::env::current_exe().unwrap()) };
    let err = build_layer_busybox(&env.store, &recipe, &BuildOptions::default(), &NoProgress).unwrap_err();
    assert!(matches!(err, BuildError::BusyboxNotStatic { .. }), "{err}");
}
