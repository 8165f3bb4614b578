//! Signal dispositions handed to children.
//!
//! exec(2) resets caught signals to their defaults but keeps ignored ones
//! ignored, so whatever the agent ignores (SIGPIPE, set by Rust's runtime,
//! plus anything inherited from whoever started us, including glibc's
//! reserved real-time signals that signal(3) refuses to touch) would leak
//! into every command. The set is computed once at startup; the child resets
//! exactly those with the raw system call.

/// The kernel's `struct sigaction` on x86-64 / aarch64 (not glibc's).
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

fn rt_sigaction(sig: i32, new: Option<&KernelSigaction>, old: Option<&mut KernelSigaction>) -> bool {
    let new = new.map_or(std::ptr::null(), |n| n as *const KernelSigaction);
    let old = old.map_or(std::ptr::null_mut(), |o| o as *mut KernelSigaction);
    // SAFETY: rt_sigaction with pointers to correctly laid out structs (or
    // null) and the kernel's sigset size (8 bytes).
    unsafe { libc::syscall(libc::SYS_rt_sigaction, sig, new, old, 8usize) == 0 }
}

/// Bit `n-1` set for every signal `n` currently ignored.
pub fn ignored_mask() -> u64 {
    let mut mask = 0;
    for sig in 1..=64 {
        let mut old = KernelSigaction { handler: 0, flags: 0, restorer: 0, mask: 0 };
        if rt_sigaction(sig, None, Some(&mut old)) && old.handler == libc::SIG_IGN {
            mask |= 1u64 << (sig - 1);
        }
    }
    mask
}

/// Resets the signals in `mask` to SIG_DFL. System calls only: runs in the
/// spawned child before exec.
pub fn reset_to_default(mask: u64) {
    let dfl = KernelSigaction { handler: libc::SIG_DFL, flags: 0, restorer: 0, mask: 0 };
    for sig in 1..=64 {
        if mask & (1u64 << (sig - 1)) != 0 {
            rt_sigaction(sig, Some(&dfl), None);
        }
    }
}
