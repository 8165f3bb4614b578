//! `pack_diff`: a running sandbox's changes (its overlay upper directory)
//! captured as a new read-only layer.
//!
//! The upper directory of an overlay holds exactly what the sandbox
//! changed: new and modified files (whole), overlayfs whiteouts (character
//! devices 0:0) for deletions, and `trusted.overlay.opaque` on directories
//! that replaced a lower one. Copied as they are, they form a layer that,
//! stacked on the sandbox's own layers, shows the sandbox's filesystem.
//!
//! Packs chain: each pack keeps an index of what the upper held (`PackIndex`),
//! and the next pack copies only entries whose inode changed since (ctime,
//! size, inode number), plus a whiteout for each path that has disappeared
//! from the upper since (it would otherwise still show through the previous
//! pack's layer).
//!
//! Residue (shell history, /tmp, caches, logs) is scrubbed from the layer,
//! never from the sandbox: entries matching the scrub patterns are skipped.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{makedev, mknodat, FileType, Mode, Timespec, Timestamps, XattrFlags, CWD};

use crate::build::{io_err, mkfs_into_store, BuildDir, BuildError, BuildOptions};
use crate::progress::Progress;
use crate::store::{ImageStore, StoredLayer};

/// What the scrub list removes by default: residue of building an
/// environment that must not leak into the tasks that start from it.
pub const DEFAULT_SCRUB: &[&str] = &[
    "/tmp/*",
    "/var/tmp/*",
    "/root/.bash_history",
    "/root/.python_history",
    "/root/.lesshst",
    "/root/.viminfo",
    "/root/.cache",
    "/home/*/.bash_history",
    "/home/*/.python_history",
    "/home/*/.cache",
    "/var/log/*",
    "/var/cache/apt/*",
    "/var/lib/apt/lists/*",
];

const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// Identity of an upper entry at a pack: a change to content or metadata
/// changes its ctime; a replacement changes its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    ctime_ns: i128,
    size: u64,
}

impl Stamp {
    fn of(m: &fs::Metadata) -> Stamp {
        if m.file_type().is_char_device() && m.rdev() == 0 {
            // overlayfs links every new whiteout to one shared inode, which
            // bumps the ctime of all of them: a whiteout is only a whiteout.
            return Stamp { ino: 0, ctime_ns: 0, size: 0 };
        }
        Stamp { ino: m.ino(), ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128, size: m.size() }
    }
}

/// What the upper held at the last pack (scrubbed entries excluded).
#[derive(Debug, Clone, Default)]
pub struct PackIndex {
    entries: HashMap<PathBuf, Stamp>,
}

impl PackIndex {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Counts of one pack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiffStats {
    /// Files, links and directories copied into the layer.
    pub entries: u64,
    /// Bytes of file content copied.
    pub bytes: u64,
    /// Deletions recorded (whiteouts copied or made).
    pub whiteouts: u64,
    /// Entries left out by the scrub list.
    pub scrubbed: u64,
}

/// A scrub pattern: absolute, `/`-separated, `*` matching within one path
/// component; a match removes the entry and everything under it.
#[derive(Debug, Clone)]
pub struct ScrubPattern(Vec<String>);

impl ScrubPattern {
    pub fn parse(s: &str) -> Result<ScrubPattern, String> {
        let Some(rest) = s.strip_prefix('/') else {
            return Err(format!("scrub pattern {s:?} is not an absolute path"));
        };
        let parts: Vec<String> = rest.split('/').filter(|p| !p.is_empty()).map(str::to_string).collect();
        if parts.is_empty() || parts.iter().any(|p| p == ".." || p == ".") {
            return Err(format!("scrub pattern {s:?} must name something below /"));
        }
        Ok(ScrubPattern(parts))
    }

    fn matches(&self, rel: &Path) -> bool {
        let comps: Vec<&OsStr> = rel.iter().collect();
        comps.len() == self.0.len() && self.0.iter().zip(comps).all(|(p, c)| glob_component(p.as_bytes(), c.as_bytes()))
    }
}

/// `*` matches any run of bytes; everything else matches itself.
fn glob_component(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| glob_component(rest, &name[i..])),
        Some((c, rest)) => name.first() == Some(c) && glob_component(rest, &name[1..]),
    }
}

/// The changes collected into a scratch root, before mkfs.
pub struct PackScratch {
    build: BuildDir,
    root: PathBuf,
    pub stats: DiffStats,
    pub index: PackIndex,
}

impl PackScratch {
    /// Copies the upper's changes since `previous` (everything, for the
    /// first pack) into a scratch root in `scratch` (default: the store's
    /// temp space). The sandbox should be frozen meanwhile, for a
    /// consistent view. A scratch directory on the upper's own filesystem
    /// makes the copy cheap: file creation there is what the sandbox's
    /// writes already cost, and a btrfs clones file data instead of
    /// copying it.
    pub fn collect(
        store: &ImageStore,
        scratch: Option<&Path>,
        upper: &Path,
        previous: Option<&PackIndex>,
        scrub: &[ScrubPattern],
    ) -> Result<PackScratch, BuildError> {
        let build = match scratch {
            Some(dir) => BuildDir::new_in(dir, "pack")?,
            None => BuildDir::new(store, "pack")?,
        };
        let root = build.make_root()?;
        let mut walk =
            Walk { upper, root: &root, previous, scrub, index: PackIndex::default(), stats: DiffStats::default(), links: HashMap::new() };
        walk.dir(Path::new("")).map_err(io_err("copying the writable layer", upper))?;
        let (index, mut stats) = (walk.index, walk.stats);
        // Gone since the previous pack: hide them from its layer.
        if let Some(prev) = previous {
            let mut gone: Vec<&PathBuf> = prev.entries.keys().filter(|p| !index.entries.contains_key(*p)).collect();
            gone.sort();
            let mut covered: Option<&PathBuf> = None;
            for path in gone {
                // A whiteout of a directory hides its subtree already.
                if covered.is_some_and(|c| path.starts_with(c)) {
                    continue;
                }
                let target = root.join(path);
                if target.symlink_metadata().is_ok() {
                    continue; // something new of another type is there now
                }
                if let Some(parent) = target.parent() {
                    fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
                }
                make_whiteout(&target).map_err(io_err("making a whiteout at", &target))?;
                stats.whiteouts += 1;
                covered = Some(path);
            }
        }
        Ok(PackScratch { build, root, stats, index })
    }

    /// Turns the scratch root into a layer in the store.
    pub fn build(self, store: &ImageStore, options: &BuildOptions, progress: &dyn Progress) -> Result<StoredLayer, BuildError> {
        let layer = mkfs_into_store(store, &self.root, options, progress)?;
        drop(self.build);
        Ok(layer)
    }
}

struct Walk<'a> {
    upper: &'a Path,
    root: &'a Path,
    previous: Option<&'a PackIndex>,
    scrub: &'a [ScrubPattern],
    index: PackIndex,
    stats: DiffStats,
    /// Hard links inside the upper, by inode: copied once, linked after.
    links: HashMap<u64, PathBuf>,
}

impl Walk<'_> {
    /// Walks `rel` (a directory of the upper); returns whether anything
    /// under it went into the layer.
    fn dir(&mut self, rel: &Path) -> io::Result<bool> {
        let mut copied_any = false;
        let mut names: Vec<_> = fs::read_dir(self.upper.join(rel))?.collect::<Result<_, _>>()?;
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let child = rel.join(e.file_name());
            if self.scrub.iter().any(|p| p.matches(&child)) {
                self.stats.scrubbed += 1;
                continue;
            }
            let src = self.upper.join(&child);
            let meta = src.symlink_metadata()?;
            let stamp = Stamp::of(&meta);
            let known = self.previous.and_then(|p| p.entries.get(&child));
            let changed = known != Some(&stamp);
            // A directory that existed at the previous pack keeps the
            // opaque marker that pack recorded; only a new one (a replaced
            // directory) must hide the layers below again.
            let is_new = known.map(|s| s.ino) != Some(stamp.ino);
            self.index.entries.insert(child.clone(), stamp);
            if meta.is_dir() {
                if changed {
                    self.copy_dir(&child, &src, &meta, is_new)?;
                }
                let below = self.dir(&child)?;
                if changed || below {
                    // Content went in: give it its own mtime back.
                    set_times(&self.root.join(&child), &meta)?;
                    copied_any = true;
                }
            } else if changed {
                self.copy_leaf(&child, &src, &meta)?;
                copied_any = true;
            }
        }
        Ok(copied_any)
    }

    /// Makes sure the parents of `rel` exist in the scratch root (copied
    /// with their metadata from the upper).
    fn parents(&mut self, rel: &Path) -> io::Result<()> {
        let mut cur = PathBuf::new();
        let Some(parent) = rel.parent() else { return Ok(()) };
        for c in parent.iter() {
            cur.push(c);
            let dst = self.root.join(&cur);
            if dst.symlink_metadata().is_err() {
                let src = self.upper.join(&cur);
                let meta = src.symlink_metadata()?;
                // Only there to hold a changed entry: never opaque.
                self.copy_dir(&cur, &src, &meta, false)?;
            }
        }
        Ok(())
    }

    fn copy_dir(&mut self, rel: &Path, src: &Path, meta: &fs::Metadata, opaque: bool) -> io::Result<()> {
        self.parents(rel)?;
        let dst = self.root.join(rel);
        if dst.symlink_metadata().is_err() {
            fs::create_dir(&dst)?;
            self.stats.entries += 1;
        }
        copy_owner_mode(&dst, meta)?;
        copy_xattrs(src, &dst, opaque)?;
        Ok(())
    }

    fn copy_leaf(&mut self, rel: &Path, src: &Path, meta: &fs::Metadata) -> io::Result<()> {
        self.parents(rel)?;
        let dst = self.root.join(rel);
        let ft = meta.file_type();
        if ft.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(src)?, &dst)?;
            std::os::unix::fs::lchown(&dst, Some(meta.uid()), Some(meta.gid()))?;
            self.stats.entries += 1;
            return Ok(());
        }
        if ft.is_char_device() && meta.rdev() == 0 {
            make_whiteout(&dst)?;
            self.stats.whiteouts += 1;
            return Ok(());
        }
        if ft.is_file() {
            if meta.nlink() > 1 {
                if let Some(first) = self.links.get(&meta.ino()) {
                    fs::hard_link(self.root.join(first), &dst)?;
                    return Ok(());
                }
                self.links.insert(meta.ino(), rel.to_path_buf());
            }
            fs::copy(src, &dst)?;
            self.stats.bytes += meta.len();
        } else {
            // Device nodes, fifos and sockets keep their type (overlay
            // mounts are nodev, so a device node opens nothing).
            let kind = FileType::from_raw_mode(meta.mode());
            mknodat(CWD, &dst, kind, Mode::from_raw_mode(meta.mode() & 0o7777), meta.rdev())?;
        }
        self.stats.entries += 1;
        copy_owner_mode(&dst, meta)?;
        copy_xattrs(src, &dst, false)?;
        set_times(&dst, meta)?;
        Ok(())
    }
}

fn uid(m: &fs::Metadata) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(m.uid())
}

fn gid(m: &fs::Metadata) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(m.gid())
}

fn copy_owner_mode(dst: &Path, meta: &fs::Metadata) -> io::Result<()> {
    rustix::fs::chown(dst, Some(uid(meta)), Some(gid(meta)))?;
    // After chown, which clears setuid/setgid bits.
    fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
}

fn set_times(dst: &Path, meta: &fs::Metadata) -> io::Result<()> {
    let mtime = Timespec { tv_sec: meta.mtime(), tv_nsec: meta.mtime_nsec() as _ };
    let times = Timestamps { last_access: mtime, last_modification: mtime };
    rustix::fs::utimensat(CWD, dst, &times, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// Copies the xattrs a layer should carry: the opaque marker (if asked)
/// and the ordinary namespaces; overlayfs' other bookkeeping stays behind.
fn copy_xattrs(src: &Path, dst: &Path, opaque: bool) -> io::Result<()> {
    let mut names = vec![0u8; 4096];
    let n = match rustix::fs::llistxattr(src, &mut names) {
        Ok(n) => n,
        Err(rustix::io::Errno::NOTSUP) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name_str = String::from_utf8_lossy(name);
        let keep = (opaque && name_str == OPAQUE_XATTR) || name_str.starts_with("user.") || name_str.starts_with("security.capability");
        if !keep {
            continue;
        }
        let mut value = vec![0u8; 65536];
        let len = rustix::fs::lgetxattr(src, name, &mut value)?;
        rustix::fs::lsetxattr(dst, name, &value[..len], XattrFlags::empty())?;
    }
    Ok(())
}

fn make_whiteout(path: &Path) -> io::Result<()> {
    mknodat(CWD, path, FileType::CharacterDevice, Mode::empty(), makedev(0, 0))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_patterns() {
        let p = ScrubPattern::parse("/home/*/.bash_history").unwrap();
        assert!(p.matches(Path::new("home/alice/.bash_history")));
        assert!(!p.matches(Path::new("home/alice/x/.bash_history")));
        let t = ScrubPattern::parse("/tmp/*").unwrap();
        assert!(t.matches(Path::new("tmp/build.log")));
        assert!(!t.matches(Path::new("tmp")));
        let g = ScrubPattern::parse("/var/log/*.log").unwrap();
        assert!(g.matches(Path::new("var/log/apt.log")));
        assert!(!g.matches(Path::new("var/log/apt.txt")));
        assert!(ScrubPattern::parse("tmp").is_err());
        assert!(ScrubPattern::parse("/").is_err());
        assert!(ScrubPattern::parse("/a/../b").is_err());
        for d in DEFAULT_SCRUB {
            ScrubPattern::parse(d).unwrap();
        }
    }
}
