//! The call's working directory (BASE/call, one call at a time per
//! runner) and the compiled program's (BASE/prog).

use crate::error::{refused, RunnerError};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};

use rustix::fs::{Mode, OFlags};

use super::request::safe_rel;
use super::sys::write_all;
use super::{CALL_GID, CALL_UID, PROG_DIR, SCRATCH};

fn chown_to_call_user(path: &str) -> io::Result<()> {
    rustix::fs::chownat(
        rustix::fs::CWD,
        path,
        Some(rustix::fs::Uid::from_raw(CALL_UID)),
        Some(rustix::fs::Gid::from_raw(CALL_GID)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

fn context(what: &str, path: &str, e: impl Into<io::Error>) -> RunnerError {
    RunnerError::Sys { what: format!("{what} {path}").into(), source: e.into() }
}

/// Creates the empty scratch directory, owned by the call user.
pub fn prepare() -> Result<&'static str, RunnerError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.mode(0o700);
    if let Err(e) = builder.create(SCRATCH) {
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(context("creating", SCRATCH, e));
        }
        // A previous cleanup left it (it should not): start afresh.
        let _ = std::fs::remove_dir_all(SCRATCH);
        builder.create(SCRATCH).map_err(|e| context("creating", SCRATCH, e))?;
    }
    chown_to_call_user(SCRATCH).map_err(|e| context("chown", SCRATCH, e))?;
    Ok(SCRATCH)
}

/// Writes the request's extra files (relative path -> content) into the
/// fresh scratch directory, each file and directory the call user's. The
/// call has not run yet, so nothing in scratch is the call's doing.
pub fn write_files(files: &[(String, Vec<u8>)]) -> Result<(), RunnerError> {
    for (name, content) in files {
        let rel =
            safe_rel(name).ok_or_else(|| refused(format!("file path {name:?} must be relative and stay inside the working directory")))?;
        let mut dir = SCRATCH.to_string();
        let parts: Vec<&str> = rel.split('/').collect();
        for p in &parts[..parts.len() - 1] {
            dir = format!("{dir}/{p}");
            match std::fs::DirBuilder::new().create(&dir) {
                Ok(()) => chown_to_call_user(&dir).map_err(|e| context("chown", &dir, e))?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(context("creating", &dir, e)),
            }
        }
        let path = format!("{SCRATCH}/{rel}");
        write_new(&path, content, 0o666).map_err(|e| context("writing", &path, e))?;
    }
    Ok(())
}

/// Writes `data` to `path` (created or truncated, never through a
/// symbolic link), owned by the call user.
pub fn write_new(path: &str, data: &[u8], mode: u32) -> io::Result<()> {
    let fd = rustix::fs::open(
        path,
        OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )?;
    rustix::fs::fchown(&fd, Some(rustix::fs::Uid::from_raw(CALL_UID)), Some(rustix::fs::Gid::from_raw(CALL_GID)))?;
    write_all(fd.as_fd(), data)
}

/// Opens scratch/rel for reading without following any symbolic link on
/// the way (the call user controls everything under scratch).
pub fn open_beneath(rel: &str) -> io::Result<OwnedFd> {
    let mut dir = rustix::fs::open(SCRATCH, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    let parts: Vec<&str> = rel.split('/').collect();
    for p in &parts[..parts.len() - 1] {
        dir = rustix::fs::openat(&dir, *p, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    }
    let last = parts[parts.len() - 1];
    Ok(rustix::fs::openat(&dir, last, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC, Mode::empty())?)
}

/// Removes the call's directory. BASE is root's, so the call cannot have
/// moved or replaced the directory itself. Most calls leave in it only
/// what the monitor wrote (`written`, plain names): unlinking those
/// (unlink never follows a symbolic link) and removing the then empty
/// directory takes a system call each; a failure of either (something
/// else is there, or a name became a directory) takes remove_dir_all,
/// which never follows symbolic links either.
pub fn remove(written: &[String]) {
    let fast = written.iter().all(|name| rustix::fs::unlink(format!("{SCRATCH}/{name}").as_str()).is_ok());
    if fast && rustix::fs::rmdir(SCRATCH).is_ok() {
        return;
    }
    let _ = std::fs::remove_dir_all(SCRATCH);
}

/// Replaces the installed compiled program (BASE/prog/prog, executable and
/// readable by the call user, whose own program it is: a JVM reads its
/// jar; writable by nobody but root).
pub fn install_program(data: &[u8]) -> Result<(), RunnerError> {
    let path = format!("{PROG_DIR}/prog");
    let _ = std::fs::remove_dir_all(PROG_DIR);
    std::fs::DirBuilder::new().mode(0o711).create(PROG_DIR).map_err(|e| context("creating", PROG_DIR, e))?;
    let written = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o755).open(&path).and_then(|mut f| {
        use std::io::Write;
        f.write_all(data)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o755))
    });
    written.map_err(|e| context("installing", &path, e))
}

/// The program a compile step left at scratch/prog, if it is a regular
/// file (never through a symbolic link).
pub fn read_compiled() -> Option<Vec<u8>> {
    let fd = open_beneath("prog").ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    super::sys::read_to_end_at(fd.as_fd(), 0).ok()
}

/// Whether a compiled program is installed.
pub fn program_installed() -> bool {
    std::path::Path::new(&format!("{PROG_DIR}/prog")).exists()
}
