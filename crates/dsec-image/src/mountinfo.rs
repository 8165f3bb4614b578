//! Reading /proc/self/mountinfo: the kernel's own record of what is mounted,
//! which survives a restart of the process that made the mounts. The one
//! parser of it in the workspace (the edge finds its cgroup hierarchies
//! with it too).

use std::io;
use std::path::{Path, PathBuf};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The directory of the filesystem that is mounted ("/" for a whole
    /// filesystem, a subdirectory for a bind mount of part of one).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
    /// The superblock's options, comma-separated (for a v1 cgroup
    /// hierarchy: its controllers).
    pub super_options: String,
}

/// This process's mount table.
pub fn read() -> io::Result<Vec<MountEntry>> {
    read_from(Path::new("/proc/self/mountinfo"))
}

/// The mount table in a mountinfo file (another process's, or a test's).
pub fn read_from(path: &Path) -> io::Result<Vec<MountEntry>> {
    Ok(parse(&std::fs::read_to_string(path)?))
}

/// Lines look like
/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`:
/// the mount point is field 5; after the ` - ` separator come the filesystem
/// type and the source. The optional fields before the separator vary in
/// number, hence the search for `-`.
pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let root = fields.nth(3)?;
            let mount_point = fields.next()?;
            let mut rest = fields.skip_while(|f| *f != "-");
            rest.next()?; // the separator
            let fs_type = rest.next()?;
            let source = rest.next().unwrap_or("");
            let super_options = rest.next().unwrap_or("");
            Some(MountEntry {
                root: PathBuf::from(unescape(root)),
                mount_point: PathBuf::from(unescape(mount_point)),
                fs_type: unescape(fs_type),
                source: unescape(source),
                super_options: unescape(super_options),
            })
        })
        .collect()
}

/// The kernel writes space, tab, newline and backslash as `\ooo` octal.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let oct = &bytes[i + 1..i + 4];
            if oct.iter().all(|b| (b'0'..=b'7').contains(b)) {
                let v = oct.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                out.push(v as u8);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount points at or below `dir`, deepest first (the order to detach them).
pub fn mounts_under(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = read()?.into_iter().map(|m| m.mount_point).filter(|p| p.starts_with(dir)).collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    Ok(found)
}

/// Whether `dir` itself is a mount point.
pub fn is_mount_point(dir: &Path) -> io::Result<bool> {
    Ok(read()?.iter().any(|m| m.mount_point == dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_optional_fields_and_escapes() {
        let text = "\
36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 shared:2 - ext3 /dev/root rw
40 27 0:50 / /data/layers/abc ro,nosuid,nodev - erofs /data/blobs/abc.erofs ro
41 27 0:51 / /x rw - tmpfs tmpfs rw
";
        let m = parse(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(m[0].root, PathBuf::from("/mnt1"));
        assert_eq!(m[0].fs_type, "ext3");
        assert_eq!(m[0].super_options, "rw");
        assert_eq!(m[1].fs_type, "erofs");
        assert_eq!(m[1].source, "/data/blobs/abc.erofs");
        assert_eq!(m[2].mount_point, PathBuf::from("/x"));
    }

    #[test]
    fn reads_own_table() {
        assert!(read().unwrap().iter().any(|m| m.mount_point == Path::new("/")));
    }
}
