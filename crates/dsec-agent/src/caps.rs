//! The capabilities a sandboxed root keeps.
//!
//! Every command's capability bounding set is cut down to Docker's default
//! set before exec, so root inside a sandbox cannot mount, load modules,
//! ptrace other processes (the agent included) or reconfigure the network.
//! The table is data so a review can see at a glance what root may do.

/// (capability number, name, why it is kept)
pub const KEPT: &[(u32, &str, &str)] = &[
    (0, "CHOWN", "package managers and tar chown the files they install"),
    (1, "DAC_OVERRIDE", "root reads and writes files regardless of their mode bits"),
    (3, "FOWNER", "chmod / utime on files owned by someone else"),
    (4, "FSETID", "keep setuid/setgid bits when root modifies a file"),
    (5, "KILL", "signal processes of other users inside the sandbox"),
    (6, "SETGID", "su, sudo, daemons dropping privileges"),
    (7, "SETUID", "same, for the uid"),
    (8, "SETPCAP", "a process may drop capabilities from its own bounding set"),
    (10, "NET_BIND_SERVICE", "servers listening on ports below 1024"),
    (13, "NET_RAW", "ping"),
    (18, "SYS_CHROOT", "chroot-based build tools"),
    (29, "AUDIT_WRITE", "login tools that write audit records"),
    (31, "SETFCAP", "installing packages whose binaries carry file capabilities"),
];
// Notably absent: MKNOD (Docker keeps it and relies on the devices cgroup to
// make a node of the host's disk useless; dsec does not give sandboxes a
// devices cgroup, so root must not be able to create device nodes at all),
// SYS_ADMIN (mount, namespaces), SYS_PTRACE, SYS_MODULE,
// NET_ADMIN, SYS_RAWIO, SYS_TIME, SYS_BOOT, DAC_READ_SEARCH (open_by_handle_at
// escapes), MAC_ADMIN, BPF, PERFMON, CHECKPOINT_RESTORE.

/// The kept set as a bit mask.
pub const fn kept_mask() -> u64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < KEPT.len() {
        m |= 1 << KEPT[i].0;
        i += 1;
    }
    m
}

const KEEP: u64 = kept_mask();
const CAP_SETPCAP: u32 = 8;
const VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn capget() -> Option<[CapData; 2]> {
    let mut hdr = CapHeader { version: VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two CapData structs (the v3 layout) into `data`
    // and reads the header; both live on this stack frame.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, data.as_mut_ptr()) };
    (r == 0).then_some(data)
}

/// Whether this process may shrink bounding sets (i.e. runs as a real root);
/// a non-root plain-mode agent has nothing to drop.
pub fn can_restrict() -> bool {
    capget().is_some_and(|d| d[0].effective & (1 << CAP_SETPCAP) != 0)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Drops every capability outside [`KEPT`] from the bounding set, clears the
/// ambient set and the same bits of the inheritable set (which would
/// otherwise survive exec for root). Runs in the spawned child before exec:
/// raw system calls only, no allocation.
pub fn restrict_in_child() -> Result<(), i32> {
    for cap in 0..64u32 {
        if KEEP & (1 << cap) != 0 {
            continue;
        }
        // SAFETY: prctl with integer arguments only.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r != 0 {
            match errno() {
                // Past the kernel's last capability.
                libc::EINVAL => break,
                e => return Err(e),
            }
        }
    }
    // SAFETY: prctl with integer arguments only. EINVAL (no ambient support)
    // means there is nothing to clear.
    let r = unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0) };
    if r != 0 && errno() != libc::EINVAL {
        return Err(errno());
    }
    let Some(mut data) = capget() else { return Err(errno()) };
    data[0].inheritable &= KEEP as u32;
    data[1].inheritable &= (KEEP >> 32) as u32;
    let mut hdr = CapHeader { version: VERSION_3, pid: 0 };
    // SAFETY: capset reads the header and two CapData structs from this frame.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) };
    if r != 0 {
        return Err(errno());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dangerous_capabilities_are_not_kept() {
        let m = kept_mask();
        for (cap, name) in
            [(21, "SYS_ADMIN"), (19, "SYS_PTRACE"), (16, "SYS_MODULE"), (12, "NET_ADMIN"), (2, "DAC_READ_SEARCH"), (27, "MKNOD")]
        {
            assert_eq!(m & (1 << cap), 0, "{name} must be dropped");
        }
        assert_eq!(m.count_ones() as usize, KEPT.len(), "no duplicate entries");
        assert_eq!(m, 0xa00425fb, "Docker's default set without MKNOD");
    }
}
