//! `COPY` and `ADD`: where each source lands, and the tar archive that puts
//! it there (ownership and modes as the instruction says), which the
//! sandbox's agent extracts all or nothing.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::error::{io_err, BuildError};

/// Who copied files belong to (`--chown`; default root).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// Where a `COPY`'s entries go: the directory the archive is extracted
/// into, and the prefix of every entry's name inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Absolute.
    pub target: String,
    /// `""` or one name: the destination directory's own name when the
    /// destination is a directory (so that a new one is created with the
    /// instruction's owner), else empty.
    pub prefix: String,
    /// The destination is a directory: each source goes inside it.
    pub into_dir: bool,
    /// The file name of a single-file destination.
    pub file_name: Option<String>,
}

impl Layout {
    /// `dest` is absolute and clean; `into_dir`: it names a directory.
    pub fn new(dest: &str, into_dir: bool) -> Layout {
        let (parent, name) = split(dest);
        if into_dir {
            match name {
                None => Layout { target: "/".into(), prefix: String::new(), into_dir, file_name: None },
                Some(n) => Layout { target: parent, prefix: n, into_dir, file_name: None },
            }
        } else {
            Layout { target: parent, prefix: String::new(), into_dir, file_name: name }
        }
    }

    /// The archive name of a source's entry: `inner` is the path below a
    /// directory source (empty for the source itself), `base` the source's
    /// own name.
    pub fn name(&self, source_is_dir: bool, base: &str, inner: &str) -> String {
        let mut parts: Vec<&str> = Vec::new();
        if !self.prefix.is_empty() {
            parts.push(&self.prefix);
        }
        if !source_is_dir {
            match (&self.file_name, self.into_dir) {
                (Some(f), false) => parts.push(f),
                _ => parts.push(base),
            }
        }
        if !inner.is_empty() {
            parts.push(inner);
        }
        parts.join("/")
    }

    /// The archive name of `inner`, a path below a directory source (empty:
    /// the source itself, which the destination directory stands for).
    pub fn inside(&self, inner: &str) -> String {
        if inner.is_empty() {
            String::new()
        } else {
            self.name(true, "", inner)
        }
    }
}

/// `/a/b` -> (`/a`, Some(`b`)); `/` -> (`/`, None).
fn split(path: &str) -> (String, Option<String>) {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        None => ("/".into(), None),
        Some((_, "")) => ("/".into(), None),
        Some(("", name)) => ("/".into(), Some(name.to_string())),
        Some((parent, name)) => (parent.to_string(), Some(name.to_string())),
    }
}

/// Writes a `COPY`'s archive.
pub struct ArchiveOut {
    tar: tar::Builder<Vec<u8>>,
    owner: Owner,
    chmod: Option<u32>,
}

impl ArchiveOut {
    pub fn new(owner: Owner, chmod: Option<u32>) -> Self {
        let mut tar = tar::Builder::new(Vec::new());
        tar.follow_symlinks(false);
        ArchiveOut { tar, owner, chmod }
    }

    fn header(&self, kind: tar::EntryType, mode: u32, size: u64, mtime: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(self.chmod.unwrap_or(mode & 0o7777));
        h.set_uid(self.owner.uid as u64);
        h.set_gid(self.owner.gid as u64);
        h.set_size(size);
        h.set_mtime(mtime);
        h
    }

    /// A directory entry (the destination directory itself, when new).
    pub fn dir(&mut self, name: &str, mode: u32) -> Result<(), BuildError> {
        let mut h = self.header(tar::EntryType::Directory, mode, 0, now());
        self.tar.append_data(&mut h, format!("{name}/"), std::io::empty()).map_err(archive_err)
    }

    /// `path` (a file, a directory with everything below it, or a symlink)
    /// as `name`.
    pub fn add_path(&mut self, name: &str, path: &Path) -> Result<(), BuildError> {
        let meta = fs::symlink_metadata(path).map_err(io_err("reading", path))?;
        let mtime = meta.mtime().max(0) as u64;
        let ft = meta.file_type();
        if ft.is_symlink() {
            let target = fs::read_link(path).map_err(io_err("reading", path))?;
            let mut h = self.header(tar::EntryType::Symlink, 0o777, 0, mtime);
            // A link's own mode means nothing; --chmod does not apply.
            h.set_mode(0o777);
            return self.tar.append_link(&mut h, name, target).map_err(archive_err);
        }
        if ft.is_dir() {
            if !name.is_empty() {
                let mut h = self.header(tar::EntryType::Directory, meta.permissions().mode(), 0, mtime);
                self.tar.append_data(&mut h, format!("{name}/"), std::io::empty()).map_err(archive_err)?;
            }
            return self.add_contents(name, path);
        }
        if ft.is_file() {
            let file = fs::File::open(path).map_err(io_err("opening", path))?;
            let mut h = self.header(tar::EntryType::Regular, meta.permissions().mode(), meta.len(), mtime);
            return self.tar.append_data(&mut h, name, file).map_err(archive_err);
        }
        // Sockets, fifos and devices are not part of an image's content.
        Ok(())
    }

    /// What directory `dir` holds (not the directory itself), under `name`
    /// (`""`: at the top of the archive).
    pub fn add_contents(&mut self, name: &str, dir: &Path) -> Result<(), BuildError> {
        let mut children: Vec<_> =
            fs::read_dir(dir).map_err(io_err("listing", dir))?.collect::<Result<_, _>>().map_err(io_err("listing", dir))?;
        children.sort_by_key(|e| e.file_name());
        for c in children {
            let child = c.file_name().to_string_lossy().into_owned();
            let child_name = if name.is_empty() { child } else { format!("{name}/{child}") };
            self.add_path(&child_name, &c.path())?;
        }
        Ok(())
    }

    /// Entries of an archive taken from a sandbox (`COPY --from`): each
    /// renamed by `rename(inner)` (`inner` relative to the source; empty
    /// for a single file), ownership and modes as for context files.
    pub fn add_archive(&mut self, archive: &[u8], rename: &dyn Fn(&str) -> String) -> Result<(), BuildError> {
        let mut input = tar::Archive::new(archive);
        for entry in input.entries().map_err(archive_err)? {
            let mut entry = entry.map_err(archive_err)?;
            let inner = entry.path().map_err(archive_err)?.to_string_lossy().trim_end_matches('/').to_string();
            let h = entry.header().clone();
            let name = rename(&inner);
            let mode = h.mode().map_err(archive_err)?;
            let mtime = h.mtime().unwrap_or(0);
            match h.entry_type() {
                tar::EntryType::Directory if !name.is_empty() => {
                    let mut out = self.header(tar::EntryType::Directory, mode, 0, mtime);
                    self.tar.append_data(&mut out, format!("{name}/"), std::io::empty()).map_err(archive_err)?;
                }
                tar::EntryType::Symlink => {
                    let target = entry.link_name().map_err(archive_err)?.map(|l| l.into_owned()).unwrap_or_default();
                    let mut out = self.header(tar::EntryType::Symlink, 0o777, 0, mtime);
                    out.set_mode(0o777);
                    self.tar.append_link(&mut out, &name, target).map_err(archive_err)?;
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let size = entry.size();
                    let mut data = Vec::with_capacity(size as usize);
                    entry.read_to_end(&mut data).map_err(archive_err)?;
                    let mut out = self.header(tar::EntryType::Regular, mode, size, mtime);
                    self.tar.append_data(&mut out, &name, &data[..]).map_err(archive_err)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub fn finish(self) -> Result<Vec<u8>, BuildError> {
        self.tar.into_inner().map_err(archive_err)
    }
}

fn archive_err(e: std::io::Error) -> BuildError {
    BuildError::Store(format!("writing a COPY archive: {e}"))
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `--chmod=0755` (octal).
pub fn parse_chmod(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8).ok().filter(|m| *m <= 0o7777).ok_or_else(|| format!("--chmod={s} is not an octal mode"))
}

/// Resolves `--chown=user[:group]` against the image's `/etc/passwd` and
/// `/etc/group` (numbers need neither). A user without a group gets the
/// group of the same number, as Docker does.
pub fn resolve_owner(spec: &str, passwd: &str, group: &str) -> Result<Owner, String> {
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let lookup = |table: &str, name: &str, what: &str| -> Result<u32, String> {
        if let Ok(n) = name.parse::<u32>() {
            return Ok(n);
        }
        table
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.len() > 2 && f[0] == name)
            .and_then(|f| f[2].parse().ok())
            .ok_or_else(|| format!("--chown: no {what} {name:?} in the image"))
    };
    let uid = lookup(passwd, u, "user")?;
    let gid = match g {
        Some(g) if !g.is_empty() => lookup(group, g, "group")?,
        _ => uid,
    };
    Ok(Owner { uid, gid })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_land_where_docker_puts_them() {
        // COPY a.txt /dst/  -> /dst/a.txt, with /dst itself an entry.
        let l = Layout::new("/dst", true);
        assert_eq!((l.target.as_str(), l.prefix.as_str()), ("/", "dst"));
        assert_eq!(l.name(false, "a.txt", ""), "dst/a.txt");
        // COPY dir /dst/ -> the directory's contents in /dst.
        assert_eq!(l.name(true, "dir", "x/y"), "dst/x/y");
        // COPY a.txt /etc/b.conf -> that file.
        let l = Layout::new("/etc/b.conf", false);
        assert_eq!((l.target.as_str(), l.prefix.as_str()), ("/etc", ""));
        assert_eq!(l.name(false, "a.txt", ""), "b.conf");
        // COPY . /
        let l = Layout::new("/", true);
        assert_eq!(l.target, "/");
        assert_eq!(l.name(true, "", "src/main.py"), "src/main.py");
    }

    #[test]
    fn owners_resolve_by_name_or_number() {
        let passwd = "root:x:0:0::/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\n";
        let group = "root:x:0:\nagent:x:1000:\nstaff:x:50:\n";
        assert_eq!(resolve_owner("agent", passwd, group).unwrap(), Owner { uid: 1000, gid: 1000 });
        assert_eq!(resolve_owner("agent:staff", passwd, group).unwrap(), Owner { uid: 1000, gid: 50 });
        assert_eq!(resolve_owner("12:34", "", "").unwrap(), Owner { uid: 12, gid: 34 });
        assert_eq!(resolve_owner("7", "", "").unwrap(), Owner { uid: 7, gid: 7 });
        assert!(resolve_owner("nobody", passwd, group).unwrap_err().contains("no user"));
        assert_eq!(parse_chmod("755").unwrap(), 0o755);
        assert!(parse_chmod("abc").is_err());
    }

    #[test]
    fn an_archive_from_a_sandbox_is_renamed_and_owned() {
        let mut src = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o755);
        h.set_cksum();
        src.append_data(&mut h, "bin/app", &b"hi"[..]).unwrap();
        let src = src.into_inner().unwrap();
        let mut out = ArchiveOut::new(Owner { uid: 5, gid: 6 }, None);
        out.add_archive(&src, &|inner| format!("usr/local/{inner}")).unwrap();
        let bytes = out.finish().unwrap();
        let mut a = tar::Archive::new(&bytes[..]);
        let e = a.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(e.path().unwrap().to_str().unwrap(), "usr/local/bin/app");
        assert_eq!((e.header().uid().unwrap(), e.header().gid().unwrap(), e.header().mode().unwrap()), (5, 6, 0o755));
    }
}
