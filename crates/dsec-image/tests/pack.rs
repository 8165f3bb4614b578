//! pack_diff on a real overlay: the changes made through an overlay mount,
//! packed (and packed again, incrementally) into layers, must show exactly
//! the overlay's view when stacked on the original layer. Needs root.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use common::{temp_entries, tree_view, Env};
use dsec_image::build::build_layer_from_dir;
use dsec_image::pack::{PackScratch, ScrubPattern, DEFAULT_SCRUB};
use dsec_image::{BuildOptions, NoProgress};
use rustix::mount::{mount, unmount, MountFlags, UnmountFlags};

struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = unmount(&self.0, UnmountFlags::DETACH);
    }
}

fn overlay(target: &Path, lowers_top_first: &[PathBuf], upper: Option<(&Path, &Path)>) -> Mount {
    fs::create_dir_all(target).unwrap();
    let mut opts = format!("lowerdir={}", lowers_top_first.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(":"));
    if let Some((u, w)) = upper {
        opts += &format!(",upperdir={},workdir={},index=off,redirect_dir=off,metacopy=off", u.display(), w.display());
    }
    let flags = if upper.is_some() { MountFlags::empty() } else { MountFlags::RDONLY };
    mount("overlay", target, "overlay", flags, std::ffi::CString::new(opts).unwrap().as_c_str()).unwrap();
    Mount(target.to_path_buf())
}

fn view(root: &Path) -> BTreeSet<String> {
    tree_view(root)
}

#[test]
fn packs_stacked_on_the_base_show_what_the_sandbox_saw() {
    let env = Env::new();
    // The base layer.
    let src = env.path().join("base-src");
    for d in ["etc", "app/old", "doomed/deep", "tmp"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    fs::write(src.join("etc/conf"), "v1").unwrap();
    fs::write(src.join("etc/remove-me"), "x").unwrap();
    fs::write(src.join("app/old/a"), "a").unwrap();
    fs::write(src.join("doomed/deep/f"), "f").unwrap();
    let base = build_layer_from_dir(&env.store, &src, &BuildOptions::default(), &NoProgress).unwrap();
    let base_dir = env.mounts.mount(&base.digest, &base.path).unwrap();

    // The "sandbox": an overlay with a writable upper on a tmpfs.
    let scratch = env.path().join("scratch");
    fs::create_dir_all(&scratch).unwrap();
    mount("tmpfs", &scratch, "tmpfs", MountFlags::empty(), c"size=64m").unwrap();
    let _scratch = Mount(scratch.clone());
    let (upper, work) = (scratch.join("upper"), scratch.join("work"));
    fs::create_dir_all(&upper).unwrap();
    fs::create_dir_all(&work).unwrap();
    let sb = env.path().join("sandbox");
    let sandbox = overlay(&sb, std::slice::from_ref(&base_dir), Some((&upper, &work)));

    fs::write(sb.join("etc/conf"), "v2").unwrap();
    fs::remove_file(sb.join("etc/remove-me")).unwrap();
    fs::remove_dir_all(sb.join("app/old")).unwrap();
    fs::create_dir(sb.join("app/old")).unwrap(); // opaque in the upper
    fs::write(sb.join("app/old/b"), "b").unwrap();
    fs::write(sb.join("app/new"), "new").unwrap();
    fs::write(sb.join("tmp/residue"), "scrub me").unwrap();
    std::os::unix::fs::symlink("conf", sb.join("etc/link")).unwrap();

    let scrub: Vec<ScrubPattern> = DEFAULT_SCRUB.iter().map(|p| ScrubPattern::parse(p).unwrap()).collect();
    let check = |layers: &[PathBuf], name: &str| {
        let mut expected = view(&sb);
        expected.remove("tmp/residue=scrub me");
        let target = env.path().join(name);
        let m = overlay(&target, layers, None);
        assert_eq!(view(&target), expected, "{name}");
        drop(m);
    };

    // Pack 1: everything the upper holds, minus residue.
    let p1 = PackScratch::collect(&env.store, None, &upper, None, &scrub).unwrap();
    assert_eq!(p1.stats.scrubbed, 1);
    let index1 = p1.index.clone();
    let l1 = p1.build(&env.store, &BuildOptions::default(), &NoProgress).unwrap();
    let d1 = env.mounts.mount(&l1.digest, &l1.path).unwrap();
    check(&[d1.clone(), base_dir.clone()], "view1");

    // More work, then an incremental pack 2.
    fs::write(sb.join("app/old/b"), "b2").unwrap();
    fs::remove_file(sb.join("app/new")).unwrap(); // only ever in the upper
    fs::remove_dir_all(sb.join("doomed")).unwrap();
    fs::write(sb.join("etc/added"), "later").unwrap();
    let p2 = PackScratch::collect(&env.store, None, &upper, Some(&index1), &scrub).unwrap();
    let stats2 = p2.stats;
    let l2 = p2.build(&env.store, &BuildOptions::default(), &NoProgress).unwrap();
    let d2 = env.mounts.mount(&l2.digest, &l2.path).unwrap();
    check(&[d2.clone(), d1.clone(), base_dir.clone()], "view2");
    // Only the changes: b2, added, and whiteouts for app/new and doomed.
    assert_eq!(stats2.bytes, 2 + 5, "{stats2:?}");
    assert_eq!(stats2.whiteouts, 2, "{stats2:?}");

    drop(sandbox);
    assert_eq!(temp_entries(&env.store), 0);
}
