//! What a VM leaves on the host and how it goes: its cgroup's processes,
//! its run directory, disk and other files, the cgroup itself; a start cut
//! short; the reaper's pass over files no sandbox owns any more.

use std::path::{Path, PathBuf};

use super::cmdline::VmFiles;
use crate::cgroup::Cgroups;
use crate::error::EdgeError;

/// What is left of VM `id` once its QEMU is gone: stray processes of its
/// cgroup, its run directory, its disk and the backend's `extra` files
/// (missing ones are fine), the cgroup, and its network if it has one
/// (`egress`: the node's, released whatever else failed); `Backend::cleanup`
/// of both VM backends.
pub(crate) fn cleanup_vm(
    cgroups: &Cgroups,
    egress: Option<&dsec_net::Egress>,
    id: &str,
    files: &VmFiles,
    extra: &[PathBuf],
) -> Result<(), EdgeError> {
    let done = remove_vm(cgroups, id, files, extra);
    if let Some(eg) = egress {
        eg.release(id);
    }
    done
}

/// All of [`cleanup_vm`] but the network.
fn remove_vm(cgroups: &Cgroups, id: &str, files: &VmFiles, extra: &[PathBuf]) -> Result<(), EdgeError> {
    cgroups.kill_all(id);
    let _ = std::fs::remove_dir_all(&files.run_dir);
    for f in std::iter::once(&files.disk).chain(extra) {
        match std::fs::remove_file(f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(EdgeError::io("removing", f)(e)),
        }
    }
    cgroups.remove(id).map_err(EdgeError::from)
}

/// `Backend::abort_start` of both VM backends: a boot takes seconds (a
/// minute for a full VM under TCG), its QEMU is in the sandbox's cgroup
/// from its exec on, and the boot fails as soon as it is gone.
pub(crate) fn abort_boot(cgroups: &Cgroups, id: &str) -> bool {
    cgroups.kill_all(id);
    true
}

/// Removes the files `<id><suffix>` in `dir` whose id is `ours` (the
/// reaper's pass over a VM backend's files); returns how many.
pub(crate) fn reap_dir(dir: &Path, suffix: &str, mut ours: impl FnMut(&str) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut gone = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.strip_suffix(suffix).is_some_and(&mut ours) && std::fs::remove_file(e.path()).is_ok() {
            gone += 1;
        }
    }
    gone
}
