//! The guest's initramfs: a cpio archive ("newc" format, what the kernel
//! unpacks) holding the agent as `/init`, the guest modules named so that
//! their sorted order is their load order, `/dev/console` (the kernel
//! opens it as init's stdio before any devtmpfs exists) and the empty
//! directories the agent mounts on.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::VmKernel;
use crate::build::{io_err, BuildError};

/// Where the agent finds its modules (see the agent's `vm_init`).
const MODULES_DIR: &str = "lib/modules/dsec";
/// The NIC's modules, loaded only by a networked microVM.
const NET_MODULES_DIR: &str = "lib/modules/dsec/net";
const DIRS: &[&str] = &["dev", "proc", "sys", "lib", "lib/modules", MODULES_DIR, NET_MODULES_DIR, "layers", "scratch"];

/// The cache name of the initramfs for this kernel and agent: a digest of
/// both, so a rebuilt agent gets a new archive and an unchanged one is
/// reused.
pub fn initramfs_name(kernel: &VmKernel, agent: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(kernel.version.as_bytes());
    h.update([0]);
    h.update(agent);
    if !kernel.net_modules.is_empty() {
        h.update(b"\0net");
    }
    format!("initramfs-{}.cpio", &hex::encode(h.finalize())[..16])
}

/// Builds (or finds, cached) the initramfs for `agent` in `out_dir` and
/// returns its path. Older archives in `out_dir` are removed (QEMU reads
/// the initramfs into guest memory at start, so running VMs do not need
/// theirs).
pub fn build_initramfs(kernel: &VmKernel, agent: &Path, out_dir: &Path) -> Result<PathBuf, BuildError> {
    let agent_bytes = std::fs::read(agent).map_err(io_err("reading the guest agent", agent))?;
    if !is_static_elf(&agent_bytes) {
        return Err(BuildError::InvalidRecipe(format!(
            "the guest agent {} is not a statically linked executable: a VM's init has no libraries (build it with scripts/build-agent.sh)",
            agent.display()
        )));
    }
    let name = initramfs_name(kernel, &agent_bytes);
    let out = out_dir.join(&name);
    if out.is_file() {
        return Ok(out);
    }
    std::fs::create_dir_all(out_dir).map_err(io_err("creating", out_dir))?;
    let mut w = Cpio::default();
    for d in DIRS {
        w.entry(d, 0o040755, 0, &[]);
    }
    w.entry("dev/console", 0o020600, libc_makedev(5, 1), &[]);
    w.entry("init", 0o100755, 0, &agent_bytes);
    for (i, m) in kernel.modules.iter().enumerate() {
        let data = std::fs::read(m).map_err(io_err("reading", m))?;
        let file = m.file_name().and_then(|n| n.to_str()).unwrap_or("module.ko");
        w.entry(&format!("{MODULES_DIR}/{i:02}-{file}"), 0o100644, 0, &data);
    }
    for (i, m) in kernel.net_modules.iter().enumerate() {
        let data = std::fs::read(m).map_err(io_err("reading", m))?;
        let file = m.file_name().and_then(|n| n.to_str()).unwrap_or("module.ko");
        w.entry(&format!("{NET_MODULES_DIR}/{i:02}-{file}"), 0o100644, 0, &data);
    }
    let bytes = w.finish();
    let tmp = out_dir.join(format!(".{name}.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &out)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err("writing", &out)(e));
    }
    if let Ok(dir) = std::fs::read_dir(out_dir) {
        for e in dir.flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if n.starts_with("initramfs-") && n.ends_with(".cpio") && n != name {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(out)
}

/// A 64-bit ELF executable without a program interpreter (PT_INTERP).
pub(crate) fn is_static_elf(b: &[u8]) -> bool {
    let u16_at = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]) as usize);
    let u64_at = |o: usize| b.get(o..o + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])) as usize);
    if !b.starts_with(b"\x7fELF\x02") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else { return false };
    (0..phnum).all(|i| {
        let at = phoff + i * phentsize;
        b.get(at..at + 4).is_some_and(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) != 3)
    })
}

/// (major, minor) as the newc header's rdev pair, packed for `entry`.
fn libc_makedev(major: u32, minor: u32) -> u64 {
    ((major as u64) << 32) | minor as u64
}

/// A newc archive being written in memory.
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: u64, data: &[u8]) {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            if mode & 0o170000 == 0o040000 { 2 } else { 1 },
            0, // mtime: fixed, so one agent gives one archive
            data.len() as u32,
            0,
            0,
            (rdev >> 32) as u32,
            rdev as u32,
            name.len() as u32 + 1,
            0,
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while self.buf.len() % 4 != 0 {
            self.buf.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, 0, &[]);
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_entries_are_aligned_and_cpio_reads_them() {
        let mut w = Cpio::default();
        w.entry("dir", 0o040755, 0, &[]);
        w.entry("dir/file", 0o100644, 0, b"hello");
        w.entry("dev/console", 0o020600, libc_makedev(5, 1), &[]);
        let bytes = w.finish();
        assert_eq!(bytes.len() % 4, 0);
        assert!(bytes.starts_with(b"070701"));
        // cpio(1) lists exactly what was written.
        let mut child = std::process::Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("cpio (Debian package cpio, installed by scripts/deps.sh)");
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().collect::<Vec<_>>(), ["dir", "dir/file", "dev/console"]);
    }

    #[test]
    fn only_static_executables_can_be_init() {
        let dynamic = std::fs::read("/bin/sh").unwrap();
        assert!(!is_static_elf(&dynamic));
        assert!(!is_static_elf(b"#!/bin/sh\n"));
        let dir = tempfile::tempdir().unwrap();
        let k =
            VmKernel { dir: dir.path().into(), version: "6.1".into(), vmlinuz: "/k/vmlinuz".into(), modules: vec![], net_modules: vec![] };
        let e = build_initramfs(&k, Path::new("/bin/sh"), dir.path()).unwrap_err().to_string();
        assert!(e.contains("statically linked"), "{e}");
    }

    #[test]
    fn the_cache_name_follows_the_agent() {
        let k = VmKernel { dir: "/k".into(), version: "6.1".into(), vmlinuz: "/k/vmlinuz".into(), modules: vec![], net_modules: vec![] };
        assert_eq!(initramfs_name(&k, b"a"), initramfs_name(&k, b"a"));
        assert_ne!(initramfs_name(&k, b"a"), initramfs_name(&k, b"b"));
    }
}
