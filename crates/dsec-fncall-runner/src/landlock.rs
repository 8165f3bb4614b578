//! The Landlock domain of the zygote and so of every call: writes only
//! beneath LANDLOCK_WRITABLE. (The numbers are the same on every
//! architecture.)

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use super::sys::owned;

const SYS_LANDLOCK_CREATE_RULESET: libc::c_long = 444;
const SYS_LANDLOCK_ADD_RULE: libc::c_long = 445;
const SYS_LANDLOCK_RESTRICT_SELF: libc::c_long = 446;
const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
const LANDLOCK_RULE_PATH_BENEATH: u32 = 1;
/// Every right that creates, changes or removes something (reading and
/// executing stay free): write, remove dir/file, make char/dir/reg/sock/
/// fifo/block/sym; then refer (ABI 2) and truncate (ABI 3).
const WRITE_ABI1: u64 = 0x2 | 0x10 | 0x20 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800 | 0x1000;
const REFER: u64 = 0x2000;
const TRUNCATE: u64 = 0x4000;

/// The only places a call may write: its scratch directory (under BASE,
/// whose own DAC keeps the call to BASE/call), the temporary directories
/// programs use whatever TMPDIR says (glibc's tmpfile(), POSIX
/// semaphores), and device files such as /dev/null. So the directories the
/// cleanup after a call must look at are known whatever the image's
/// permissions are.
pub const LANDLOCK_WRITABLE: [&str; 5] = [super::BASE, "/tmp", "/var/tmp", "/dev/shm", "/dev"];

/// struct landlock_path_beneath_attr (packed in the kernel's UAPI).
#[repr(C, packed)]
struct PathBeneath {
    allowed_access: u64,
    parent_fd: i32,
}

/// A ruleset confining writes to beneath `writable` (LANDLOCK_WRITABLE for
/// the calls, nothing for the compiler), or None on a kernel without
/// Landlock (then this layer is missing; every other one still holds).
pub fn ruleset(writable: &[&str]) -> io::Result<Option<OwnedFd>> {
    // SAFETY: the version query passes no memory.
    let abi = unsafe { libc::syscall(SYS_LANDLOCK_CREATE_RULESET, std::ptr::null::<u8>(), 0usize, LANDLOCK_CREATE_RULESET_VERSION) };
    if abi < 1 {
        return Ok(None);
    }
    let mut rights = WRITE_ABI1;
    if abi >= 2 {
        rights |= REFER;
    }
    if abi >= 3 {
        rights |= TRUNCATE;
    }
    // struct landlock_ruleset_attr's first field (handled_access_fs); the
    // size we pass says the kernel reads only that.
    let attr: u64 = rights;
    // SAFETY: `attr` lives across the call and its size is passed.
    let fd = unsafe { libc::syscall(SYS_LANDLOCK_CREATE_RULESET, &attr as *const u64, 8usize, 0u32) };
    let ruleset = owned(fd as i32).map_err(|e| io::Error::new(e.kind(), format!("landlock_create_ruleset: {e}")))?;
    for &path in writable {
        let dir = match rustix::fs::open(
            path,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) {
            Ok(d) => d,
            Err(_) => continue, // not in this image
        };
        let rule = PathBeneath { allowed_access: rights, parent_fd: dir.as_raw_fd() };
        // SAFETY: `rule` lives across the call; both fds are open.
        let r = unsafe {
            libc::syscall(SYS_LANDLOCK_ADD_RULE, ruleset.as_raw_fd(), LANDLOCK_RULE_PATH_BENEATH, &rule as *const PathBeneath, 0u32)
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("landlock_add_rule {path}: {e}")));
        }
    }
    Ok(Some(ruleset))
}

/// Enters the domain of `ruleset` (needs no_new_privs first).
pub fn restrict_self(ruleset: i32) -> io::Result<()> {
    // SAFETY: integer arguments only.
    if unsafe { libc::syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0u32) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
