//! The node's swap file: where paused sandboxes' memory goes.
//!
//! Host swap is a host-wide setting, so the edge only turns it on when the
//! operator asks (`--swap-file-mb`): it creates the file under its own data
//! dir, writes the swap header itself (no mkswap process), swapon(2)s it,
//! and swapoff(2)s and removes it on shutdown. Running sandboxes never swap
//! (their cgroups have swappiness 0 / swap.max 0); only a pause pushes a
//! frozen sandbox's pages there. A file still active after a crash of the
//! edge is adopted as it is: rewriting an active swap file is impossible and
//! its pages belong to paused sandboxes.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwapConfig {
    pub path: PathBuf,
    pub size_mb: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    #[error("swap file {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("swap file size must be at least 1 MiB")]
    TooSmall,
}

fn io(path: &Path, source: std::io::Error) -> SwapError {
    SwapError::Io { path: path.display().to_string(), source }
}

/// The swap file this edge turned on (or adopted).
#[derive(Debug)]
pub struct NodeSwap {
    path: PathBuf,
}

const PAGE: usize = 4096;
const MAGIC: &[u8; 10] = b"SWAPSPACE2";

/// The first page of a version-1 swap area: `version`, `last_page` and
/// `nr_badpages` (u32 each, native endian) at byte 1024, the magic in the
/// last ten bytes.
fn header(size_bytes: u64) -> Vec<u8> {
    let mut page = vec![0u8; PAGE];
    let last_page = (size_bytes / PAGE as u64 - 1) as u32;
    page[1024..1028].copy_from_slice(&1u32.to_ne_bytes());
    page[1028..1032].copy_from_slice(&last_page.to_ne_bytes());
    page[PAGE - MAGIC.len()..].copy_from_slice(MAGIC);
    page
}

/// Whether `path` is an active swap area (listed in /proc/swaps).
pub fn is_active(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/swaps") else { return false };
    let want = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    text.lines().skip(1).filter_map(|l| l.split_whitespace().next()).any(|p| Path::new(p) == want)
}

/// Whether the host has any swap area (ours or the operator's). Without
/// one, pushing anonymous memory out cannot work and is not attempted.
pub fn host_has_swap() -> bool {
    std::fs::read_to_string("/proc/swaps").map(|t| t.lines().count() > 1).unwrap_or(false)
}

impl NodeSwap {
    /// Creates and turns on the swap file, or adopts it if already active.
    pub fn enable(cfg: &SwapConfig) -> Result<NodeSwap, SwapError> {
        if cfg.size_mb < 1 {
            return Err(SwapError::TooSmall);
        }
        let path = cfg.path.clone();
        if is_active(&path) {
            tracing::info!(path = %path.display(), "adopting the active swap file");
            return Ok(NodeSwap { path });
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        }
        let _ = std::fs::remove_file(&path);
        let size = cfg.size_mb << 20;
        let created = (|| {
            let f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
            allocate(&f, size)?;
            std::os::unix::fs::FileExt::write_all_at(&f, &header(size), 0)?;
            f.sync_all()
        })();
        if let Err(e) = created {
            let _ = std::fs::remove_file(&path);
            return Err(io(&path, e));
        }
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| io(&path, std::io::ErrorKind::InvalidInput.into()))?;
        // SAFETY: swapon(2) with a NUL-terminated path we own and no flags.
        if unsafe { libc::swapon(c.as_ptr(), 0) } != 0 {
            let e = std::io::Error::last_os_error();
            let _ = std::fs::remove_file(&path);
            return Err(io(&path, e));
        }
        tracing::info!(path = %path.display(), size_mb = cfg.size_mb, "swap file on");
        Ok(NodeSwap { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Turns the swap file off (the kernel first reads every page in it back
    /// into the memory of its owners) and removes it.
    pub fn disable(&self) -> Result<(), SwapError> {
        disable_path(&self.path)
    }
}

/// swapoff(2) and unlink; a file that is not active is only removed.
pub fn disable_path(path: &Path) -> Result<(), SwapError> {
    if is_active(path) {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| io(path, std::io::ErrorKind::InvalidInput.into()))?;
        // SAFETY: swapoff(2) with a NUL-terminated path we own.
        if unsafe { libc::swapoff(c.as_ptr()) } != 0 {
            return Err(io(path, std::io::Error::last_os_error()));
        }
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(path, e)),
    }
}

/// A swap file must have no holes: allocate every block up front.
fn allocate(f: &std::fs::File, size: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate(2) on an fd we own, mode 0, a valid range.
    if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, size as libc::off_t) } == 0 {
        return Ok(());
    }
    // Filesystems without fallocate: write zeros.
    let zeros = vec![0u8; 1 << 20];
    let mut w = f;
    let mut left = size;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        w.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_carries_version_last_page_and_magic() {
        let h = header(16 << 20);
        assert_eq!(h.len(), PAGE);
        assert_eq!(u32::from_ne_bytes(h[1024..1028].try_into().unwrap()), 1);
        assert_eq!(u32::from_ne_bytes(h[1028..1032].try_into().unwrap()), 4095);
        assert_eq!(&h[PAGE - 10..], b"SWAPSPACE2");
    }

    #[test]
    fn zero_size_is_refused() {
        let cfg = SwapConfig { path: PathBuf::from("unused"), size_mb: 0 };
        assert!(matches!(NodeSwap::enable(&cfg), Err(SwapError::TooSmall)));
    }
}
