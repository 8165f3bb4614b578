//! Loading the egress programs (bpf/egress.bpf.c) and keeping their maps.
//!
//! The maps are pinned by name in the node's directory on a bpf
//! filesystem, and the programs are attached to each sandbox's cgroup2
//! directory with plain `BPF_PROG_ATTACH` (not a link): an attachment then
//! belongs to the cgroup, not to the edge process, so a crashed edge leaves
//! every sandbox's allowlist enforced (fail closed) and a restarted edge
//! finds the same maps again and goes on updating them. Removing the
//! sandbox's cgroup directory detaches everything.

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap as BpfHashMap, MapData, RingBuf};
use aya::programs::{CgroupSkb, CgroupSockAddr};
use aya::{Ebpf, EbpfLoader, Pod};

use crate::rules::{Entry, MAX_RANGES};

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/egress.bpf.o"));

/// The programs and the kernel's attach type for each (uapi enum
/// bpf_attach_type).
const PROGRAMS: &[(&str, u32)] = &[
    ("dsec_connect4", 10), // BPF_CGROUP_INET4_CONNECT
    ("dsec_connect6", 11), // BPF_CGROUP_INET6_CONNECT
    ("dsec_sendmsg4", 14), // BPF_CGROUP_UDP4_SENDMSG
    ("dsec_sendmsg6", 15), // BPF_CGROUP_UDP6_SENDMSG
    ("dsec_egress", 1),    // BPF_CGROUP_INET_EGRESS
];

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("loading the egress eBPF programs: {0}")]
    Load(String),
    #[error("eBPF map {0}: {1}")]
    Map(&'static str, String),
    #[error("attaching {0} to {1}: {2}")]
    Attach(&'static str, String, std::io::Error),
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawRange {
    lo: u16,
    hi: u16,
    protos: u8,
    pad: [u8; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RuleVal {
    n: u32,
    r: [RawRange; MAX_RANGES],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SandboxVal {
    self_ip: u32,
    dns_ip: u32,
}

// SAFETY: plain #[repr(C)] data without padding holes the kernel reads
// (every byte is initialised: Default zeroes the explicit pads).
unsafe impl Pod for RuleVal {}
// SAFETY: as above.
unsafe impl Pod for SandboxVal {}

/// A denial reported by the programs (struct deny_event).
#[derive(Debug, Clone, PartialEq)]
pub struct RawDenial {
    pub cgid: u64,
    pub daddr: std::net::IpAddr,
    pub dport: u16,
    pub proto: u8,
    pub kind: u8,
    pub pid: u32,
}

pub struct Programs {
    _ebpf: Ebpf,
    prog_fds: Vec<(&'static str, u32, OwnedFd)>,
    rules: LpmTrie<MapData, [u8; 12], RuleVal>,
    sandboxes: BpfHashMap<MapData, u64, SandboxVal>,
    denials: Option<RingBuf<MapData>>,
    pin_dir: PathBuf,
    /// This process mounted the bpf filesystem (the host had none): it
    /// takes it away again in `unpin` when nothing is left pinned there.
    mounted_bpffs: bool,
}

fn key(cgid: u64, addr: Ipv4Addr, len: u8) -> Key<[u8; 12]> {
    let mut k = [0u8; 12];
    k[..8].copy_from_slice(&cgid.to_be_bytes());
    k[8..].copy_from_slice(&addr.octets());
    Key::new(64 + u32::from(len), k)
}

fn ip_ne(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

impl Programs {
    /// Loads the programs, reusing the maps pinned in `pin_dir` (a
    /// directory on a bpf filesystem; made if missing) or pinning new ones.
    pub fn load(pin_dir: &Path) -> Result<Programs, BpfError> {
        let mounted_bpffs = ensure_bpffs(pin_dir)?;
        let mut ebpf = EbpfLoader::new().map_pin_path(pin_dir).load(OBJECT).map_err(|e| BpfError::Load(e.to_string()))?;
        let mut prog_fds = Vec::new();
        for (name, attach_type) in PROGRAMS {
            let prog = ebpf.program_mut(name).ok_or_else(|| BpfError::Load(format!("{name} missing from the object")))?;
            let fd = if *name == "dsec_egress" {
                let p: &mut CgroupSkb = prog.try_into().map_err(|e: aya::programs::ProgramError| BpfError::Load(e.to_string()))?;
                p.load().map_err(|e| BpfError::Load(format!("{name}: {e}")))?;
                p.fd().map_err(|e| BpfError::Load(e.to_string()))?.as_fd().try_clone_to_owned()
            } else {
                let p: &mut CgroupSockAddr = prog.try_into().map_err(|e: aya::programs::ProgramError| BpfError::Load(e.to_string()))?;
                p.load().map_err(|e| BpfError::Load(format!("{name}: {e}")))?;
                p.fd().map_err(|e| BpfError::Load(e.to_string()))?.as_fd().try_clone_to_owned()
            };
            prog_fds.push((*name, *attach_type, fd.map_err(|e| BpfError::Load(e.to_string()))?));
        }
        let take = |ebpf: &mut Ebpf, name: &'static str| ebpf.take_map(name).ok_or_else(|| BpfError::Map(name, "missing".into()));
        let rules = LpmTrie::try_from(take(&mut ebpf, "rules")?).map_err(|e| BpfError::Map("rules", e.to_string()))?;
        let sandboxes = BpfHashMap::try_from(take(&mut ebpf, "sandboxes")?).map_err(|e| BpfError::Map("sandboxes", e.to_string()))?;
        let denials = RingBuf::try_from(take(&mut ebpf, "denials")?).map_err(|e| BpfError::Map("denials", e.to_string()))?;
        Ok(Programs { _ebpf: ebpf, prog_fds, rules, sandboxes, denials: Some(denials), pin_dir: pin_dir.to_path_buf(), mounted_bpffs })
    }

    /// The ring of denials, for the one task that reads it.
    pub fn take_denials(&mut self) -> Option<RingBuf<MapData>> {
        self.denials.take()
    }

    /// Attaches every program to the cgroup2 directory `cgroup`.
    pub fn attach(&self, cgroup: BorrowedFd<'_>, what: &str) -> Result<(), BpfError> {
        for (name, attach_type, fd) in &self.prog_fds {
            prog_attach(fd.as_fd(), cgroup, *attach_type).map_err(|e| BpfError::Attach(name, what.to_string(), e))?;
        }
        Ok(())
    }

    pub fn set_sandbox(&mut self, cgid: u64, self_ip: Ipv4Addr, dns_ip: Ipv4Addr) -> Result<(), BpfError> {
        self.sandboxes
            .insert(cgid, SandboxVal { self_ip: ip_ne(self_ip), dns_ip: ip_ne(dns_ip) }, 0)
            .map_err(|e| BpfError::Map("sandboxes", e.to_string()))
    }

    /// Makes the sandbox's allowlist exactly `entries`: new and changed
    /// entries first, then stale ones removed, so an address allowed before
    /// and after never blinks.
    pub fn set_entries(&mut self, cgid: u64, entries: &[Entry]) -> Result<(), BpfError> {
        let mut wanted = std::collections::HashSet::new();
        for e in entries {
            let mut v = RuleVal { n: e.ranges.len() as u32, ..Default::default() };
            for (slot, r) in v.r.iter_mut().zip(&e.ranges) {
                *slot = RawRange { lo: r.lo, hi: r.hi, protos: r.protos, pad: [0; 3] };
            }
            let k = key(cgid, e.cidr.addr, e.cidr.len);
            wanted.insert((k.prefix_len(), k.data()));
            self.rules.insert(&k, v, 0).map_err(|e| BpfError::Map("rules", e.to_string()))?;
        }
        for k in self.keys_of(cgid) {
            if !wanted.contains(&(k.prefix_len(), k.data())) {
                let _ = self.rules.remove(&k);
            }
        }
        Ok(())
    }

    fn keys_of(&self, cgid: u64) -> Vec<Key<[u8; 12]>> {
        let prefix = cgid.to_be_bytes();
        self.rules.keys().filter_map(Result::ok).filter(|k| k.data()[..8] == prefix).collect()
    }

    /// Forgets a sandbox: its entries and its record.
    pub fn forget(&mut self, cgid: u64) {
        for k in self.keys_of(cgid) {
            let _ = self.rules.remove(&k);
        }
        let _ = self.sandboxes.remove(&cgid);
    }

    /// Removes the pinned maps (edge shutdown with no networked sandbox
    /// left).
    pub fn unpin(&self) {
        for name in ["rules", "sandboxes", "denials"] {
            let _ = std::fs::remove_file(self.pin_dir.join(name));
        }
        let _ = std::fs::remove_dir(&self.pin_dir);
        if let Some(up) = self.pin_dir.parent() {
            let _ = std::fs::remove_dir(up); // only if no other node's
        }
        let root = Path::new(BPFFS_ROOT);
        // A fresh bpf filesystem holds the kernel's own preloaded iterators
        // (`maps.debug`, `progs.debug`): those are not anybody's pins.
        let preloaded = |e: &std::fs::DirEntry| matches!(e.file_name().to_str(), Some("maps.debug" | "progs.debug"));
        let empty = std::fs::read_dir(root).map(|d| d.flatten().all(|e| preloaded(&e))).unwrap_or(false);
        if self.mounted_bpffs && empty {
            // SAFETY: a constant NUL-terminated path; MNT_DETACH, so a
            // reader still inside it (nobody, normally) does not fail us.
            unsafe { libc::umount2(c"/sys/fs/bpf".as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Decodes one record of the denials ring.
pub fn decode(b: &[u8]) -> Option<RawDenial> {
    if b.len() < 32 {
        return None;
    }
    let cgid = u64::from_ne_bytes(b[0..8].try_into().ok()?);
    let word = |i: usize| -> Option<[u8; 4]> { b[8 + 4 * i..12 + 4 * i].try_into().ok() };
    let kind = b[31];
    let daddr = if matches!(kind, 3 | 4 | 6) {
        let mut a = [0u8; 16];
        for i in 0..4 {
            a[4 * i..4 * i + 4].copy_from_slice(&word(i)?);
        }
        std::net::IpAddr::V6(a.into())
    } else {
        std::net::IpAddr::V4(word(0)?.into())
    };
    let pid = u32::from_ne_bytes(b[24..28].try_into().ok()?);
    let dport = u16::from_ne_bytes(b[28..30].try_into().ok()?);
    Some(RawDenial { cgid, daddr, dport, proto: b[30], kind, pid })
}

/// bpf(BPF_PROG_ATTACH) without flags: one program of each type per cgroup.
fn prog_attach(prog: BorrowedFd<'_>, cgroup: BorrowedFd<'_>, attach_type: u32) -> std::io::Result<()> {
    // union bpf_attr for BPF_PROG_ATTACH: target_fd, attach_bpf_fd,
    // attach_type, attach_flags, replace_bpf_fd (then fields left zero).
    let mut attr = [0u32; 16];
    attr[0] = cgroup.as_raw_fd() as u32;
    attr[1] = prog.as_raw_fd() as u32;
    attr[2] = attach_type;
    const BPF_PROG_ATTACH: libc::c_long = 8;
    // SAFETY: bpf(2) reads `size` bytes of our zero-initialised attr.
    let r = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_ATTACH, attr.as_mut_ptr(), std::mem::size_of_val(&attr)) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// Mounts a bpf filesystem at /sys/fs/bpf if none is there (systemd
/// usually has), and makes `dir` below it. True if it mounted one.
fn ensure_bpffs(dir: &Path) -> Result<bool, BpfError> {
    const BPF_FS_MAGIC: i64 = 0xcafe4a11;
    let root = Path::new(BPFFS_ROOT);
    let is_bpffs = |p: &Path| -> bool {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else { return false };
        // SAFETY: statfs into a zeroed local struct.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid path pointer and struct.
        unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC }
    };
    let mounted = !is_bpffs(root);
    if mounted {
        let _ = std::fs::create_dir_all(root);
        // SAFETY: constant NUL-terminated strings.
        let r = unsafe { libc::mount(c"bpf".as_ptr(), c"/sys/fs/bpf".as_ptr(), c"bpf".as_ptr(), 0, c"mode=0700".as_ptr().cast()) };
        if r != 0 {
            return Err(BpfError::Load(format!("mounting a bpf filesystem at /sys/fs/bpf: {}", std::io::Error::last_os_error())));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| BpfError::Load(format!("{}: {e}", dir.display())))?;
    Ok(mounted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denial_records_decode() {
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&77u64.to_ne_bytes());
        b[8..12].copy_from_slice(&[198, 18, 0, 11]);
        b[24..28].copy_from_slice(&42u32.to_ne_bytes());
        b[28..30].copy_from_slice(&443u16.to_ne_bytes());
        b[30] = 6;
        b[31] = 1;
        let d = decode(&b).unwrap();
        assert_eq!(d, RawDenial { cgid: 77, daddr: "198.18.0.11".parse().unwrap(), dport: 443, proto: 6, kind: 1, pid: 42 });
        assert!(decode(&b[..20]).is_none());
    }

    #[test]
    fn keys_put_the_cgroup_first_and_count_its_bits() {
        let k = key(0x0102, Ipv4Addr::new(198, 18, 0, 0), 16);
        assert_eq!(k.prefix_len(), 80);
        assert_eq!(k.data(), [0, 0, 0, 0, 0, 0, 1, 2, 198, 18, 0, 0]);
    }
}
