//! Adding the sandbox's non-root user to a root filesystem by editing
//! passwd/group/shadow directly: no chroot, so nothing from the image runs
//! on the host during a build.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{chown, DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use super::{io_err, set_mode, BuildError};

/// The unprivileged account every default image has.
pub(crate) struct User {
    pub name: &'static str,
    pub uid: u32,
    pub gid: u32,
    pub home: &'static str,
    pub shell: &'static str,
}

/// `user`, uid/gid 1000, home /home/user, with the given login shell.
pub(crate) fn sandbox_user(shell: &'static str) -> User {
    User { name: "user", uid: 1000, gid: 1000, home: "/home/user", shell }
}

/// Adds `user` (and its primary group) unless an entry with that name
/// already exists, creates its home (copying /etc/skel's files), and adds
/// shadow/gshadow entries when those files exist.
pub(crate) fn add_user(root: &Path, user: &User) -> Result<(), BuildError> {
    let etc = root.join("etc");
    let days = crate::time::days_since_epoch();
    append_entry(
        &etc.join("passwd"),
        user.name,
        &format!("{0}:x:{1}:{2}:{0}:{3}:{4}", user.name, user.uid, user.gid, user.home, user.shell),
        0o644,
    )?;
    append_entry(&etc.join("group"), user.name, &format!("{}:x:{}:", user.name, user.gid), 0o644)?;
    // `*`: no password login; root in the sandbox can still `su user`.
    for (file, line) in [("shadow", format!("{}:*:{days}:0:99999:7:::", user.name)), ("gshadow", format!("{}:!::", user.name))] {
        let path = etc.join(file);
        if path.exists() {
            append_entry(&path, user.name, &line, 0o640)?;
        }
    }

    let home = root.join(user.home.trim_start_matches('/'));
    if !home.exists() {
        fs::DirBuilder::new().recursive(true).mode(0o755).create(&home).map_err(io_err("creating", &home))?;
    }
    set_mode(&home, 0o755)?;
    chown(&home, Some(user.uid), Some(user.gid)).map_err(io_err("chown", &home))?;
    copy_skel(&etc.join("skel"), &home, user)
}

/// Appends `line` to the colon-separated database at `path` unless an entry
/// for `name` is already there. Creates the file (with `mode`) if missing.
fn append_entry(path: &Path, name: &str, line: &str, mode: u32) -> Result<(), BuildError> {
    let existing = match fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_err("reading", path)(e)),
    };
    let prefix = format!("{name}:");
    if existing.lines().any(|l| l.starts_with(&prefix)) {
        return Ok(());
    }
    let mut file = OpenOptions::new().create(true).append(true).mode(mode).open(path).map_err(io_err("opening", path))?;
    let sep = if existing.is_empty() || existing.ends_with('\n') { "" } else { "\n" };
    file.write_all(format!("{sep}{line}\n").as_bytes()).map_err(io_err("writing", path))
}

/// Top-level regular files of /etc/skel (Debian's .bashrc, .profile, ...).
fn copy_skel(skel: &Path, home: &Path, user: &User) -> Result<(), BuildError> {
    let Ok(entries) = fs::read_dir(skel) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry.map_err(io_err("listing", skel))?;
        let src = entry.path();
        if !entry.file_type().map_err(io_err("reading", &src))?.is_file() {
            continue;
        }
        let dst = home.join(entry.file_name());
        if dst.exists() {
            continue;
        }
        fs::copy(&src, &dst).map_err(io_err("copying", &src))?;
        chown(&dst, Some(user.uid), Some(user.gid)).map_err(io_err("chown", &dst))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_once_and_keeps_existing_lines() {
        let root = tempfile::tempdir().unwrap();
        let etc = root.path().join("etc");
        fs::create_dir_all(etc.join("skel")).unwrap();
        fs::write(etc.join("passwd"), "root:x:0:0:root:/root:/bin/bash").unwrap(); // no final newline
        fs::write(etc.join("group"), "root:x:0:\n").unwrap();
        fs::write(etc.join("shadow"), "root:*:19000:0:99999:7:::\n").unwrap();
        fs::write(etc.join("skel/.profile"), "# profile\n").unwrap();
        let user = sandbox_user("/bin/bash");
        add_user(root.path(), &user).unwrap();
        add_user(root.path(), &user).unwrap();

        let passwd = fs::read_to_string(etc.join("passwd")).unwrap();
        assert_eq!(passwd, "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n");
        assert_eq!(fs::read_to_string(etc.join("group")).unwrap(), "root:x:0:\nuser:x:1000:\n");
        let shadow = fs::read_to_string(etc.join("shadow")).unwrap();
        assert_eq!(shadow.lines().filter(|l| l.starts_with("user:*:")).count(), 1);
        assert!(!etc.join("gshadow").exists(), "only edited when present");

        use std::os::unix::fs::MetadataExt;
        let home = fs::metadata(root.path().join("home/user")).unwrap();
        assert_eq!((home.uid(), home.gid(), home.mode() & 0o7777), (1000, 1000, 0o755));
        let profile = fs::metadata(root.path().join("home/user/.profile")).unwrap();
        assert_eq!(profile.uid(), 1000);
    }
}
