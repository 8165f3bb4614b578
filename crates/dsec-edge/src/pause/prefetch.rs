//! Prefetch on resume. A paused sandbox's memory sits in the node's swap
//! file; after the thaw each page would come back only when first touched,
//! one disk read at a time. Right after the thaw the edge asks the kernel to
//! start reading them all back: `process_madvise(MADV_WILLNEED)` over every
//! private writable mapping of each process of the sandbox starts swap
//! readahead for those ranges, asynchronously, while the sandbox already
//! runs. It is advice: a range that is gone or not swapped costs nothing.

use std::os::fd::{AsRawFd, OwnedFd};

/// Ranges passed per call (the kernel's UIO_MAXIOV).
const MAX_IOV: usize = 1024;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Prefetched {
    pub processes: usize,
    pub ranges: usize,
    /// Bytes the kernel accepted advice for (mapped, not necessarily swapped).
    pub bytes: u64,
}

/// The private writable mappings of a process (heap, stacks, anonymous
/// memory, written data of files): the memory a pause pushed out.
fn writable_private_ranges(maps: &str) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            if !(perms.contains('w') && perms.ends_with('p')) {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            let (a, b) = (usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?);
            (b > a).then_some((a, b - a))
        })
        .collect()
}

fn advise(pidfd: &OwnedFd, ranges: &[(usize, usize)]) -> u64 {
    let mut bytes = 0;
    for chunk in ranges.chunks(MAX_IOV) {
        let iov: Vec<libc::iovec> =
            chunk.iter().map(|&(base, len)| libc::iovec { iov_base: base as *mut libc::c_void, iov_len: len }).collect();
        // SAFETY: process_madvise reads `iov.len()` iovecs from a live
        // vector; the addresses are the other process's and are only used
        // by the kernel as advice ranges in that process (nothing is read
        // or written through them here).
        let n = unsafe { libc::syscall(libc::SYS_process_madvise, pidfd.as_raw_fd(), iov.as_ptr(), iov.len(), libc::MADV_WILLNEED, 0u32) };
        if n > 0 {
            bytes += n as u64;
        }
    }
    bytes
}

/// Starts swap readahead for every process in `pids` (host pids of one
/// sandbox). Processes that are gone, or that the kernel refuses, are
/// skipped.
pub fn prefetch(pids: &[i32]) -> Prefetched {
    let mut done = Prefetched::default();
    for &pid in pids {
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { continue };
        let ranges = writable_private_ranges(&maps);
        let Ok(pidfd) = dsec_spawn::pidfd_open(pid) else { continue };
        done.processes += 1;
        done.ranges += ranges.len();
        done.bytes += advise(&pidfd, &ranges);
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_private_writable_mappings() {
        let maps = "\
55d0a0000000-55d0a0021000 r--p 00000000 08:01 123 /usr/bin/python3
55d0a0021000-55d0a0100000 rw-p 00021000 08:01 123 /usr/bin/python3
7f0000000000-7f0010000000 rw-p 00000000 00:00 0
7f0010000000-7f0010001000 rw-s 00000000 00:05 9 /dev/shm/x
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
";
        assert_eq!(writable_private_ranges(maps), vec![(0x55d0a0021000, 0xdf000), (0x7f0000000000, 0x10000000), (0x7ffc00000000, 0x21000)]);
    }

    #[test]
    fn advises_a_live_process() {
        // This test process: its heap and stacks are mapped, so the kernel
        // accepts advice for some bytes.
        let p = prefetch(&[std::process::id() as i32]);
        assert_eq!(p.processes, 1);
        assert!(p.ranges > 0 && p.bytes > 0, "{p:?}");
        assert_eq!(prefetch(&[i32::MAX]), Prefetched::default());
    }
}
