//! Layer from `debootstrap --variant=minbase SUITE` plus extra packages.

use std::fs;
use std::io;
use std::path::Path;
use std::process::Command;

use super::tool::{self, DEBOOTSTRAP};
use super::users::{add_user, sandbox_user};
use super::{io_err, mkfs::mkfs_into_store, BuildDir, BuildError, BuildOptions};
use crate::progress::Progress;
use crate::store::{ImageStore, StoredLayer};

pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebootstrapRecipe {
    /// e.g. `bookworm`.
    pub suite: String,
    pub mirror: String,
    /// Extra packages (`--include`), with their dependencies.
    pub include: Vec<String>,
    /// Add the non-root `user` (uid/gid 1000, home /home/user).
    pub add_user: bool,
}

impl DebootstrapRecipe {
    pub fn new(suite: &str) -> Self {
        DebootstrapRecipe { suite: suite.to_string(), mirror: DEFAULT_MIRROR.to_string(), include: Vec::new(), add_user: true }
    }

    /// Everything here ends up on debootstrap's command line: refuse what
    /// could be read as an option or is not a Debian name at all.
    fn validate(&self) -> Result<(), BuildError> {
        let debian_name = |s: &str| {
            s.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
                && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+.-".contains(&b))
        };
        if !debian_name(&self.suite) {
            return Err(BuildError::InvalidRecipe(format!("suite `{}`", self.suite)));
        }
        if let Some(bad) = self.include.iter().find(|p| !debian_name(p)) {
            return Err(BuildError::InvalidRecipe(format!("package name `{bad}`")));
        }
        let scheme_ok = ["http://", "https://", "file:///"].iter().any(|s| self.mirror.starts_with(s));
        if !scheme_ok || self.mirror.chars().any(char::is_whitespace) {
            return Err(BuildError::InvalidRecipe(format!("mirror URL `{}`", self.mirror)));
        }
        Ok(())
    }
}

/// Runs debootstrap (its output lines go to `progress` as stage text),
/// strips apt caches, package lists and logs, adds the user, builds the layer.
/// Needs root and network access to the mirror; takes a minute or two.
pub fn build_layer_debootstrap(
    store: &ImageStore,
    recipe: &DebootstrapRecipe,
    options: &BuildOptions,
    progress: &dyn Progress,
) -> Result<StoredLayer, BuildError> {
    build_layer_debootstrap_then(store, recipe, options, progress, |_| Ok(()))
}

/// [`build_layer_debootstrap`], with `finish` run on the tree before it
/// becomes the layer (the judge image precompiles a header there).
pub(crate) fn build_layer_debootstrap_then(
    store: &ImageStore,
    recipe: &DebootstrapRecipe,
    options: &BuildOptions,
    progress: &dyn Progress,
    finish: impl FnOnce(&Path) -> Result<(), BuildError>,
) -> Result<StoredLayer, BuildError> {
    let build = BuildDir::new(store, "debootstrap")?;
    let root = build.path().join("root");
    debootstrap_tree(recipe, &root, progress)?;
    finish(&root)?;
    mkfs_into_store(store, &root, options, progress)
}

/// The tree of a build at `root` (made by debootstrap): the system, cleaned
/// of caches and logs, with the user added. Also the start of the full
/// VM's base image (`vm::base_image`).
pub(crate) fn debootstrap_tree(recipe: &DebootstrapRecipe, root: &Path, progress: &dyn Progress) -> Result<(), BuildError> {
    recipe.validate()?;
    progress.stage(&format!("debootstrap {} from {}", recipe.suite, recipe.mirror));
    let mut cmd = Command::new(DEBOOTSTRAP.name);
    cmd.arg("--variant=minbase");
    if !recipe.include.is_empty() {
        cmd.arg(format!("--include={}", recipe.include.join(",")));
    }
    cmd.arg(&recipe.suite).arg(root).arg(&recipe.mirror);
    // A fixed, predictable environment: no host locale or proxy surprises
    // inside the chroot's maintainer scripts.
    cmd.env("DEBIAN_FRONTEND", "noninteractive").env("LC_ALL", "C");
    tool::run(&DEBOOTSTRAP, cmd, Some(progress))?;

    progress.stage("removing apt caches, package lists and logs");
    clean(root)?;
    if recipe.add_user {
        progress.stage("adding user `user` (1000)");
        add_user(root, &sandbox_user("/bin/bash"))?;
    }
    super::set_mode(root, 0o755)
}

/// What the image does not need at run time: downloaded .debs, apt's binary
/// caches and package lists (an `apt-get update` in the sandbox restores
/// them), every log the installation wrote, and whatever the packages'
/// scripts left in the temporary directories (a JDK's postinst runs java,
/// which leaves `/tmp/hsperfdata_root`).
fn clean(root: &Path) -> Result<(), BuildError> {
    empty_dir(&root.join("tmp"))?;
    empty_dir(&root.join("var/tmp"))?;
    let cache = root.join("var/cache/apt");
    remove_files(&cache.join("archives"), true, |_| true)?;
    remove_files(&cache, false, |name| name.ends_with(".bin"))?;
    remove_files(&root.join("var/lib/apt/lists"), true, |name| name != "lock")?;
    remove_files(&root.join("var/log"), true, |_| true)?;
    remove_files(&root.join("var/cache/debconf"), false, |name| name.ends_with("-old"))?;
    remove_files(&root.join("var/lib/dpkg"), false, |name| name.ends_with("-old"))?;
    Ok(())
}

/// Deletes every entry of `dir` (never following a symbolic link); `dir`
/// itself stays.
fn empty_dir(dir: &Path) -> Result<(), BuildError> {
    for (path, kind) in entries(dir)? {
        let removed = if kind.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
        removed.map_err(io_err("removing", &path))?;
    }
    Ok(())
}

/// Deletes non-directory entries of `dir` whose name `matches` (the
/// directory layout itself stays: apt and dpkg expect it).
fn remove_files(dir: &Path, recursive: bool, matches: fn(&str) -> bool) -> Result<(), BuildError> {
    for (path, kind) in entries(dir)? {
        if kind.is_dir() {
            if recursive {
                remove_files(&path, true, matches)?;
            }
        } else if path.file_name().and_then(|n| n.to_str()).is_some_and(matches) {
            fs::remove_file(&path).map_err(io_err("removing", &path))?;
        }
    }
    Ok(())
}

/// The entries of `dir` and their types (not following symbolic links);
/// none if it does not exist.
fn entries(dir: &Path) -> Result<Vec<(std::path::PathBuf, fs::FileType)>, BuildError> {
    let listing = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("listing", dir)(e)),
    };
    let mut out = Vec::new();
    for entry in listing {
        let entry = entry.map_err(io_err("listing", dir))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io_err("reading", &path))?;
        out.push((path, kind));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_validation() {
        let mut r = DebootstrapRecipe::new("bookworm");
        r.include = vec!["python3".into(), "libstdc++6".into(), "g++-12".into()];
        r.validate().unwrap();
        for bad in ["--foreign", "", "Bookworm", "a b"] {
            let mut r = DebootstrapRecipe::new("bookworm");
            r.suite = bad.into();
            assert!(matches!(r.validate(), Err(BuildError::InvalidRecipe(_))), "{bad}");
        }
        let mut r = DebootstrapRecipe::new("bookworm");
        r.include = vec!["--print-debs".into()];
        assert!(r.validate().is_err());
        for bad in ["deb.debian.org/debian", "ftp://x", "http://a b"] {
            let mut r = DebootstrapRecipe::new("bookworm");
            r.mirror = bad.into();
            assert!(r.validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn clean_keeps_layout_and_lock() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for dir in ["var/cache/apt/archives/partial", "var/lib/apt/lists/partial", "var/log/apt", "tmp/hsperfdata_root", "var/tmp"] {
            fs::create_dir_all(r.join(dir)).unwrap();
        }
        for file in [
            "var/cache/apt/archives/a.deb",
            "var/cache/apt/archives/lock",
            "var/cache/apt/pkgcache.bin",
            "var/lib/apt/lists/lock",
            "var/lib/apt/lists/deb.debian.org_Packages",
            "var/log/dpkg.log",
            "var/log/apt/history.log",
            "tmp/hsperfdata_root/123",
            "var/tmp/x",
        ] {
            fs::write(r.join(file), "x").unwrap();
        }
        std::os::unix::fs::symlink("/etc", r.join("tmp/link")).unwrap();
        clean(r).unwrap();
        for dir in ["tmp", "var/tmp"] {
            assert_eq!(fs::read_dir(r.join(dir)).unwrap().count(), 0, "{dir} is emptied");
        }
        assert!(r.join("var/lib/apt/lists/lock").exists());
        assert!(r.join("var/lib/apt/lists/partial").is_dir());
        assert!(r.join("var/cache/apt/archives/partial").is_dir());
        assert!(r.join("var/log/apt").is_dir());
        for gone in [
            "var/cache/apt/archives/a.deb",
            "var/cache/apt/pkgcache.bin",
            "var/lib/apt/lists/deb.debian.org_Packages",
            "var/log/dpkg.log",
            "var/log/apt/history.log",
        ] {
            assert!(!r.join(gone).exists(), "{gone}");
        }
    }
}
