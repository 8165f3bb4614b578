//! Sandbox paths and their confined resolution.
//!
//! Every path the edge names is resolved relative to the agent's root fd
//! with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS): symlinks are
//! followed as if the root were `/` (an absolute or `../..` link cannot climb
//! out) and /proc magic links (`/proc/self/root`, `/proc/1/fd/3`...) are
//! refused outright. In container mode the root is `/` after pivot_root; in
//! plain mode it is the `--root` directory.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use dsec_agent_proto::{AgentError, ErrorKind};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::errors::os_err;

/// A validated absolute sandbox path, kept as its normalised components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPath {
    /// Components joined by `/`, without a leading `/`; empty for the root.
    rel: String,
}

impl SandboxPath {
    /// Accepts absolute paths only; `.` and empty components are dropped,
    /// and any `..` component is refused (rather than normalised away) so a
    /// caller never gets a different file than the one it named.
    pub fn parse(path: &str) -> Result<Self, AgentError> {
        if !path.starts_with('/') {
            return Err(AgentError::new(ErrorKind::InvalidPath, format!("{path:?}: not an absolute path")));
        }
        if path.contains('\0') {
            return Err(AgentError::new(ErrorKind::InvalidPath, format!("{path:?}: contains a NUL byte")));
        }
        let mut parts = Vec::new();
        for c in path.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    return Err(AgentError::new(ErrorKind::InvalidPath, format!("{path:?}: `..` is not allowed")));
                }
                c => parts.push(c),
            }
        }
        Ok(Self { rel: parts.join("/") })
    }

    pub fn is_root(&self) -> bool {
        self.rel.is_empty()
    }

    /// The path as openat2 wants it relative to the root fd.
    pub fn rel(&self) -> &str {
        if self.rel.is_empty() {
            "."
        } else {
            &self.rel
        }
    }

    /// `/`-prefixed form, for messages.
    pub fn display(&self) -> String {
        format!("/{}", self.rel)
    }

    /// The last component (`/` for the root).
    pub fn name(&self) -> &str {
        match self.rel.rsplit_once('/') {
            Some((_, n)) => n,
            None if self.rel.is_empty() => "/",
            None => &self.rel,
        }
    }

    /// Parent path and last component; `None` for the root.
    pub fn split(&self) -> Option<(SandboxPath, &str)> {
        if self.rel.is_empty() {
            return None;
        }
        Some(match self.rel.rsplit_once('/') {
            Some((p, n)) => (SandboxPath { rel: p.to_string() }, n),
            None => (SandboxPath { rel: String::new() }, self.rel.as_str()),
        })
    }

    /// Every ancestor from the first component down to the path itself.
    pub fn prefixes(&self) -> impl Iterator<Item = SandboxPath> + '_ {
        let rel = &self.rel;
        rel.match_indices('/')
            .map(|(i, _)| i)
            .chain(std::iter::once(rel.len()))
            .filter(|&i| i > 0)
            .map(move |i| SandboxPath { rel: rel[..i].to_string() })
    }

    pub fn join(&self, name: &str) -> SandboxPath {
        if self.rel.is_empty() {
            SandboxPath { rel: name.to_string() }
        } else {
            SandboxPath { rel: format!("{}/{}", self.rel, name) }
        }
    }
}

/// The directory every sandbox path is resolved in.
pub struct Root {
    fd: OwnedFd,
}

const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);

impl Root {
    pub fn open(dir: &str) -> Result<Self, Errno> {
        let fd = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Self { fd })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// openat2 confined to the root. Retries EAGAIN, which RESOLVE_IN_ROOT
    /// returns when a concurrent rename might have let `..` escape.
    pub fn open_at(&self, path: &SandboxPath, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        let mut tries = 0;
        loop {
            match rustix::fs::openat2(&self.fd, path.rel(), flags | OFlags::CLOEXEC, mode, RESOLVE) {
                Err(Errno::AGAIN) if tries < 16 => tries += 1,
                r => return r,
            }
        }
    }

    /// An O_PATH fd of the directory `path`.
    pub fn open_dir(&self, path: &SandboxPath) -> Result<OwnedFd, AgentError> {
        self.open_at(path, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).map_err(|e| os_err(path.display(), e))
    }

    /// The parent directory of `path` (an O_PATH fd) and the last component,
    /// for *at() calls that must not follow the last component.
    pub fn open_parent<'p>(&self, path: &'p SandboxPath) -> Result<(OwnedFd, &'p str), AgentError> {
        let Some((parent, name)) = path.split() else {
            return Err(AgentError::new(ErrorKind::InvalidPath, "the root directory cannot be used here"));
        };
        Ok((self.open_dir(&parent)?, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_paths_are_normalised() {
        assert_eq!(SandboxPath::parse("/").unwrap().rel(), ".");
        assert!(SandboxPath::parse("/").unwrap().is_root());
        assert_eq!(SandboxPath::parse("/a//b/./c/").unwrap().rel(), "a/b/c");
        assert_eq!(SandboxPath::parse("/a/b").unwrap().display(), "/a/b");
    }

    #[test]
    fn relative_dotdot_and_nul_are_refused() {
        for p in ["a/b", "", "./a", "/a/../b", "/..", "/a/..", "/a\0b"] {
            let e = SandboxPath::parse(p).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidPath, "{p:?}");
        }
        // `..` inside a name is just a name.
        assert_eq!(SandboxPath::parse("/a..b/..c").unwrap().rel(), "a..b/..c");
    }

    #[test]
    fn split_name_and_prefixes() {
        let p = SandboxPath::parse("/x/y/z").unwrap();
        let (parent, name) = p.split().unwrap();
        assert_eq!((parent.rel(), name), ("x/y", "z"));
        assert_eq!(p.name(), "z");
        let top = SandboxPath::parse("/x").unwrap();
        let (parent, name) = top.split().unwrap();
        assert_eq!((parent.rel(), name), (".", "x"));
        assert!(SandboxPath::parse("/").unwrap().split().is_none());
        let pre: Vec<String> = p.prefixes().map(|s| s.display()).collect();
        assert_eq!(pre, ["/x", "/x/y", "/x/y/z"]);
        assert_eq!(SandboxPath::parse("/").unwrap().prefixes().count(), 0);
        assert_eq!(top.join("q").display(), "/x/q");
        assert_eq!(SandboxPath::parse("/").unwrap().join("q").display(), "/q");
    }
}
