//! The few btrfs ioctls the node's disk needs: subvolumes and their quota
//! groups. Direct calls (no `btrfs` process): a sandbox's creation makes one
//! subvolume and sets one limit, each a few microseconds.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `statfs` magic of btrfs.
pub const SUPER_MAGIC: i64 = 0x9123_683e;

/// The root directory of every subvolume has this inode number.
const FIRST_FREE_OBJECTID: u64 = 256;

const IOCTL_MAGIC: u64 = 0x94;

const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (IOCTL_MAGIC << 8) | nr
}
const WRITE: u64 = 1;
const READ: u64 = 2;

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; 4088],
}

/// `struct btrfs_ioctl_quota_ctl_args`.
#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

/// `struct btrfs_ioctl_qgroup_limit_args` (its `struct btrfs_qgroup_limit`
/// inlined).
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    flags: u64,
    max_referenced: u64,
    max_exclusive: u64,
    rsv_referenced: u64,
    rsv_exclusive: u64,
}

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `struct btrfs_ioctl_fs_info_args`, of which only the fsid is read.
#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    rest: [u8; 1024 - 32],
}

const SUBVOL_CREATE: u64 = ioc(WRITE, 14, std::mem::size_of::<VolArgs>());
const SNAP_DESTROY: u64 = ioc(WRITE, 15, std::mem::size_of::<VolArgs>());
const INO_LOOKUP: u64 = ioc(READ | WRITE, 18, std::mem::size_of::<InoLookupArgs>());
const FS_INFO: u64 = ioc(READ, 31, std::mem::size_of::<FsInfoArgs>());
const QUOTA_CTL: u64 = ioc(READ | WRITE, 40, std::mem::size_of::<QuotaCtlArgs>());
// The kernel declares it _IOR although it reads the limit from userspace.
const QGROUP_LIMIT: u64 = ioc(READ, 43, std::mem::size_of::<QgroupLimitArgs>());

const QUOTA_CTL_ENABLE: u64 = 1;
const QUOTA_CTL_ENABLE_SIMPLE_QUOTA: u64 = 4;
const QGROUP_LIMIT_MAX_RFER: u64 = 1;

fn check(r: libc::c_int) -> std::io::Result<()> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn vol_args(name: &CStr) -> std::io::Result<Box<VolArgs>> {
    let bytes = name.to_bytes();
    if bytes.is_empty() || bytes.len() >= 4088 || bytes.contains(&b'/') {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut args = Box::new(VolArgs { fd: 0, name: [0; 4088] });
    args.name[..bytes.len()].copy_from_slice(bytes);
    Ok(args)
}

/// Creates subvolume `name` in directory `parent`.
pub fn create_subvolume(parent: BorrowedFd<'_>, name: &CStr) -> std::io::Result<()> {
    let mut args = vol_args(name)?;
    // SAFETY: the ioctl reads a `btrfs_ioctl_vol_args` we own for the call.
    check(unsafe { libc::ioctl(parent.as_raw_fd(), SUBVOL_CREATE as _, &mut *args as *mut VolArgs) })
}

/// Deletes subvolume `name` of directory `parent`, whatever it holds (the
/// kernel frees its extents in the background; its quota group goes with
/// them).
pub fn destroy_subvolume(parent: BorrowedFd<'_>, name: &CStr) -> std::io::Result<()> {
    let mut args = vol_args(name)?;
    // SAFETY: as in `create_subvolume`.
    check(unsafe { libc::ioctl(parent.as_raw_fd(), SNAP_DESTROY as _, &mut *args as *mut VolArgs) })
}

/// Turns quota groups on (a no-op where they are on already, in either
/// mode): simple quotas where the kernel has them (6.7 on: each extent is
/// charged to the subvolume that wrote it, with no backref walk at each
/// commit), full accounting otherwise. Our subvolumes never share extents,
/// so both count the same.
pub fn enable_quota(fs: BorrowedFd<'_>) -> std::io::Result<()> {
    let ctl = |cmd: u64| {
        let mut args = QuotaCtlArgs { cmd, status: 0 };
        // SAFETY: the ioctl reads and writes a struct we own for the call.
        check(unsafe { libc::ioctl(fs.as_raw_fd(), QUOTA_CTL as _, &mut args as *mut QuotaCtlArgs) })
    };
    match ctl(QUOTA_CTL_ENABLE_SIMPLE_QUOTA) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => ctl(QUOTA_CTL_ENABLE),
        other => other,
    }
}

/// Bounds what the subvolume open at `subvol` may refer to, in bytes
/// (writes past it fail with EDQUOT).
pub fn limit_subvolume(subvol: BorrowedFd<'_>, max_bytes: u64) -> std::io::Result<()> {
    // qgroupid 0: the quota group of the subvolume the fd is in.
    let mut args = QgroupLimitArgs {
        qgroupid: 0,
        flags: QGROUP_LIMIT_MAX_RFER,
        max_referenced: max_bytes,
        max_exclusive: 0,
        rsv_referenced: 0,
        rsv_exclusive: 0,
    };
    // SAFETY: the ioctl reads a struct we own for the call.
    check(unsafe { libc::ioctl(subvol.as_raw_fd(), QGROUP_LIMIT as _, &mut args as *mut QgroupLimitArgs) })
}

/// The id of the subvolume whose root directory is open at `subvol`.
pub fn subvolume_id(subvol: BorrowedFd<'_>) -> std::io::Result<u64> {
    let mut args = Box::new(InoLookupArgs { treeid: 0, objectid: FIRST_FREE_OBJECTID, name: [0; 4080] });
    // SAFETY: the ioctl reads and writes a struct we own for the call.
    check(unsafe { libc::ioctl(subvol.as_raw_fd(), INO_LOOKUP as _, &mut *args as *mut InoLookupArgs) })?;
    Ok(args.treeid)
}

/// The filesystem's id, as its directory under /sys/fs/btrfs is named.
pub fn fsid(fs: BorrowedFd<'_>) -> std::io::Result<String> {
    let mut args = Box::new(FsInfoArgs { max_id: 0, num_devices: 0, fsid: [0; 16], rest: [0; 1024 - 32] });
    // SAFETY: the ioctl writes a struct we own for the call.
    check(unsafe { libc::ioctl(fs.as_raw_fd(), FS_INFO as _, &mut *args as *mut FsInfoArgs) })?;
    let h = hex::encode(args.fsid);
    Ok(format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_numbers_match_the_kernel_headers() {
        // From <linux/btrfs.h> as compiled on x86_64.
        assert_eq!(SUBVOL_CREATE, 0x5000_940e);
        assert_eq!(SNAP_DESTROY, 0x5000_940f);
        assert_eq!(INO_LOOKUP, 0xd000_9412);
        assert_eq!(FS_INFO, 0x8400_941f);
        assert_eq!(QUOTA_CTL, 0xc010_9428);
        assert_eq!(QGROUP_LIMIT, 0x8030_942b);
    }
}
