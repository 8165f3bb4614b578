//! What both VM backends' QEMU command lines share: the accelerator, a
//! VM's files on the host (sockets, logs, writable disk), the guest
//! agent's port name, disk names and formats, vCPUs for a CPU limit.
//! Each machine's argv is its backend's (`microvm::cmdline`,
//! `fullvm::cmdline`).

use std::path::{Path, PathBuf};

/// How guest code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation.
    Kvm,
    /// QEMU's software emulation (no usable KVM).
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// The node flag: `auto` probes KVM once (a real boot), the others force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccelChoice {
    #[default]
    Auto,
    Kvm,
    Tcg,
}

impl std::str::FromStr for AccelChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(AccelChoice::Auto),
            "kvm" => Ok(AccelChoice::Kvm),
            "tcg" => Ok(AccelChoice::Tcg),
            other => Err(format!("VM acceleration must be auto, kvm or tcg, not {other:?}")),
        }
    }
}

/// TCG's translation cache per VM by default, MiB. An idle guest's QEMU
/// keeps the whole cache resident (it is refilled, not freed, when full):
/// 64 MiB held ~50 MiB after boot, 16 MiB holds 16 (benchmarks.md).
pub const DEFAULT_TB_SIZE_MB: u32 = 16;

/// The virtio-serial port name the guest agent looks for.
pub const AGENT_PORT: &str = "dsec.agent";

/// The virtio-blk serial of read-only layer `i`.
pub fn layer_serial(i: usize) -> String {
    format!("dsec-l{i}")
}

/// Files of one VM on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct VmFiles {
    /// Directory of the sockets and logs (short path: socket names are
    /// limited to 108 bytes).
    pub run_dir: PathBuf,
    /// The writable disk.
    pub disk: PathBuf,
}

impl VmFiles {
    pub fn agent_socket(&self) -> PathBuf {
        self.run_dir.join("agent.sock")
    }
    pub fn qmp_socket(&self) -> PathBuf {
        self.run_dir.join("qmp.sock")
    }
    pub fn console_log(&self) -> PathBuf {
        self.run_dir.join("console.log")
    }
}

/// A disk's format by its name: `.qcow2` files are qcow2 overlays, the
/// rest raw.
pub fn disk_format(p: &Path) -> &'static str {
    if p.extension().is_some_and(|e| e == "qcow2") {
        "qcow2"
    } else {
        "raw"
    }
}

/// vCPUs for a CPU limit: whole cores, at least one (the cgroup's quota
/// still caps the fraction).
pub fn vcpus_for(cpu_cores: f64) -> u32 {
    (cpu_cores.ceil() as u32).clamp(1, 64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vcpus_round_up_to_whole_cores() {
        assert_eq!(vcpus_for(0.25), 1);
        assert_eq!(vcpus_for(1.0), 1);
        assert_eq!(vcpus_for(1.5), 2);
        assert_eq!(vcpus_for(0.0), 1);
    }

    #[test]
    fn accel_choice_parses_and_refuses_others() {
        assert_eq!("auto".parse::<AccelChoice>(), Ok(AccelChoice::Auto));
        assert_eq!("tcg".parse::<AccelChoice>(), Ok(AccelChoice::Tcg));
        assert!("xen".parse::<AccelChoice>().is_err());
    }
}
