//! Whether KVM really runs the guest kernel here: one probe boot.
//!
//! An openable /dev/kvm proves little: some hosts offer a KVM that cannot
//! run an ordinary distribution kernel (PVM, for one, needs a PVM-enabled
//! guest and fails on the first instruction it cannot emulate). So the
//! probe boots the real kernel and initramfs under KVM with `dsec.probe`
//! on the command line; the agent prints a marker and reboots (an exit,
//! under -no-reboot). Marker seen: KVM. Anything else: TCG.

use std::path::Path;
use std::time::Duration;

use super::cmdline::{qemu_args, VmLaunch};
use crate::backends::qemu::cmdline::{Accel, VmFiles};

/// A KVM boot takes well under a second; TCG-speed hangs are cut here.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);
const MARKER: &str = "DSEC-PROBE-OK";

pub async fn probe_kvm(qemu: &Path, kernel: &Path, initramfs: &Path, run_root: &Path) -> Accel {
    if !Path::new("/dev/kvm").exists() {
        return Accel::Tcg;
    }
    let dir = run_root.join(format!("probe-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let files = VmFiles { run_dir: dir.clone(), disk: dir.join("unused") };
    let launch = VmLaunch {
        accel: Accel::Kvm,
        kernel,
        initramfs,
        memory_mb: 128,
        vcpus: 1,
        layers: &[],
        files: &files,
        tsc_khz: None,
        extra_append: "dsec.probe",
        free_page_reporting: false,
        ram_file: None,
        ram_private: false,
        incoming_fd: None,
        tb_size_mb: 64,
    };
    let child = tokio::process::Command::new(qemu)
        .args(qemu_args(&launch))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let ok = match child {
        Ok(mut child) => {
            let _ = tokio::time::timeout(PROBE_TIMEOUT, child.wait()).await;
            let _ = child.kill().await;
            std::fs::read_to_string(files.console_log()).is_ok_and(|c| c.contains(MARKER))
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not start the KVM probe");
            false
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    if ok {
        Accel::Kvm
    } else {
        tracing::info!("KVM did not boot the guest kernel here; microVMs run under TCG");
        Accel::Tcg
    }
}
