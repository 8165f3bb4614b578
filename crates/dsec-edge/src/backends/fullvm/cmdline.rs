//! QEMU's command line for one full VM (`-M q35`): firmware, the qcow2
//! overlay as a virtio disk the firmware boots, the agent's virtio-serial
//! port, a VGA screen with a PS/2 keyboard and a virtio tablet (absolute
//! pointer, so a click lands where it is asked to).
//!
//! Pure data in, argv out, so the shape is unit-tested without a VM.

use std::path::{Path, PathBuf};

use crate::backends::qemu::cmdline::{Accel, VmFiles, AGENT_PORT};

/// Which firmware boots the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Firmware {
    /// QEMU's default BIOS (the image boots from its MBR).
    #[default]
    Seabios,
    /// UEFI (Debian package `ovmf`); the image needs an EFI boot loader.
    Ovmf,
}

impl std::str::FromStr for Firmware {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "seabios" | "bios" => Ok(Firmware::Seabios),
            "ovmf" | "uefi" => Ok(Firmware::Ovmf),
            other => Err(format!("VM firmware must be seabios or ovmf, not {other:?}")),
        }
    }
}

/// How read-only layers reach a full VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LayerBus {
    /// virtio-pmem, mapped with DAX by the guest: every VM reads the one
    /// copy in the host's page cache, none keeps its own.
    #[default]
    Pmem,
    /// Read-only virtio-blk disks (each guest caches what it reads).
    Blk,
}

impl std::str::FromStr for LayerBus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pmem" => Ok(LayerBus::Pmem),
            "blk" => Ok(LayerBus::Blk),
            other => Err(format!("VM layers go by pmem or blk, not {other:?}")),
        }
    }
}

/// What the guest agent is told to mount for layer `i` (`VmSetup::layer_disks`).
pub fn layer_name(bus: LayerBus, i: usize) -> String {
    match bus {
        LayerBus::Pmem => format!("pmem{i}"),
        LayerBus::Blk => crate::backends::qemu::cmdline::layer_serial(i),
    }
}

/// OVMF's code (read-only, shared) and the template of its variable store
/// (copied per VM: the firmware writes to it).
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";

/// Files of one full VM: the microVM's set (sockets, logs) with the qcow2
/// overlay as the disk, plus OVMF's variable store when UEFI boots it.
pub fn ovmf_vars(files: &VmFiles) -> PathBuf {
    files.run_dir.join("OVMF_VARS.fd")
}

/// Everything that decides one full VM's command line.
#[derive(Debug, Clone)]
pub struct FullVmLaunch<'a> {
    pub accel: Accel,
    pub firmware: Firmware,
    pub memory_mb: u64,
    pub vcpus: u32,
    /// TCG's translation cache, MiB: QEMU keeps all of it resident once a
    /// guest has run that much code (a Debian boot fills 64 MiB).
    pub tb_size_mb: u32,
    pub files: &'a VmFiles,
    /// The most the VM's overlay may hold on the host (`disk_limit_mb`),
    /// bytes: see `disk_drive`.
    pub disk_limit_bytes: u64,
    /// Guests report freed pages to the host (virtio-balloon).
    pub free_page_reporting: bool,
    /// Read-only EROFS layer files, topmost first, and how they are
    /// attached.
    pub layers: &'a [PathBuf],
    pub layer_bus: LayerBus,
    /// Restore a suspend image instead of booting: QEMU waits
    /// (`-incoming defer`) for the edge to hand it the image.
    pub incoming: bool,
}

/// The argv of `qemu-system-x86_64` (without the program).
pub fn qemu_args(l: &FullVmLaunch<'_>) -> Vec<String> {
    let path = |p: &Path| p.display().to_string().replace(',', ",,");
    let mut a: Vec<String> = Vec::with_capacity(64);
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    push(&["-M", "q35"]);
    match l.accel {
        Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => push(&["-accel", &format!("tcg,tb-size={}", l.tb_size_mb.max(1))]),
    }
    let pmem: &[PathBuf] = if l.layer_bus == LayerBus::Pmem { l.layers } else { &[] };
    let (smp, mem) = (l.vcpus.max(1).to_string(), memory_arg(l.memory_mb, pmem));
    push(&["-m", &mem, "-smp", &smp]);
    push(&["-nodefaults", "-no-user-config", "-no-reboot", "-display", "none"]);
    push(&["-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"]);
    if l.firmware == Firmware::Ovmf {
        let code = format!("if=pflash,format=raw,unit=0,readonly=on,file={}", path(Path::new(OVMF_CODE)));
        let vars = format!("if=pflash,format=raw,unit=1,file={}", path(&ovmf_vars(l.files)));
        push(&["-drive", &code, "-drive", &vars]);
    }
    // The screen; its keyboard is q35's PS/2 controller.
    push(&["-device", "VGA", "-device", "virtio-tablet-pci"]);
    let disk = disk_drive(&path(&l.files.disk), l.disk_limit_bytes);
    push(&["-drive", &disk, "-device", "virtio-blk-pci,drive=disk,bootindex=0"]);
    let agent = format!("socket,id=agent,path={},server=on,wait=off", path(&l.files.agent_socket()));
    let port = format!("virtserialport,chardev=agent,name={AGENT_PORT}");
    push(&["-device", "virtio-serial-pci,max_ports=2", "-chardev", &agent, "-device", &port]);
    for (i, layer) in l.layers.iter().enumerate() {
        match l.layer_bus {
            LayerBus::Pmem => {
                // The region is the whole file (an EROFS image is a
                // whole number of 4 KiB blocks); QEMU needs its size said.
                let size = std::fs::metadata(layer).map_or(0, |m| m.len());
                let obj = format!("memory-backend-file,id=pm{i},share=on,readonly=on,size={size},mem-path={}", path(layer));
                let dev = format!("virtio-pmem-pci,memdev=pm{i},id=pmem{i}");
                push(&["-object", &obj, "-device", &dev]);
            }
            LayerBus::Blk => {
                let drive = format!("id=l{i},file={},format=raw,if=none,readonly=on", path(layer));
                let dev = format!("virtio-blk-pci,drive=l{i},serial={}", layer_name(LayerBus::Blk, i));
                push(&["-drive", &drive, "-device", &dev]);
            }
        }
    }
    if l.free_page_reporting {
        push(&["-device", "virtio-balloon-pci,free-page-reporting=on"]);
    }
    let console = format!("file,id=con,path={}", path(&l.files.console_log()));
    push(&["-chardev", &console, "-serial", "chardev:con"]);
    let qmp = format!("unix:{},server=on,wait=off", path(&l.files.qmp_socket()));
    push(&["-qmp", &qmp]);
    if l.incoming {
        push(&["-incoming", "defer"]);
    }
    a
}

/// The VM's disk: its qcow2 overlay read through a `raw` node of fixed
/// size (`limit` bytes), so the overlay file can never grow past it on the
/// host: qcow2 allocates its clusters inside the file (made that long and
/// sparse, `overlay::cap`), and a cluster it would need beyond `limit` is a
/// write the raw node refuses with ENOSPC. `werror=report` hands that
/// error to the guest as an I/O error (QEMU's default would pause the whole
/// VM instead).
fn disk_drive(overlay: &str, limit: u64) -> String {
    format!(
        "id=disk,if=none,driver=qcow2,discard=unmap,werror=report,\
         file.driver=raw,file.size={limit},file.file.driver=file,file.file.filename={overlay}"
    )
}

/// `-m`: guest RAM, plus address space (slots, maxmem) for the pmem
/// devices, which are hot-pluggable memory on q35.
fn memory_arg(memory_mb: u64, pmem: &[PathBuf]) -> String {
    if pmem.is_empty() {
        return format!("{memory_mb}M");
    }
    // Each device's region is aligned to 2 MiB: round up, and one more.
    let extra: u64 = pmem.iter().map(|p| std::fs::metadata(p).map_or(0, |m| m.len().div_ceil(2 << 20) * 2) + 2).sum();
    format!("{memory_mb}M,slots={},maxmem={}M", pmem.len() + 1, memory_mb + extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> VmFiles {
        VmFiles { run_dir: "/run/dsec/vm/n.abc".into(), disk: "/data/vm/n.abc.qcow2".into() }
    }

    fn launch(f: &VmFiles) -> FullVmLaunch<'_> {
        FullVmLaunch {
            accel: Accel::Tcg,
            firmware: Firmware::Seabios,
            memory_mb: 512,
            vcpus: 2,
            tb_size_mb: 16,
            files: f,
            disk_limit_bytes: 1 << 30,
            free_page_reporting: true,
            layers: &[],
            layer_bus: LayerBus::Pmem,
            incoming: false,
        }
    }

    fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2).filter(|w| w[0] == flag).map(|w| w[1].as_str()).collect()
    }

    #[test]
    fn a_q35_with_its_overlay_disk_screen_and_agent_port() {
        let f = files();
        let args = qemu_args(&launch(&f));
        assert_eq!(values(&args, "-M"), ["q35"]);
        assert_eq!(values(&args, "-m"), ["512M"]);
        assert_eq!(values(&args, "-smp"), ["2"]);
        // The overlay, capped on the host at disk_limit_mb; a write past it
        // is an I/O error in the guest, not a paused VM.
        assert_eq!(
            values(&args, "-drive"),
            ["id=disk,if=none,driver=qcow2,discard=unmap,werror=report,file.driver=raw,file.size=1073741824,\
              file.file.driver=file,file.file.filename=/data/vm/n.abc.qcow2"]
        );
        let dev = values(&args, "-device");
        assert!(dev.contains(&"virtio-blk-pci,drive=disk,bootindex=0"));
        assert!(dev.contains(&"VGA") && dev.contains(&"virtio-tablet-pci"));
        assert!(dev.contains(&"virtserialport,chardev=agent,name=dsec.agent"));
        assert!(dev.contains(&"virtio-balloon-pci,free-page-reporting=on"));
        assert!(values(&args, "-chardev").contains(&"socket,id=agent,path=/run/dsec/vm/n.abc/agent.sock,server=on,wait=off"));
        assert_eq!(values(&args, "-qmp"), ["unix:/run/dsec/vm/n.abc/qmp.sock,server=on,wait=off"]);
        assert!(args.iter().any(|a| a == "-no-reboot") && args.iter().any(|a| a == "-nodefaults"));
        assert!(values(&args, "-sandbox")[0].contains("spawn=deny"));
        // SeaBIOS is QEMU's default: no firmware flags at all.
        assert!(!args.iter().any(|a| a.contains("pflash")));
        assert!(values(&args, "-incoming").is_empty());
        // A restore: the same machine, waiting for its saved state.
        let mut l = launch(&f);
        l.incoming = true;
        let restore = qemu_args(&l);
        assert_eq!(values(&restore, "-incoming"), ["defer"]);
        assert_eq!(&restore[..args.len()], &args[..]);
    }

    #[test]
    fn ovmf_gets_its_code_read_only_and_a_private_variable_store() {
        let f = files();
        let mut l = launch(&f);
        l.firmware = Firmware::Ovmf;
        let args = qemu_args(&l);
        let drives = values(&args, "-drive");
        assert!(drives[0].contains("readonly=on") && drives[0].ends_with(OVMF_CODE));
        assert_eq!(drives[1], "if=pflash,format=raw,unit=1,file=/run/dsec/vm/n.abc/OVMF_VARS.fd");
        assert_eq!("uefi".parse::<Firmware>(), Ok(Firmware::Ovmf));
        assert_eq!("seabios".parse::<Firmware>(), Ok(Firmware::Seabios));
        assert!("coreboot".parse::<Firmware>().is_err());
    }

    #[test]
    fn kvm_and_tcg_and_paths_with_commas() {
        let f = VmFiles { run_dir: "/run/a,b".into(), disk: "/d/x,y.qcow2".into() };
        let mut l = launch(&f);
        l.accel = Accel::Kvm;
        l.free_page_reporting = false;
        let args = qemu_args(&l);
        assert_eq!(values(&args, "-accel"), ["kvm"]);
        assert_eq!(values(&args, "-cpu"), ["host"]);
        assert!(values(&args, "-drive")[0].ends_with("filename=/d/x,,y.qcow2"));
        assert!(!args.iter().any(|a| a.contains("balloon")));
        assert_eq!(values(&qemu_args(&launch(&f)), "-accel"), ["tcg,tb-size=16"]);
    }

    #[test]
    fn pmem_layers_are_shared_read_only_files_with_room_in_the_address_space() {
        let dir = tempfile::tempdir().unwrap();
        let layer = dir.path().join("layer.erofs");
        std::fs::write(&layer, vec![0u8; 3 << 20]).unwrap();
        let f = files();
        let layers = [layer.clone()];
        let mut l = launch(&f);
        l.layers = &layers;
        let args = qemu_args(&l);
        let obj = values(&args, "-object");
        assert_eq!(obj, [format!("memory-backend-file,id=pm0,share=on,readonly=on,size={},mem-path={}", 3 << 20, layer.display())]);
        assert!(values(&args, "-device").contains(&"virtio-pmem-pci,memdev=pm0,id=pmem0"));
        assert_eq!(values(&args, "-m"), ["512M,slots=2,maxmem=518M"]);
        assert_eq!(layer_name(LayerBus::Pmem, 0), "pmem0");
        // The same layer as a read-only disk instead.
        l.layer_bus = LayerBus::Blk;
        let args = qemu_args(&l);
        assert!(values(&args, "-object").is_empty());
        assert_eq!(values(&args, "-m"), ["512M"]);
        assert!(values(&args, "-drive").contains(&format!("id=l0,file={},format=raw,if=none,readonly=on", layer.display()).as_str()));
        assert!(values(&args, "-device").contains(&"virtio-blk-pci,drive=l0,serial=dsec-l0"));
        assert_eq!("blk".parse::<LayerBus>(), Ok(LayerBus::Blk));
        assert!("nfs".parse::<LayerBus>().is_err());
    }
}
