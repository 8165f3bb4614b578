//! The QEMU layer both VM backends sit on: `microvm/` (QEMU's `microvm`
//! machine booting the edge's kernel) and `fullvm/` (`q35` booting an
//! image's own disk) differ in their command lines, disks and boot; how a
//! QEMU is started, talked to, suspended, restored, networked and cleaned
//! up after is the same for both, and lives here, one job per file.
//!
//! Nothing here knows which machine it runs: a caller hands over its
//! argv, its [`cmdline::VmFiles`] and its sandbox's cgroup. A start is
//! the same sequence in both backends: make the cgroup and files, under
//! an [`undo::Undo`] guard; spawn QEMU ([`process`]); then one boot tail
//! ([`agent::boot_to_ready`]: agent, setup, resolver, within the boot
//! timeout); the guard, disarmed, hands over the sandbox's instance.

pub mod agent;
pub mod cleanup;
pub mod cmdline;
pub mod disk;
pub mod net;
pub mod process;
pub mod qmp;
pub mod suspend;
pub mod undo;
