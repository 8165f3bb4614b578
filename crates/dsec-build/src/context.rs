//! The build context: the tar archive a client sends, unpacked into a
//! private directory, with what `.dockerignore` excludes removed, so that
//! every `COPY` sees exactly the files the build may use.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::{io_err, BuildError};
use crate::ignore::{self, IgnoreRules};

/// A context file matched by a `COPY` source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Relative to the context root, `/`-separated; empty: the root itself.
    pub rel: String,
    pub path: PathBuf,
    pub is_dir: bool,
}

pub struct Context {
    dir: tempfile::TempDir,
    dockerfile: String,
}

impl Context {
    /// Unpacks `archive` (a tar, gzip-compressed or not) under `scratch`,
    /// reads the Dockerfile at `dockerfile` (relative to the context root)
    /// and removes what `.dockerignore` (or `<dockerfile>.dockerignore`)
    /// excludes.
    pub fn unpack(archive: impl Read, scratch: &Path, dockerfile: &str) -> Result<Context, BuildError> {
        fs::create_dir_all(scratch).map_err(io_err("creating", scratch))?;
        let dir = tempfile::Builder::new().prefix("context-").tempdir_in(scratch).map_err(io_err("creating a directory in", scratch))?;
        let mut reader = BufReader::new(archive);
        let gzip = reader.fill_buf().map_err(io_err("reading the context of", dir.path()))?.starts_with(&[0x1f, 0x8b]);
        let reader: Box<dyn Read> = if gzip { Box::new(flate2::read::GzDecoder::new(reader)) } else { Box::new(reader) };
        let mut tar = tar::Archive::new(reader);
        tar.set_preserve_permissions(true);
        tar.set_preserve_ownerships(false);
        tar.set_overwrite(true);
        // `unpack` refuses entries that would land outside the directory
        // (`..`, absolute names, links out of it).
        tar.unpack(dir.path()).map_err(|e| BuildError::Invalid(format!("the build context is not a readable tar archive: {e}")))?;

        let rel = clean_relative(dockerfile)
            .ok_or_else(|| BuildError::Invalid(format!("Dockerfile path {dockerfile:?} leaves the build context")))?;
        let path = dir.path().join(&rel);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(BuildError::Invalid(format!("no Dockerfile at {rel:?} in the build context")));
            }
            Err(e) => return Err(io_err("reading", &path)(e)),
        };
        let specific = dir.path().join(format!("{rel}.dockerignore"));
        let general = dir.path().join(".dockerignore");
        let rules = [specific, general].iter().find_map(|p| fs::read_to_string(p).ok()).map(|t| ignore::parse(&t));
        if let Some(rules) = rules {
            prune(dir.path(), "", &rules)?;
        }
        Ok(Context { dir, dockerfile: text })
    }

    pub fn dockerfile(&self) -> &str {
        &self.dockerfile
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The context entries one `COPY` source names: a path (which must
    /// exist), or a pattern with wildcards (which must match something).
    pub fn sources(&self, word: &str) -> Result<Vec<Source>, String> {
        let rel = clean_relative(word).ok_or_else(|| format!("{word:?} is outside the build context"))?;
        if !ignore::has_wildcards(&rel) {
            let path = self.dir.path().join(&rel);
            let meta =
                fs::symlink_metadata(&path).map_err(|_| format!("{word:?} is not in the build context (or .dockerignore excludes it)"))?;
            return Ok(vec![Source { rel, path, is_dir: meta.is_dir() }]);
        }
        let mut found = Vec::new();
        walk(self.dir.path(), "", &mut |r, p, is_dir| {
            if ignore::glob_match(&rel, r) {
                found.push(Source { rel: r.to_string(), path: p.to_path_buf(), is_dir });
                return false; // a matched directory is copied whole
            }
            true
        })
        .map_err(|e| e.to_string())?;
        if found.is_empty() {
            return Err(format!("no file in the build context matches {word:?}"));
        }
        found.sort_by(|a, b| a.rel.cmp(&b.rel));
        Ok(found)
    }
}

/// `word` as a clean path relative to the context root (a leading `/` and
/// `.` components dropped, `..` applied), or `None` if it climbs out.
pub fn clean_relative(word: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for c in word.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            c => parts.push(c),
        }
    }
    Some(parts.join("/"))
}

/// Walks `dir` depth first; `visit(rel, path, is_dir)` returns whether to
/// descend into a directory.
fn walk(dir: &Path, prefix: &str, visit: &mut dyn FnMut(&str, &Path, bool) -> bool) -> Result<(), BuildError> {
    let mut entries: Vec<_> =
        fs::read_dir(dir).map_err(io_err("listing", dir))?.collect::<Result<_, _>>().map_err(io_err("listing", dir))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let is_dir = e.file_type().map_err(io_err("reading", &e.path()))?.is_dir();
        if visit(&rel, &e.path(), is_dir) && is_dir {
            walk(&e.path(), &rel, visit)?;
        }
    }
    Ok(())
}

/// Removes what `rules` exclude below `dir`; an excluded directory that an
/// exception may re-include something of is descended into instead.
fn prune(dir: &Path, prefix: &str, rules: &IgnoreRules) -> Result<(), BuildError> {
    for e in fs::read_dir(dir).map_err(io_err("listing", dir))? {
        let e = e.map_err(io_err("listing", dir))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let path = e.path();
        let is_dir = e.file_type().map_err(io_err("reading", &path))?.is_dir();
        let excluded = rules.is_excluded(&rel);
        if is_dir && (!excluded || rules.may_contain_included(&rel)) {
            prune(&path, &rel, rules)?;
        } else if excluded && is_dir {
            fs::remove_dir_all(&path).map_err(io_err("removing", &path))?;
        } else if excluded {
            fs::remove_file(&path).map_err(io_err("removing", &path))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(files: &[(&str, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, content) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(content.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, content.as_bytes()).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn paths_are_cleaned_and_may_not_leave_the_context() {
        assert_eq!(clean_relative("/a/./b/../c/").as_deref(), Some("a/c"));
        assert_eq!(clean_relative(".").as_deref(), Some(""));
        assert_eq!(clean_relative("../x"), None);
        assert_eq!(clean_relative("a/../../x"), None);
    }

    #[test]
    fn dockerignore_removes_files_but_not_exceptions() {
        let scratch = tempfile::tempdir().unwrap();
        let tar = context(&[
            ("Dockerfile", "FROM scratch\n"),
            (".dockerignore", "*.log\nbuild/\n!build/keep.txt\n"),
            ("a.log", "x"),
            ("src/main.py", "print(1)"),
            ("build/out.o", "x"),
            ("build/keep.txt", "k"),
        ]);
        let ctx = Context::unpack(&tar[..], scratch.path(), "Dockerfile").unwrap();
        assert_eq!(ctx.dockerfile(), "FROM scratch\n");
        assert!(!ctx.root().join("a.log").exists());
        assert!(!ctx.root().join("build/out.o").exists());
        assert!(ctx.root().join("build/keep.txt").exists());
        assert!(ctx.root().join("src/main.py").exists());
        assert!(ctx.sources("a.log").is_err());
        let found = ctx.sources("src/*.py").unwrap();
        assert_eq!(found.iter().map(|s| s.rel.as_str()).collect::<Vec<_>>(), ["src/main.py"]);
        assert!(ctx.sources("../etc/passwd").is_err());
        assert!(ctx.sources("*.md").is_err());
    }

    #[test]
    fn a_missing_dockerfile_is_a_clear_error() {
        let scratch = tempfile::tempdir().unwrap();
        let tar = context(&[("x", "y")]);
        let err = Context::unpack(&tar[..], scratch.path(), "Dockerfile").err().unwrap();
        assert!(err.to_string().contains("no Dockerfile"), "{err}");
        let err = Context::unpack(&b"not a tar at all, not even close"[..], scratch.path(), "Dockerfile").err().unwrap();
        assert!(err.to_string().contains("tar"), "{err}");
    }
}
