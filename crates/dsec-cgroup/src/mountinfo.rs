//! Finding cgroup hierarchies from /proc/self/mountinfo (parsed by
//! dsec-image's mountinfo reader, the workspace's one parser of it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dsec_image::mountinfo::MountEntry;

use super::{io_err, CgroupError};

#[derive(Debug, Clone, Default)]
pub struct CgroupMounts {
    /// v1 controller name -> mount point (co-mounted controllers share one).
    pub v1: BTreeMap<String, PathBuf>,
    /// The cgroup2 mount point, if any.
    pub v2: Option<PathBuf>,
}

pub fn find_cgroup_mounts(mountinfo: &Path) -> Result<CgroupMounts, CgroupError> {
    let entries = dsec_image::mountinfo::read_from(mountinfo).map_err(|e| io_err(mountinfo, e))?;
    Ok(from_entries(&entries))
}

fn from_entries(entries: &[MountEntry]) -> CgroupMounts {
    let mut m = CgroupMounts::default();
    for e in entries {
        // Only whole hierarchies (root "/") are usable for our own subtree.
        if e.root != Path::new("/") {
            continue;
        }
        match e.fs_type.as_str() {
            "cgroup2" => {
                m.v2.get_or_insert_with(|| e.mount_point.clone());
            }
            "cgroup" => {
                for opt in e.super_options.split(',') {
                    if matches!(opt, "cpu" | "cpuacct" | "memory" | "pids" | "freezer" | "cpuset" | "devices" | "blkio") {
                        m.v1.entry(opt.to_string()).or_insert_with(|| e.mount_point.clone());
                    }
                }
            }
            _ => {}
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> CgroupMounts {
        from_entries(&dsec_image::mountinfo::parse(text))
    }

    #[test]
    fn parses_hybrid_layout() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        let m = parse(text);
        assert_eq!(m.v1["cpu"], PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(m.v1["cpuacct"], PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(m.v1["memory"], PathBuf::from("/sys/fs/cgroup/memory"));
        assert!(!m.v1.contains_key("name=systemd"));
        assert_eq!(m.v2, Some(PathBuf::from("/sys/fs/cgroup/unified")));
    }

    #[test]
    fn pure_v2_and_escapes() {
        let text = "29 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n\
                    30 1 0:27 /sub /mnt/x rw - cgroup cgroup rw,memory\n\
                    31 1 0:28 / /mnt/with\\040space rw - cgroup cgroup rw,pids\n";
        let m = parse(text);
        assert_eq!(m.v2, Some(PathBuf::from("/sys/fs/cgroup")));
        assert!(!m.v1.contains_key("memory"), "a non-root bind of a hierarchy is not usable");
        assert_eq!(m.v1["pids"], PathBuf::from("/mnt/with space"));
    }
}
