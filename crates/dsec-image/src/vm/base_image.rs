//! The full VM's base disk images (`backend="vm"`), kept as qcow2 files in
//! `<images>/vm/images/<name>.qcow2`; each sandbox boots from a qcow2
//! overlay on one of them.
//!
//! Setup builds `debian-vm`: Debian bookworm by debootstrap (the project's
//! recipe, plus the cloud kernel, systemd and udev), the static guest agent
//! as `/usr/local/sbin/dsec-agent` started at boot by `dsec-agent.service`,
//! and a disk that boots by itself under SeaBIOS and OVMF:
//!
//! ```text
//! sector 0      syslinux's mbr.bin + partition table (mbr.rs)
//! 1 MiB         FAT (active, type 0xef): ldlinux.sys + syslinux.cfg for the
//!               BIOS, EFI/BOOT/BOOTX64.EFI (syslinux.efi) for UEFI, the
//!               kernel and its initramfs (Debian's initramfs-tools)
//! 65 MiB        ext4 root (mkfs.ext4 -d from the debootstrap tree)
//! ```
//! Every step writes into one sparse file at offsets (mkfs.fat --offset,
//! mtools' `@@offset`, mkfs.ext4 -E offset): no loop device, no mount. The
//! raw disk becomes a compact qcow2 (`qemu-img convert`).
//!
//! Caching: the debootstrap tree (the slow part, about two minutes) is
//! kept in `<images>/vm/debian-vm.root`; the qcow2 is rebuilt from it (a
//! few seconds) when the agent changes, which a stamp file next to the
//! image records.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest as _, Sha256};

use super::mbr::{mbr, Partition, SECTOR};
use crate::build::tool::{self, MKFS_EXT4, MKFS_FAT, MTOOLS, QEMU_IMG, SYSLINUX};
use crate::build::{debootstrap_tree, io_err, BuildError, DebootstrapRecipe};
use crate::progress::Progress;

/// The image setup builds.
pub const BASE_IMAGE: &str = "debian-vm";
/// Added to Debian minbase: a kernel that boots from the disk (with its
/// initramfs), an init and udev (which loads the virtio drivers).
pub const BASE_PACKAGES: &[&str] = &["linux-image-cloud-amd64", "initramfs-tools", "systemd-sysv", "udev"];
pub const BASE_SUITE: &str = "bookworm";
/// Where the image keeps the agent, and the unit that starts it.
pub const AGENT_IN_GUEST: &str = "usr/local/sbin/dsec-agent";
pub const AGENT_UNIT: &str = "dsec-agent.service";

/// Virtual size of the root filesystem (the qcow2 stays as small as what
/// is written; a sandbox's overlay grows with its writes, up to this).
const ROOT_BYTES: u64 = 4 << 30;
const BOOT_BYTES: u64 = 64 << 20;
const BOOT_START: u64 = 1 << 20;

const MBR_CODE: &str = "/usr/lib/syslinux/mbr/mbr.bin";
const SYSLINUX_EFI: &str = "/usr/lib/SYSLINUX.EFI/efi64/syslinux.efi";
const LDLINUX_E64: &str = "/usr/lib/syslinux/modules/efi64/ldlinux.e64";

/// Bumped when the image's layout or configuration changes, so setup
/// rebuilds it.
const RECIPE_VERSION: &str = "2";

/// The unit that starts the agent: early (no network, no login needed),
/// restarted if it ends (a `Shutdown` request, a crash).
const UNIT: &str = "[Unit]
Description=dsec guest agent (virtio-serial port dsec.agent)
After=systemd-udevd.service local-fs.target
Wants=systemd-udevd.service

[Service]
ExecStart=/usr/local/sbin/dsec-agent guest
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
";

/// Units that only cost boot time in a short-lived sandbox.
const MASKED: &[&str] = &[
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "systemd-pstore.service",
];

/// `<vm_dir>/images`.
pub fn images_dir(vm_dir: &Path) -> PathBuf {
    vm_dir.join("images")
}

/// Refuses names that could escape the directory or confuse QEMU's option
/// parser (`,`).
pub fn check_image_name(name: &str) -> Result<(), BuildError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(BuildError::InvalidRecipe(format!("VM image name {name:?}: use lowercase letters, digits, '.', '_' and '-'")))
    }
}

/// The qcow2 file of VM image `name` in `dir`, which must exist.
pub fn image_path(dir: &Path, name: &str) -> Result<PathBuf, BuildError> {
    check_image_name(name)?;
    let path = dir.join(format!("{name}.qcow2"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(BuildError::InvalidRecipe(format!(
            "no VM image {name:?} in {} (`dsec image setup` builds {BASE_IMAGE}; `dsec image import-vm` adds your own)",
            dir.display()
        )))
    }
}

/// Builds `debian-vm` in `images_dir(vm_dir)` unless it is there for this
/// agent already; returns its path.
pub fn ensure_base_image(vm_dir: &Path, agent: &Path, mirror: &str, progress: &dyn Progress) -> Result<PathBuf, BuildError> {
    let agent_bytes = std::fs::read(agent).map_err(io_err("reading the guest agent", agent))?;
    if !super::initramfs::is_static_elf(&agent_bytes) {
        return Err(BuildError::InvalidRecipe(format!(
            "the guest agent {} is not statically linked (build it with scripts/build-agent.sh)",
            agent.display()
        )));
    }
    let dir = images_dir(vm_dir);
    std::fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
    let image = dir.join(format!("{BASE_IMAGE}.qcow2"));
    let stamp_path = dir.join(format!("{BASE_IMAGE}.stamp"));
    let stamp = stamp_for(&agent_bytes);
    if image.is_file() && std::fs::read_to_string(&stamp_path).is_ok_and(|s| s.trim() == stamp) {
        progress.stage(&format!("VM image {BASE_IMAGE} already present"));
        return Ok(image);
    }
    let tree = ensure_tree(vm_dir, mirror, progress)?;
    let work = vm_dir.join(format!(".{BASE_IMAGE}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(io_err("creating", &work))?;
    let built = (|| {
        configure(&tree, &agent_bytes)?;
        let raw = work.join("disk.raw");
        write_boot_disk(&tree, &raw, progress)?;
        import_image(&dir, BASE_IMAGE, &raw, progress).map(drop)
    })();
    let _ = std::fs::remove_dir_all(&work);
    built?;
    std::fs::write(&stamp_path, format!("{stamp}\n")).map_err(io_err("writing", &stamp_path))?;
    progress.stage(&format!("VM image {BASE_IMAGE} ready"));
    Ok(image)
}

/// Adds the disk `src` (any format qemu-img reads) as VM image `name`,
/// converted to qcow2 (temp + rename: a failed import leaves nothing).
pub fn import_image(dir: &Path, name: &str, src: &Path, progress: &dyn Progress) -> Result<PathBuf, BuildError> {
    check_image_name(name)?;
    if !src.is_file() {
        return Err(BuildError::InvalidRecipe(format!("{} is not a file", src.display())));
    }
    std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
    let dest = dir.join(format!("{name}.qcow2"));
    let tmp = dir.join(format!(".{name}.{}.qcow2", std::process::id()));
    progress.stage(&format!("converting {} to qcow2", src.display()));
    let mut c = Command::new(QEMU_IMG.name);
    c.args(["convert", "-q", "-O", "qcow2"]).arg(src).arg(&tmp);
    let r = tool::run(&QEMU_IMG, c, None).and_then(|_| std::fs::rename(&tmp, &dest).map_err(io_err("moving into place", &dest)));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r.map(|()| dest)
}

fn stamp_for(agent: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(RECIPE_VERSION.as_bytes());
    h.update([0]);
    h.update(agent);
    hex::encode(h.finalize())
}

/// The debootstrap tree, built once (into a temporary name, renamed when
/// complete, so an interrupted build is never mistaken for a finished one).
fn ensure_tree(vm_dir: &Path, mirror: &str, progress: &dyn Progress) -> Result<PathBuf, BuildError> {
    let tree = vm_dir.join(format!("{BASE_IMAGE}.root"));
    if tree.join("etc/debian_version").is_file() {
        return Ok(tree);
    }
    let tmp = vm_dir.join(format!(".{BASE_IMAGE}.root.tmp"));
    let _ = std::fs::remove_dir_all(&tmp);
    let mut recipe = DebootstrapRecipe::new(BASE_SUITE);
    recipe.mirror = mirror.to_string();
    recipe.include = BASE_PACKAGES.iter().map(|p| p.to_string()).collect();
    let made = debootstrap_tree(&recipe, &tmp, progress).and_then(|()| {
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::rename(&tmp, &tree).map_err(io_err("moving into place", &tree))
    });
    if made.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    made.map(|()| tree)
}

/// The guest's configuration: the agent and its unit, the modules it
/// needs at boot, masked timers, the hostname.
fn configure(tree: &Path, agent: &[u8]) -> Result<(), BuildError> {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let write = |rel: &str, data: &[u8], mode: u32| -> Result<(), BuildError> {
        let p = tree.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
        }
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, data).map_err(io_err("writing", &p))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).map_err(io_err("chmod", &p))
    };
    let link = |target: &str, rel: &str| -> Result<(), BuildError> {
        let p = tree.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
        }
        let _ = std::fs::remove_file(&p);
        symlink(target, &p).map_err(io_err("linking", &p))
    };
    write(AGENT_IN_GUEST, agent, 0o755)?;
    write(&format!("etc/systemd/system/{AGENT_UNIT}"), UNIT.as_bytes(), 0o644)?;
    link(&format!("/etc/systemd/system/{AGENT_UNIT}"), &format!("etc/systemd/system/multi-user.target.wants/{AGENT_UNIT}"))?;
    // udev would load it from the device's modalias too; listing it makes
    // the port appear without waiting for udev's coldplug.
    write("etc/modules-load.d/dsec.conf", b"virtio_console\n", 0o644)?;
    for unit in MASKED {
        link("/dev/null", &format!("etc/systemd/system/{unit}"))?;
    }
    write("etc/hostname", b"dsec-vm\n", 0o644)?;
    Ok(())
}

/// The kernel and initramfs debootstrap installed in `/boot`.
fn boot_files(tree: &Path) -> Result<(PathBuf, PathBuf), BuildError> {
    let boot = tree.join("boot");
    let mut kernels: Vec<PathBuf> = std::fs::read_dir(&boot)
        .map_err(io_err("listing", &boot))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("vmlinuz-")))
        .collect();
    kernels.sort();
    let kernel = kernels.pop().ok_or_else(|| BuildError::InvalidRecipe(format!("no kernel in {}", boot.display())))?;
    let version = kernel.file_name().and_then(|n| n.to_str()).unwrap_or_default().trim_start_matches("vmlinuz-").to_string();
    let initrd = boot.join(format!("initrd.img-{version}"));
    if !initrd.is_file() {
        return Err(BuildError::InvalidRecipe(format!("no initramfs {} for the kernel", initrd.display())));
    }
    Ok((kernel, initrd))
}

/// The kernel command line of the image. The crypto self-tests and a few
/// initcalls cost seconds under emulation and nothing is lost without them.
///
/// `swiotlb=1024` (2 MiB of bounce buffers instead of 64): x86 sets up the
/// bounce buffer whenever memory may exist above 4 GiB, which on q35 is
/// as soon as the VM has a hot-pluggable memory region (every virtio-pmem
/// layer makes one), and the kernel zeroes all of it at boot, so it was
/// 64 MiB of resident host memory per VM. The VM's devices (virtio, VGA)
/// all address 64 bits and never bounce; the small buffer stays for
/// anything a user adds that might.
pub fn kernel_cmdline(root_uuid: &str) -> String {
    format!(
        "root=UUID={root_uuid} ro console=ttyS0 console=tty0 quiet cryptomgr.notests \
         initcall_blacklist=crypto_kdf108_init,init_kprobe_trace,load_system_certificate_list random.trust_cpu=on \
         swiotlb=1024"
    )
}

/// syslinux's configuration: boot the one entry at once.
pub fn syslinux_cfg(cmdline: &str) -> String {
    format!("DEFAULT debian\nPROMPT 0\nTIMEOUT 0\nLABEL debian\n  LINUX /vmlinuz\n  INITRD /initrd.img\n  APPEND {cmdline}\n")
}

/// Writes the bootable raw disk `out` from `tree`.
fn write_boot_disk(tree: &Path, out: &Path, progress: &dyn Progress) -> Result<(), BuildError> {
    let (kernel, initrd) = boot_files(tree)?;
    let uuid = random_uuid();
    let fstab = format!("UUID={uuid} / ext4 defaults,errors=remount-ro 0 0\n");
    std::fs::write(tree.join("etc/fstab"), fstab).map_err(io_err("writing", &tree.join("etc/fstab")))?;
    let root_start = BOOT_START + BOOT_BYTES;
    let total = root_start + ROOT_BYTES;
    let f = std::fs::File::create(out).map_err(io_err("creating", out))?;
    f.set_len(total).map_err(io_err("sizing", out))?;
    drop(f);
    let path = out.to_str().ok_or_else(|| BuildError::InvalidRecipe(format!("non-UTF-8 path {}", out.display())))?;

    progress.stage("boot partition (FAT, syslinux for BIOS and UEFI)");
    let run = |t: &tool::Tool, args: &[&str]| -> Result<(), BuildError> {
        let mut c = Command::new(t.name);
        c.args(args);
        tool::run(t, c, None).map(drop)
    };
    let (boot_sector, boot_kib) = ((BOOT_START / SECTOR).to_string(), (BOOT_BYTES >> 10).to_string());
    run(&MKFS_FAT, &["--offset", &boot_sector, "-h", &boot_sector, "-F", "16", "-n", "DSECBOOT", path, &boot_kib])?;
    run(&SYSLINUX, &["--offset", &BOOT_START.to_string(), "--install", path])?;
    let fat = format!("{path}@@{BOOT_START}");
    let cfg = syslinux_cfg(&kernel_cmdline(&uuid));
    let cfg_file = out.with_extension("cfg");
    std::fs::write(&cfg_file, &cfg).map_err(io_err("writing", &cfg_file))?;
    let cfg_path = cfg_file.to_str().unwrap_or_default();
    let mtool = |program: &'static str, args: &[&str]| -> Result<(), BuildError> {
        let t = tool::Tool { name: program, package: MTOOLS.package };
        let mut c = Command::new(program);
        c.arg("-i").arg(&fat).args(args);
        tool::run(&t, c, None).map(drop)
    };
    mtool("mcopy", &[kernel.to_str().unwrap_or_default(), "::/vmlinuz"])?;
    mtool("mcopy", &[initrd.to_str().unwrap_or_default(), "::/initrd.img"])?;
    mtool("mcopy", &[cfg_path, "::/syslinux.cfg"])?;
    if Path::new(SYSLINUX_EFI).is_file() && Path::new(LDLINUX_E64).is_file() {
        mtool("mmd", &["::/EFI", "::/EFI/BOOT"])?;
        mtool("mcopy", &[SYSLINUX_EFI, "::/EFI/BOOT/BOOTX64.EFI"])?;
        mtool("mcopy", &[LDLINUX_E64, "::/EFI/BOOT/ldlinux.e64"])?;
        mtool("mcopy", &[cfg_path, "::/EFI/BOOT/syslinux.cfg"])?;
    } else {
        progress.stage("syslinux-efi is not installed: the image boots under SeaBIOS only");
    }
    let _ = std::fs::remove_file(&cfg_file);

    progress.stage("root filesystem (ext4 from the tree)");
    let tree_s = tree.to_str().ok_or_else(|| BuildError::InvalidRecipe(format!("non-UTF-8 path {}", tree.display())))?;
    let offset = format!("offset={root_start}");
    let size = format!("{}k", ROOT_BYTES >> 10);
    run(&MKFS_EXT4, &["-q", "-F", "-L", "root", "-U", &uuid, "-E", &offset, "-d", tree_s, path, &size])?;

    let code = std::fs::read(MBR_CODE).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => BuildError::ToolMissing { tool: "mbr.bin", package: "syslinux-common" },
        _ => io_err("reading", Path::new(MBR_CODE))(e),
    })?;
    let sectors = |b: u64| (b / SECTOR) as u32;
    let parts = [
        Partition { active: true, kind: 0xef, start: sectors(BOOT_START), sectors: sectors(BOOT_BYTES) },
        Partition { active: false, kind: 0x83, start: sectors(root_start), sectors: sectors(ROOT_BYTES) },
    ];
    let signature = u32::from_str_radix(&uuid[..8], 16).unwrap_or(0x6473_6563);
    let sector0 = mbr(&code, signature, &parts).map_err(BuildError::InvalidRecipe)?;
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(out).map_err(io_err("opening", out))?;
    f.write_all_at(&sector0, 0).map_err(io_err("writing the MBR of", out))?;
    Ok(())
}

fn random_uuid() -> String {
    let mut b = [0u8; 16];
    let _ = getrandom(&mut b);
    // Version 4, variant 1.
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_are_checked() {
        for ok in ["debian-vm", "win11", "my_os.v2"] {
            check_image_name(ok).unwrap();
        }
        for bad in ["", "../x", "a,b", "A", "-x", "a/b"] {
            assert!(check_image_name(bad).is_err(), "{bad}");
        }
        let dir = tempfile::tempdir().unwrap();
        let e = image_path(dir.path(), "debian-vm").unwrap_err().to_string();
        assert!(e.contains("dsec image setup"), "{e}");
        std::fs::write(dir.path().join("debian-vm.qcow2"), b"").unwrap();
        assert_eq!(image_path(dir.path(), "debian-vm").unwrap(), dir.path().join("debian-vm.qcow2"));
    }

    #[test]
    fn the_boot_config_names_the_root_and_both_consoles() {
        let cfg = syslinux_cfg(&kernel_cmdline("0123abcd-0000-4000-8000-000000000000"));
        assert!(cfg.contains("APPEND root=UUID=0123abcd-0000-4000-8000-000000000000 ro"));
        assert!(cfg.contains(" swiotlb=1024"), "a 2 MiB bounce buffer, not 64 MiB per VM");
        assert!(cfg.contains("console=ttyS0 console=tty0"), "the screen is the last console: {cfg}");
        assert!(cfg.contains("TIMEOUT 0"));
        let u = random_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }

    #[test]
    fn the_stamp_follows_the_agent() {
        assert_eq!(stamp_for(b"a"), stamp_for(b"a"));
        assert_ne!(stamp_for(b"a"), stamp_for(b"b"));
    }
}
