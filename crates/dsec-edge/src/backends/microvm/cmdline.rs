//! QEMU's command line for one microVM, and the guest kernel's.
//!
//! Pure data in, argv out, so the shape is unit-tested without a VM.

use std::path::{Path, PathBuf};

use crate::backends::qemu::cmdline::{disk_format, layer_serial, Accel, VmFiles, AGENT_PORT};

/// The smallest free block (a buddy order: 2^5 pages, 128 KiB) a guest
/// reports to the host through the balloon. The kernel's default is
/// pageblock_order (2 MiB), and at that order a zone reports nothing until
/// it has 32 free blocks (64 MiB) above its low watermark: a 128 MiB guest
/// never gave a page back. At order 5 an idle 128 MiB guest's resident RAM
/// went from 120 to 72 MiB (order 0: 71 MiB, for 32x the reports).
/// The guest agent re-applies it once the balloon driver is loaded (Linux
/// 6.1 overwrites the boot parameter when the driver registers).
pub const PAGE_REPORTING_ORDER: u32 = 5;

/// virtio-blk serial of the writable disk; layer `i` is `dsec-l<i>`
/// (`qemu::cmdline::layer_serial`).
pub const WRITABLE_SERIAL: &str = "dsec-wr";

/// Everything that decides one VM's command line.
#[derive(Debug, Clone)]
pub struct VmLaunch<'a> {
    pub accel: Accel,
    pub kernel: &'a Path,
    pub initramfs: &'a Path,
    pub memory_mb: u64,
    pub vcpus: u32,
    /// EROFS layer files, topmost first.
    pub layers: &'a [PathBuf],
    pub files: &'a VmFiles,
    /// The host TSC in kHz (TCG: the guest's TSC runs at the host's rate,
    /// and telling the kernel saves its calibration).
    pub tsc_khz: Option<u64>,
    /// Extra kernel parameters (the accelerator probe's `dsec.probe`).
    pub extra_append: &'a str,
    /// A balloon device with free page reporting: the guest hands pages it
    /// frees back to the host (QEMU discards them), so an idle guest's
    /// footprint shrinks to what it uses.
    pub free_page_reporting: bool,
    /// Guest RAM as a shared mapping of this file (`None`: anonymous
    /// memory). A suspend then saves only device state: the RAM is
    /// already in the file (`x-ignore-shared`).
    pub ram_file: Option<&'a Path>,
    /// Map `ram_file` privately (`share=off`): the guest's writes are
    /// copy-on-write pages of this QEMU, the file is never written, and
    /// pages the guest only reads stay one copy in the host's cache for
    /// every VM mapping the file (a memory image's restores, template.rs).
    pub ram_private: bool,
    /// TCG's translation cache in MiB (ignored under KVM): each VM's QEMU
    /// keeps up to this much translated code resident.
    pub tb_size_mb: u32,
    /// Start from a suspend image read from this inherited descriptor
    /// instead of booting: QEMU waits (`-incoming defer`) for the edge to
    /// set the migration capabilities and name the descriptor over QMP.
    pub incoming_fd: Option<i32>,
}

/// Kernel parameters. Under TCG the calibrations and self-tests cost
/// seconds of emulated time: they are skipped or given their answers.
pub fn kernel_cmdline(accel: Accel, tsc_khz: Option<u64>, extra: &str) -> String {
    let mut p = vec![
        "console=ttyS0".to_string(),
        "quiet".into(),
        // A guest kernel panic (the agent, its init, died) ends the VM:
        // reboot at once, which -no-reboot turns into QEMU exiting.
        "panic=-1".into(),
        "reboot=t".into(),
        "rdinit=/init".into(),
        "8250.nr_uarts=1".into(),
        "cryptomgr.notests".into(),
        "initcall_blacklist=crypto_kdf108_init,init_kprobe_trace,load_system_certificate_list".into(),
        "random.trust_cpu=on".into(),
    ];
    if accel == Accel::Tcg {
        if let Some(khz) = tsc_khz {
            // lpj at HZ=250: loops per jiffy = TSC Hz / 250.
            p.push(format!("tsc_early_khz={khz}"));
            p.push("tsc=reliable".into());
            p.push(format!("lpj={}", khz * 4));
        }
    }
    if !extra.is_empty() {
        p.push(extra.to_string());
    }
    p.join(" ")
}

/// The argv of `qemu-system-x86_64` (without the program).
pub fn qemu_args(l: &VmLaunch<'_>) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let mut a: Vec<String> = Vec::with_capacity(64);
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    match l.ram_file {
        None => push(&["-M", "microvm,x-option-roms=off,isa-serial=on"]),
        Some(file) => {
            push(&["-M", "microvm,x-option-roms=off,isa-serial=on,memory-backend=ram"]);
            let share = if l.ram_private { "off" } else { "on" };
            let ram = format!("memory-backend-file,id=ram,size={}M,mem-path={},share={share}", l.memory_mb, drive_path(file));
            push(&["-object", &ram]);
        }
    }
    match l.accel {
        Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
        // A bounded translation cache: the default (1 GiB) would let one
        // VM's QEMU grow far past its guest's memory.
        Accel::Tcg => push(&["-accel", &format!("tcg,tb-size={}", l.tb_size_mb.max(1))]),
    }
    let (mem, smp) = (format!("{}M", l.memory_mb), l.vcpus.max(1).to_string());
    push(&["-m", &mem, "-smp", &smp]);
    push(&["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"]);
    // QEMU itself may not spawn, escalate or change resource limits.
    push(&["-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"]);
    // The reporting order goes before the extra words (the probe's marker
    // stays last).
    let extra = match (l.free_page_reporting, l.extra_append) {
        (false, extra) => extra.to_string(),
        (true, "") => format!("page_reporting.page_reporting_order={PAGE_REPORTING_ORDER}"),
        (true, extra) => format!("page_reporting.page_reporting_order={PAGE_REPORTING_ORDER} {extra}"),
    };
    if l.incoming_fd.is_none() {
        let append = kernel_cmdline(l.accel, l.tsc_khz, &extra);
        push(&["-kernel", &path(l.kernel), "-initrd", &path(l.initramfs), "-append", &append]);
    }
    // A restore gives no kernel: the guest's kernel is already in the RAM
    // it continues from, and microvm hands a kernel to the guest through
    // fw_cfg, which is not part of the migrated state, so the set of RAM
    // blocks stays the same. Loading vmlinuz and the initramfs into
    // fw_cfg was measured at ~90 ms of a restoring QEMU's start under TCG
    // (docs/benchmarks.md).
    let console = format!("file,id=con,path={}", path(&l.files.console_log()));
    push(&["-chardev", &console, "-serial", "chardev:con"]);
    if l.extra_append.contains("dsec.probe") {
        return a;
    }
    let agent = format!("socket,id=agent,path={},server=on,wait=off", path(&l.files.agent_socket()));
    let port = format!("virtserialport,chardev=agent,name={AGENT_PORT}");
    push(&["-device", "virtio-serial-device,max_ports=2", "-chardev", &agent, "-device", &port]);
    for (i, layer) in l.layers.iter().enumerate() {
        let drive = format!("id=l{i},file={},format=raw,if=none,readonly=on", drive_path(layer));
        let dev = format!("virtio-blk-device,drive=l{i},serial={}", layer_serial(i));
        push(&["-drive", &drive, "-device", &dev]);
    }
    if l.free_page_reporting {
        push(&["-device", "virtio-balloon-device,free-page-reporting=on"]);
    }
    let wr = format!("id=wr,file={},format={},if=none,discard=unmap", drive_path(&l.files.disk), disk_format(&l.files.disk));
    let wr_dev = format!("virtio-blk-device,drive=wr,serial={WRITABLE_SERIAL}");
    push(&["-drive", &wr, "-device", &wr_dev]);
    let qmp = format!("unix:{},server=on,wait=off", path(&l.files.qmp_socket()));
    push(&["-qmp", &qmp]);
    if l.incoming_fd.is_some() {
        push(&["-incoming", "defer"]);
    }
    a
}

/// The argv of a standby QEMU for restores of `l`'s shape (standby.rs):
/// the restore's command line without what belongs to one sandbox (the
/// guest RAM backend and the disks' backing files, which the edge adds over
/// QMP when a resume takes the QEMU), stopped before the machine is built
/// (`--preconfig`). Its sockets and logs are in `l.files.run_dir`.
pub fn standby_args(l: &VmLaunch<'_>) -> Vec<String> {
    let ram = Path::new("/standby-ram");
    let mut full = l.clone();
    full.ram_file = Some(ram);
    full.ram_private = false;
    full.incoming_fd = Some(3);
    let mut out = Vec::new();
    let mut it = qemu_args(&full).into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-M" => {
                let machine = it.next().unwrap_or_default();
                out.push(a);
                out.push(machine.replace(",memory-backend=ram", ""));
            }
            "-object" | "-drive" => {
                it.next();
            }
            _ => out.push(a),
        }
    }
    out.push("--preconfig".into());
    out
}

/// What a standby QEMU gets over QMP when it becomes sandbox `l`'s VM:
/// `blockdev-add` arguments for the layers (`l<i>`, read-only raw) and
/// the writable disk (`wr`), the node names the `-device` lines of
/// [`standby_args`] refer to.
pub fn standby_blockdevs(l: &VmLaunch<'_>) -> Vec<serde_json::Value> {
    let file = |p: &Path, ro: bool| serde_json::json!({ "driver": "file", "filename": p.display().to_string(), "read-only": ro });
    let mut out: Vec<serde_json::Value> = l
        .layers
        .iter()
        .enumerate()
        .map(
            |(i, layer)| serde_json::json!({ "driver": "raw", "node-name": format!("l{i}"), "read-only": true, "file": file(layer, true) }),
        )
        .collect();
    let disk = &l.files.disk;
    out.push(serde_json::json!({ "driver": disk_format(disk), "node-name": "wr", "discard": "unmap", "file": file(disk, false) }));
    out
}

/// QEMU option values separate with `,`; a literal comma is doubled.
fn drive_path(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

/// The host TSC rate, from /proc/cpuinfo's first `cpu MHz`.
pub fn host_tsc_khz() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = text.lines().find_map(|l| l.strip_prefix("cpu MHz")?.split(':').nth(1)?.trim().parse().ok())?;
    (mhz > 0.0).then(|| (mhz * 1000.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> VmFiles {
        VmFiles { run_dir: "/run/dsec/vm/n.abc".into(), disk: "/data/vm-disks/n.abc.ext4".into() }
    }

    fn launch<'a>(f: &'a VmFiles, layers: &'a [PathBuf], accel: Accel) -> VmLaunch<'a> {
        VmLaunch {
            accel,
            kernel: Path::new("/k/vmlinuz"),
            initramfs: Path::new("/k/initramfs.cpio"),
            memory_mb: 256,
            vcpus: 2,
            layers,
            files: f,
            tsc_khz: Some(2_100_000),
            extra_append: "",
            free_page_reporting: true,
            ram_file: None,
            ram_private: false,
            incoming_fd: None,
            tb_size_mb: 64,
        }
    }

    fn value_after<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2).filter(|w| w[0] == flag).map(|w| w[1].as_str()).collect()
    }

    #[test]
    fn disks_are_named_by_serial_in_layer_order_with_the_writable_one_last() {
        let f = files();
        let layers = vec![PathBuf::from("/blobs/top"), PathBuf::from("/blobs/base,1")];
        let args = qemu_args(&launch(&f, &layers, Accel::Tcg));
        let drives = value_after(&args, "-drive");
        assert_eq!(drives.len(), 3);
        assert!(drives[0].starts_with("id=l0,file=/blobs/top,") && drives[0].contains("readonly=on"));
        assert!(drives[1].contains("file=/blobs/base,,1,"), "commas in paths are doubled: {}", drives[1]);
        assert!(drives[2].starts_with("id=wr,file=/data/vm-disks/n.abc.ext4") && !drives[2].contains("readonly"));
        let devices = value_after(&args, "-device");
        assert!(devices.iter().any(|d| d.ends_with("serial=dsec-l0")));
        assert!(devices.iter().any(|d| d.ends_with("serial=dsec-l1")));
        assert!(devices.iter().any(|d| d.ends_with("serial=dsec-wr")));
        assert!(devices.iter().any(|d| d.contains("name=dsec.agent")));
    }

    #[test]
    fn memory_cpus_and_sockets_follow_the_launch() {
        let f = files();
        let args = qemu_args(&launch(&f, &[PathBuf::from("/b")], Accel::Tcg));
        assert_eq!(value_after(&args, "-m"), ["256M"]);
        assert_eq!(value_after(&args, "-smp"), ["2"]);
        assert_eq!(value_after(&args, "-qmp"), ["unix:/run/dsec/vm/n.abc/qmp.sock,server=on,wait=off"]);
        assert!(value_after(&args, "-chardev").iter().any(|c| c.contains("path=/run/dsec/vm/n.abc/agent.sock,server=on,wait=off")));
        assert!(args.iter().any(|a| a == "-no-reboot"));
        assert!(value_after(&args, "-device").contains(&"virtio-balloon-device,free-page-reporting=on"));
        assert!(value_after(&args, "-append")[0].ends_with(" page_reporting.page_reporting_order=5"));
        let layers = [PathBuf::from("/b")];
        let mut l = launch(&f, &layers, Accel::Tcg);
        l.free_page_reporting = false;
        let without = qemu_args(&l);
        assert!(!without.iter().any(|a| a.contains("balloon") || a.contains("page_reporting")));
    }

    #[test]
    fn tcg_gets_the_tuned_kernel_line_and_kvm_does_not() {
        let f = files();
        let tcg = qemu_args(&launch(&f, &[PathBuf::from("/b")], Accel::Tcg));
        let append = value_after(&tcg, "-append")[0];
        assert!(append.contains("tsc_early_khz=2100000") && append.contains("lpj=8400000") && append.contains("tsc=reliable"));
        assert!(value_after(&tcg, "-accel")[0].starts_with("tcg"));
        let kvm = qemu_args(&launch(&f, &[PathBuf::from("/b")], Accel::Kvm));
        assert!(!value_after(&kvm, "-append")[0].contains("lpj="));
        assert_eq!(value_after(&kvm, "-accel"), ["kvm"]);
        assert_eq!(value_after(&kvm, "-cpu"), ["host"]);
    }

    #[test]
    fn the_probe_boots_without_devices() {
        let f = files();
        let mut l = launch(&f, &[], Accel::Kvm);
        l.extra_append = "dsec.probe";
        let args = qemu_args(&l);
        assert!(value_after(&args, "-append")[0].ends_with("dsec.probe"));
        assert!(value_after(&args, "-drive").is_empty() && value_after(&args, "-qmp").is_empty());
    }

    #[test]
    fn file_backed_ram_and_an_incoming_image() {
        let f = files();
        let layers = [PathBuf::from("/b")];
        let mut l = launch(&f, &layers, Accel::Tcg);
        let ram = PathBuf::from("/state/vm/ram/n.abc.ram");
        l.ram_file = Some(&ram);
        l.incoming_fd = Some(3);
        let args = qemu_args(&l);
        assert_eq!(value_after(&args, "-M"), ["microvm,x-option-roms=off,isa-serial=on,memory-backend=ram"]);
        assert_eq!(value_after(&args, "-object"), ["memory-backend-file,id=ram,size=256M,mem-path=/state/vm/ram/n.abc.ram,share=on"]);
        assert_eq!(value_after(&args, "-incoming"), ["defer"]);
        assert!(value_after(&args, "-kernel").is_empty() && value_after(&args, "-initrd").is_empty(), "a restore loads no kernel");
        let plain = qemu_args(&launch(&f, &layers, Accel::Tcg));
        assert!(value_after(&plain, "-object").is_empty() && value_after(&plain, "-incoming").is_empty());
        l.ram_private = true;
        assert!(value_after(&qemu_args(&l), "-object")[0].ends_with(",share=off"));
    }

    #[test]
    fn a_standby_has_the_restore_line_without_ram_and_disk_files() {
        let f = files();
        let layers = [PathBuf::from("/b0"), PathBuf::from("/b1")];
        let l = launch(&f, &layers, Accel::Tcg);
        let args = standby_args(&l);
        assert_eq!(value_after(&args, "-M"), ["microvm,x-option-roms=off,isa-serial=on"]);
        assert!(value_after(&args, "-object").is_empty() && value_after(&args, "-drive").is_empty());
        assert!(value_after(&args, "-kernel").is_empty());
        assert_eq!(value_after(&args, "-incoming"), ["defer"]);
        assert_eq!(args.last().map(String::as_str), Some("--preconfig"));
        // The devices stay, naming the nodes the takeover adds.
        let devices = value_after(&args, "-device");
        for node in ["drive=l0,", "drive=l1,", "drive=wr,"] {
            assert!(devices.iter().any(|d| d.contains(node)), "{node} in {devices:?}");
        }
        let nodes = standby_blockdevs(&l);
        let names: Vec<&str> = nodes.iter().filter_map(|n| n["node-name"].as_str()).collect();
        assert_eq!(names, ["l0", "l1", "wr"]);
        assert_eq!(nodes[1]["file"]["filename"], "/b1");
        assert_eq!(nodes[2]["driver"], "raw");
        assert_eq!(nodes[0]["read-only"], true);
    }

    #[test]
    fn qcow2_disks_are_named_as_such() {
        let mut f = files();
        f.disk = "/d/n.abc-0.qcow2".into();
        let args = qemu_args(&launch(&f, &[], Accel::Tcg));
        assert!(value_after(&args, "-drive").iter().any(|d| d.starts_with("id=wr,file=/d/n.abc-0.qcow2,format=qcow2,")));
    }
}
