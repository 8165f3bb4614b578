//! Attaching an image file to a free loop device, with direct system calls.
//!
//! The device is configured to clear itself once its last user lets go
//! (LO_FLAGS_AUTOCLEAR): after the node's filesystem is mounted from it and
//! this handle is dropped, the unmount frees the device, so neither a
//! shutdown nor a crash of the edge between attach and mount leaves one
//! behind. Direct I/O keeps the image's pages out of the host's page cache
//! (the filesystem above caches them once already).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

const LOOP_CTL_GET_FREE: u64 = 0x4c82;
const LOOP_CONFIGURE: u64 = 0x4c0a;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A loop device bound to a file, held open until the filesystem on it is
/// mounted.
pub struct LoopDevice {
    pub path: PathBuf,
    _dev: OwnedFd,
}

/// Binds `image` to a free loop device.
pub fn attach(image: &Path) -> std::io::Result<LoopDevice> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(image)?;
    let ctl = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open("/dev/loop-control")?;
    // Another process may take the free device between our two calls:
    // then it is busy, and the next free one is asked for.
    let mut last = None;
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev: OwnedFd = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(&path)?.into();
        // 4 KiB blocks, as the filesystem on it and the host's below it use,
        // so direct I/O stays aligned; a backing filesystem that refuses
        // either gets the kernel's defaults, buffered.
        match configure(&dev, &file, LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO, 4096).or_else(|e| {
            if e.raw_os_error() == Some(libc::EINVAL) {
                configure(&dev, &file, LO_FLAGS_AUTOCLEAR, 0)
            } else {
                Err(e)
            }
        }) {
            Ok(()) => return Ok(LoopDevice { path, _dev: dev }),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::EBUSY)))
}

fn configure(dev: &OwnedFd, file: &std::fs::File, flags: u32, block_size: u32) -> std::io::Result<()> {
    // SAFETY: an all-zero loop_config is valid (plain integers and arrays).
    let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
    cfg.fd = file.as_raw_fd() as u32;
    cfg.block_size = block_size;
    cfg.info.flags = flags;
    // SAFETY: the ioctl reads a struct we own for the call; the fd in it is
    // open for its duration.
    if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &cfg as *const LoopConfig) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn structs_match_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<super::LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<super::LoopConfig>(), 304);
    }
}
