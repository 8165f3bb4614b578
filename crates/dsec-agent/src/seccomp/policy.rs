//! The system calls a sandbox may not make, as commented data.
//!
//! A deny list on top of the capability bounding set (caps.rs): most of
//! these already fail for lack of a capability, and the filter is the
//! second, independent wall (a kernel bug in one capability check, or a
//! user namespace that hands out fresh capabilities, does not open them).
//! Every refusal here is *audited*: the kernel stops the caller, the agent
//! (the filter's supervisor) records the attempt and answers with the
//! errno below. The agent installs the filter on itself after the
//! sandbox's mounts are made, so the sandbox's own setup never meets it.
//!
//! Left allowed on purpose (see docs/security.md): ptrace (a process can
//! only reach its own sandbox's processes through its pid namespace, and
//! the agent is not dumpable), FICLONE/FICLONERANGE/FIDEDUPERANGE (shared
//! extents, checked by the filesystem like a write; coreutils' cp tries
//! FICLONE on every copy), adjtimex (read-only without CAP_SYS_TIME),
//! personality, name_to_handle_at (a handle is useless without
//! open_by_handle_at).

/// Which calls of a system call are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Every call.
    Always,
    /// Calls whose first argument (clone/unshare flags) has any of these
    /// bits set.
    FlagsAny(u64),
    /// ioctl with this request number (compared on the low 32 bits, as the
    /// kernel reads it).
    IoctlCmd(u32),
    /// Calls whose argument `arg` (0-based, low 32 bits), masked with
    /// `mask`, equals `value` (a socket family or type).
    ArgMaskedEq { arg: u8, mask: u32, value: u32 },
}

#[derive(Debug, Clone, Copy)]
pub struct Refused {
    /// Name in audit events (the ioctl's name for ioctls).
    pub name: &'static str,
    pub nr: libc::c_long,
    pub when: When,
    /// What the caller gets.
    pub errno: i32,
    pub why: &'static str,
}

const fn always(name: &'static str, nr: libc::c_long, why: &'static str) -> Refused {
    Refused { name, nr, when: When::Always, errno: libc::EPERM, why }
}

const fn ioctl(name: &'static str, cmd: u32, why: &'static str) -> Refused {
    Refused { name, nr: libc::SYS_ioctl, when: When::IoctlCmd(cmd), errno: libc::EPERM, why }
}

/// The obsolete socket type that the kernel turns into a packet socket
/// (libc deprecates its constant, which is why it is spelled out here).
const SOCK_PACKET: u32 = 10;

/// Every namespace a process could create or join. A new user namespace
/// hands its creator every capability inside it, which re-opens mount,
/// netfilter and other large kernel surfaces to an unprivileged caller;
/// the others need CAP_SYS_ADMIN, which the sandbox does not have.
pub const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWTIME) as u64;

/// Refused and audited, on every architecture.
pub const REFUSED: &[Refused] = &[
    // Kernel code: loading a module or a new kernel is the host.
    always("init_module", libc::SYS_init_module, "loads kernel code"),
    always("finit_module", libc::SYS_finit_module, "loads kernel code"),
    always("delete_module", libc::SYS_delete_module, "unloads host kernel modules"),
    always("kexec_load", libc::SYS_kexec_load, "replaces the host kernel"),
    always("kexec_file_load", libc::SYS_kexec_file_load, "replaces the host kernel"),
    // Kernel programmability and introspection: large attack surfaces,
    // and perf reads other tenants' activity.
    always("bpf", libc::SYS_bpf, "loads programs into the host kernel"),
    always("perf_event_open", libc::SYS_perf_event_open, "observes the host and other sandboxes; a frequent exploit vector"),
    always("userfaultfd", libc::SYS_userfaultfd, "stalls kernel page faults at will: the standard race-widening exploit primitive"),
    always(
        "io_uring_setup",
        libc::SYS_io_uring_setup,
        "a large, often-exploited kernel interface that also bypasses this filter for the I/O it carries",
    ),
    always("io_uring_enter", libc::SYS_io_uring_enter, "see io_uring_setup"),
    always("io_uring_register", libc::SYS_io_uring_register, "see io_uring_setup"),
    // Kernel keyrings are not namespaced: keys would be shared with the
    // host and other sandboxes under the same uid.
    always("keyctl", libc::SYS_keyctl, "the kernel keyring is not namespaced"),
    always("add_key", libc::SYS_add_key, "the kernel keyring is not namespaced"),
    always("request_key", libc::SYS_request_key, "the kernel keyring is not namespaced (and may run a host upcall)"),
    // Host-wide machine state.
    always("swapon", libc::SYS_swapon, "host-wide swap"),
    always("swapoff", libc::SYS_swapoff, "host-wide swap"),
    always("reboot", libc::SYS_reboot, "reboots or halts the host"),
    always("acct", libc::SYS_acct, "host-wide process accounting to a file"),
    always("settimeofday", libc::SYS_settimeofday, "the clock is host-wide"),
    always("clock_settime", libc::SYS_clock_settime, "the clock is host-wide"),
    always("clock_adjtime", libc::SYS_clock_adjtime, "the clock is host-wide"),
    always("syslog", libc::SYS_syslog, "the kernel log is host-wide (other sandboxes' OOM kills, addresses)"),
    always("quotactl", libc::SYS_quotactl, "filesystem quotas belong to the host"),
    always("quotactl_fd", libc::SYS_quotactl_fd, "filesystem quotas belong to the host"),
    always("vhangup", libc::SYS_vhangup, "hangs up terminals"),
    // The sandbox's mounts are made by the agent before this filter is in
    // place; nothing inside needs to change them afterwards.
    always("mount", libc::SYS_mount, "the sandbox's mounts are fixed at creation"),
    always("umount2", libc::SYS_umount2, "would uncover masked paths"),
    always("pivot_root", libc::SYS_pivot_root, "the sandbox's root is fixed at creation"),
    always("move_mount", libc::SYS_move_mount, "the sandbox's mounts are fixed at creation"),
    always("open_tree", libc::SYS_open_tree, "clones mount trees"),
    always("fsopen", libc::SYS_fsopen, "new filesystem instances"),
    always("fsconfig", libc::SYS_fsconfig, "new filesystem instances"),
    always("fsmount", libc::SYS_fsmount, "new filesystem instances"),
    always("fspick", libc::SYS_fspick, "reconfigures mounted filesystems"),
    always("mount_setattr", libc::SYS_mount_setattr, "would make read-only mounts writable"),
    // Namespaces: none to create, none to join.
    always("setns", libc::SYS_setns, "joins another namespace"),
    Refused {
        name: "unshare",
        nr: libc::SYS_unshare,
        when: When::FlagsAny(NAMESPACE_FLAGS),
        errno: libc::EPERM,
        why: "creates namespaces (a user namespace grants every capability inside it)",
    },
    Refused {
        name: "clone",
        nr: libc::SYS_clone,
        when: When::FlagsAny(NAMESPACE_FLAGS),
        errno: libc::EPERM,
        why: "creates namespaces (a user namespace grants every capability inside it)",
    },
    // File handles open any inode of a filesystem, bypassing the mount
    // namespace (the 2014 "shocker" container escape).
    always("open_by_handle_at", libc::SYS_open_by_handle_at, "opens files outside the sandbox's mounts"),
    // Filesystem-corrupting and extent-swapping ioctls: DSec saw
    // XFS_IOC_SWAPEXT used to read protected content, which corrupted XFS
    // and shut the filesystem down for every tenant on it.
    ioctl("XFS_IOC_SWAPEXT", 0xc0c0_586d, "swaps extents between files (read protected data; corrupted XFS in production)"),
    ioctl("XFS_IOC_EXCHANGE_RANGE", 0x4028_5881, "swaps file ranges (the successor of XFS_IOC_SWAPEXT)"),
    ioctl("EXT4_IOC_MOVE_EXT", 0xc028_660f, "moves extents between files"),
    ioctl("EXT4_IOC_SWAP_BOOT", 0x6611, "swaps a file's blocks with the boot loader inode"),
    // Terminal input injection: pushes keystrokes into a terminal that
    // another session reads.
    ioctl("TIOCSTI", libc::TIOCSTI as u32, "injects input into a terminal"),
    ioctl("TIOCLINUX", libc::TIOCLINUX as u32, "console control (selection paste injects input)"),
    // Packet sockets send link-layer frames straight to the device, below
    // the IP layer where the egress allowlist (cgroup eBPF) looks: with a
    // veth to the host they would reach any address. SOCK_PACKET is the
    // old spelling of the same thing (the kernel turns it into AF_PACKET).
    Refused {
        name: "socket AF_PACKET",
        nr: libc::SYS_socket,
        when: When::ArgMaskedEq { arg: 0, mask: u32::MAX, value: libc::AF_PACKET as u32 },
        errno: libc::EPERM,
        why: "link-layer frames bypass the egress allowlist",
    },
    Refused {
        name: "socket SOCK_PACKET",
        nr: libc::SYS_socket,
        when: When::ArgMaskedEq { arg: 1, mask: 0xf, value: SOCK_PACKET },
        errno: libc::EPERM,
        why: "link-layer frames bypass the egress allowlist",
    },
];

/// x86-only calls.
#[cfg(target_arch = "x86_64")]
pub const REFUSED_ARCH: &[Refused] = &[
    always("iopl", libc::SYS_iopl, "raw access to host I/O ports"),
    always("ioperm", libc::SYS_ioperm, "raw access to host I/O ports"),
    always("uselib", libc::SYS_uselib, "obsolete loader entry point, kept only as attack surface"),
    always("lookup_dcookie", libc::SYS_lookup_dcookie, "profiling interface that resolves host paths"),
];

#[cfg(not(target_arch = "x86_64"))]
pub const REFUSED_ARCH: &[Refused] = &[];

/// Refused *quietly* (no audit event), with ENOSYS so that callers fall
/// back: clone3 passes its flags in memory the filter cannot read, so it
/// cannot be checked for namespace flags; glibc and every runtime fall
/// back to clone(2), which is checked. Nothing is attempted here, so an
/// event would only be noise (every new thread of a modern program).
pub const QUIET_ENOSYS: &[(&str, libc::c_long)] = &[("clone3", libc::SYS_clone3)];

/// Every audited rule (common and architecture-specific).
pub fn refused() -> impl Iterator<Item = &'static Refused> {
    REFUSED.iter().chain(REFUSED_ARCH)
}

/// The rule that matches a notified call, for its audit event.
pub fn lookup(nr: i32, args: &[u64; 6]) -> Option<&'static Refused> {
    refused().find(|r| {
        r.nr == libc::c_long::from(nr)
            && match r.when {
                When::Always => true,
                When::FlagsAny(bits) => args[0] & bits != 0,
                When::IoctlCmd(cmd) => args[1] as u32 == cmd,
                When::ArgMaskedEq { arg, mask, value } => args.get(arg as usize).is_some_and(|a| (*a as u32) & mask == value),
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_has_a_reason_and_is_unique() {
        let mut seen = std::collections::HashSet::new();
        for r in refused() {
            assert!(!r.why.is_empty(), "{} has no reason", r.name);
            assert!(seen.insert((r.nr, format!("{:?}", r.when))), "{} is listed twice", r.name);
        }
    }

    #[test]
    fn packet_sockets_are_refused_and_ip_sockets_are_not() {
        let socket = |family: i32, ty: i32| lookup(libc::SYS_socket as i32, &[family as u64, ty as u64, 0, 0, 0, 0]).map(|r| r.name);
        assert_eq!(socket(libc::AF_PACKET, libc::SOCK_RAW), Some("socket AF_PACKET"));
        assert_eq!(socket(libc::AF_INET, SOCK_PACKET as i32 | libc::SOCK_CLOEXEC), Some("socket SOCK_PACKET"));
        assert_eq!(socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK), None);
        assert_eq!(socket(libc::AF_INET, libc::SOCK_RAW), None, "raw IP is checked by the egress allowlist");
    }

    #[test]
    fn lookup_matches_arguments() {
        let mut args = [0u64; 6];
        assert_eq!(lookup(libc::SYS_mount as i32, &args).map(|r| r.name), Some("mount"));
        args[1] = 0xc0c0_586d;
        assert_eq!(lookup(libc::SYS_ioctl as i32, &args).map(|r| r.name), Some("XFS_IOC_SWAPEXT"));
        // High bits of an ioctl request are ignored by the kernel, so by us.
        args[1] = 0xffff_ffff_c0c0_586d;
        assert_eq!(lookup(libc::SYS_ioctl as i32, &args).map(|r| r.name), Some("XFS_IOC_SWAPEXT"));
        #[allow(clippy::unnecessary_cast)] // `c_ulong` elsewhere
        {
            args[1] = libc::TCGETS as u64;
        }
        assert!(lookup(libc::SYS_ioctl as i32, &args).is_none());
        args[0] = libc::CLONE_NEWUSER as u64;
        assert_eq!(lookup(libc::SYS_unshare as i32, &args).map(|r| r.name), Some("unshare"));
        args[0] = libc::CLONE_FILES as u64;
        assert!(lookup(libc::SYS_unshare as i32, &args).is_none());
    }
}
