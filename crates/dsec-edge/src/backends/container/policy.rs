//! What a container sandbox may not see or change, as commented data.
//! The agent applies these inside the sandbox's mount namespace before it
//! pivots into the new root (paths are as seen from inside the sandbox).

/// Hidden: files get /dev/null bound over them, directories an empty
/// read-only tmpfs. Missing paths are skipped (kernels differ).
pub const MASKED_PATHS: &[&str] = &[
    // Physical memory and kernel memory images.
    "/proc/kcore",
    "/proc/kmem",
    "/proc/mem",
    // Page-frame introspection: DSec saw a recursive grep from / read
    // /proc/kpagecgroup and hit a kernel bug.
    "/proc/kpagecgroup",
    "/proc/kpageflags",
    "/proc/kpagecount",
    // The same page flags, by physical frame, through sysfs.
    "/sys/kernel/mm/page_idle",
    // Kernel symbol addresses and timers help exploits, reveal host load.
    "/proc/kallsyms",
    "/proc/timer_list",
    "/proc/sched_debug",
    // Kernel heap and vmalloc layout: exploit aids (root-readable only, and
    // the sandbox's root is uid 0).
    "/proc/slabinfo",
    "/proc/vmallocinfo",
    "/proc/pagetypeinfo",
    // The host's kernel log (CAP_SYSLOG is not kept; hidden all the same).
    "/proc/kmsg",
    // Energy counters leak what other tenants compute (the "Platypus"
    // side channel).
    "/sys/devices/virtual/powercap",
    // Host key material and ACPI/firmware interfaces.
    "/proc/keys",
    "/proc/acpi",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/kernel/debug",
    "/sys/kernel/tracing",
    "/sys/fs/cgroup",
    // Lets root in the sandbox trigger host-wide actions (reboot, crash).
    "/proc/sysrq-trigger",
];

/// Remounted read-only: kernel tunables are host-wide (core_pattern would
/// run a program on the host), so root in a sandbox must not write them.
pub const READONLY_PATHS: &[&str] = &["/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq"];
