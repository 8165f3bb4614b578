//! What the sampler reads each second: a sandbox's counters (its cgroup's
//! files, its network namespace's interfaces, its writable layer's size)
//! and the node's totals (`/proc/stat`, `/proc/meminfo`). Each read is a
//! few small files, so a pass over thousands of sandboxes stays cheap.

use std::os::unix::fs::MetadataExt as _;

use crate::cgroup::Cgroups;

/// A sandbox's counters at one instant; `None` where unreadable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reading {
    /// Cumulative CPU time (ns).
    pub(crate) cpu_ns: Option<u64>,
    pub(crate) memory_bytes: Option<u64>,
    pub(crate) pids: Option<u64>,
    pub(crate) disk_bytes: Option<u64>,
    /// Cumulative bytes received and sent on its interfaces but loopback.
    pub(crate) net: Option<NetCounters>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NetCounters {
    pub(crate) rx_bytes: u64,
    pub(crate) tx_bytes: u64,
}

/// Reads sandbox `id`'s cgroup counters, and the network counters of the
/// namespace its first process `pid` is in, unless that is `host_netns`
/// (a VM's QEMU runs in the host's: its counters are the node's, not the
/// sandbox's).
/// How a sandbox's network counters are found.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Net {
    /// A namespace with loopback only: zero, without reading.
    LoopbackOnly,
    /// Read from the namespace of its process, unless that is the host's
    /// (a VM's QEMU without a network of its own: no counters).
    Read { host_netns: Option<u64> },
}

pub(crate) fn sandbox(cgroups: &Cgroups, id: &str, pid: i32, net: Net, disk_bytes: Option<u64>) -> Reading {
    Reading {
        cpu_ns: cgroups.cpu_usage_ns(id),
        memory_bytes: cgroups.memory_usage(id),
        pids: cgroups.pids_current(id),
        disk_bytes,
        net: match net {
            Net::LoopbackOnly => Some(NetCounters::default()),
            Net::Read { host_netns } => net_counters(pid, host_netns),
        },
    }
}

/// The inode of the network namespace `pid` is in (`self` for the edge).
pub(crate) fn netns_of(pid: &str) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/net")).ok().map(|m| m.ino())
}

fn net_counters(pid: i32, host_netns: Option<u64>) -> Option<NetCounters> {
    let ns = netns_of(&pid.to_string())?;
    if Some(ns) == host_netns {
        return None;
    }
    parse_net_dev(&std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?)
}

/// Sums `/proc/net/dev`'s receive and transmit bytes over every interface
/// but loopback (traffic a sandbox sends itself is not network use).
pub(crate) fn parse_net_dev(text: &str) -> Option<NetCounters> {
    let mut total = NetCounters::default();
    // Two header lines, then `  name: rx_bytes rx_packets ... (8 receive
    // fields) tx_bytes ...`.
    for line in text.lines().skip(2) {
        let (name, fields) = line.split_once(':')?;
        if name.trim() == "lo" {
            continue;
        }
        let numbers: Vec<u64> = fields.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
        total.rx_bytes += numbers.first().copied().unwrap_or(0);
        total.tx_bytes += numbers.get(8).copied().unwrap_or(0);
    }
    Some(total)
}

/// The node's counters at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NodeReading {
    /// Jiffies of all CPUs: busy, and in total (idle and iowait included).
    pub(crate) busy_jiffies: u64,
    pub(crate) total_jiffies: u64,
    /// CPUs `/proc/stat` lists (online ones).
    pub(crate) cpus: u32,
    pub(crate) memory_used_bytes: u64,
    pub(crate) swap_used_bytes: u64,
}

pub(crate) fn node() -> NodeReading {
    let (busy_jiffies, total_jiffies, cpus) = std::fs::read_to_string("/proc/stat").ok().and_then(|t| parse_stat(&t)).unwrap_or((0, 0, 0));
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| meminfo_kib(&mem, key).unwrap_or(0) * 1024;
    NodeReading {
        busy_jiffies,
        total_jiffies,
        cpus,
        memory_used_bytes: kib("MemTotal:").saturating_sub(kib("MemAvailable:")),
        swap_used_bytes: kib("SwapTotal:").saturating_sub(kib("SwapFree:")),
    }
}

/// `(busy, total)` jiffies from `/proc/stat`'s first line (`cpu  user nice
/// system idle iowait irq softirq steal ...`; guest time is already in
/// user and nice), and how many `cpuN` lines follow it.
pub(crate) fn parse_stat(text: &str) -> Option<(u64, u64, u32)> {
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line.split_whitespace().take(8).map(|f| f.parse().unwrap_or(0)).collect();
    if v.len() < 4 {
        return None;
    }
    let total: u64 = v.iter().sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    let cpus = text.lines().filter(|l| l.strip_prefix("cpu").is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit()))).count();
    Some((total - idle, total, cpus as u32))
}

fn meminfo_kib(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_sums_every_interface_but_loopback() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
lo:  999999     10    0    0    0     0          0         0   999999     10    0    0    0     0       0          0\n  \
eth0:    1500     12    0    0    0     0          0         0     700      9    0    0    0     0       0          0\n  \
eth1:      10      1    0    0    0     0          0         0       5      1    0    0    0     0       0          0\n";
        assert_eq!(parse_net_dev(text), Some(NetCounters { rx_bytes: 1510, tx_bytes: 705 }));
    }

    #[test]
    fn stat_counts_idle_and_iowait_as_not_busy() {
        let text = "cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_stat(text), Some((161, 1181, 1)));
        assert_eq!(parse_stat("intr 1 2 3"), None);
    }

    #[test]
    fn the_node_reading_of_this_host_is_plausible() {
        let n = node();
        assert!(n.total_jiffies > n.busy_jiffies && n.busy_jiffies > 0, "{n:?}");
        assert!(n.memory_used_bytes > 0 && n.cpus > 0, "{n:?}");
    }
}
