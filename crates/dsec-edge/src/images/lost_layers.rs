//! Layers an earlier edge process served on demand and took with it.
//!
//! On-demand layer data reaches a sandbox through a FUSE file that this
//! process serves (`dsec_image::lazy`). When the edge dies, the kernel
//! ends that FUSE connection: a sandbox whose layers were mounted from
//! those files (a container's overlay lower dirs, a VM's layer disks) can
//! no longer read anything that is not already in its page cache. The
//! restarted edge cannot serve the old connection again, so recovery
//! removes such a sandbox and reports it failed with this reason, instead
//! of re-adopting something that fails at its next read.

use std::path::PathBuf;

/// The reason a sandbox that used them is failed with.
pub const LOST_REASON: &str = "its layers were loaded on demand through the edge process that stopped, \
     and their data can no longer be read; create it again";

/// What the earlier process left behind (found and detached at startup,
/// before any sandbox is recovered).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LostLayers {
    /// Layer mount points whose EROFS mounts read from the dead files: a
    /// container's overlay names them among its lower dirs.
    pub mounts: Vec<PathBuf>,
    /// The directory the files were served in: a VM's command line names
    /// its layer disks there.
    pub files: Option<PathBuf>,
}

impl LostLayers {
    pub fn is_empty(&self) -> bool {
        self.mounts.is_empty() && self.files.is_none()
    }

    /// Whether a sandbox depends on them: its agent's overlay (read from
    /// the agent's mount table) has a lost layer as a lower dir, or one of
    /// its processes was started on a lost layer file.
    pub fn used_by(&self, agent: Option<i32>, pids: &[i32]) -> bool {
        if self.is_empty() {
            return false;
        }
        if let Some(pid) = agent {
            if let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) {
                if overlay_uses_any(&table, &self.mounts) {
                    return true;
                }
            }
        }
        let Some(files) = &self.files else { return false };
        let files = files.to_string_lossy();
        pids.iter()
            .chain(agent.iter())
            .any(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(files.as_ref())))
    }
}

/// Whether an overlay mount in `mountinfo` names one of `mounts` in its
/// options (lowerdir=a:b or lowerdir+=a, as the kernel shows them).
fn overlay_uses_any(mountinfo: &str, mounts: &[PathBuf]) -> bool {
    dsec_image::mountinfo::parse(mountinfo)
        .iter()
        .filter(|m| m.fs_type == "overlay")
        .any(|m| m.super_options.split([',', ':', '=']).any(|part| mounts.iter().any(|layer| layer.as_os_str() == part)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
100 90 0:55 / / rw,nosuid - overlay overlay rw,lowerdir=/d/layers/bbbb:/d/layers/aaaa,upperdir=/d/up,workdir=/d/w
101 100 0:56 / /proc rw - proc proc rw
102 90 0:57 / /d/layers/cccc ro - erofs /d/layers/.on-demand/cccc.erofs ro
";

    #[test]
    fn only_an_overlay_lower_dir_counts() {
        assert!(overlay_uses_any(TABLE, &[PathBuf::from("/d/layers/aaaa")]));
        // A layer mounted in the table but not under the overlay.
        assert!(!overlay_uses_any(TABLE, &[PathBuf::from("/d/layers/cccc")]));
        // A prefix of a lower dir is not that lower dir.
        assert!(!overlay_uses_any(TABLE, &[PathBuf::from("/d/layers/aa")]));
        let plus = "1 0 0:1 / / rw - overlay overlay rw,lowerdir+=/d/layers/aaaa,upperdir=/u";
        assert!(overlay_uses_any(plus, &[PathBuf::from("/d/layers/aaaa")]));
    }

    #[test]
    fn nothing_lost_is_used_by_nobody() {
        assert!(!LostLayers::default().used_by(Some(std::process::id() as i32), &[]));
    }
}
