//! The busybox recipe: a static busybox, a symlink per applet, root and the
//! non-root `user`, and the usual top-level directories.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{chown, symlink, DirBuilderExt};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use super::tool::{self, BUSYBOX};
use super::users::{add_user, sandbox_user};
use super::{io_err, mkfs::mkfs_into_store, set_mode, BuildDir, BuildError, BuildOptions};
use crate::progress::{Progress, Unit};
use crate::store::{ImageStore, StoredLayer};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BusyboxRecipe {
    /// The busybox binary to install; `None` takes `busybox` from PATH.
    /// It must be statically linked (Debian's busybox-static is).
    pub busybox: Option<PathBuf>,
}

pub fn build_layer_busybox(
    store: &ImageStore,
    recipe: &BusyboxRecipe,
    options: &BuildOptions,
    progress: &dyn Progress,
) -> Result<StoredLayer, BuildError> {
    let busybox = match &recipe.busybox {
        Some(path) => path.clone(),
        None => find_on_path("busybox").ok_or(BuildError::ToolMissing { tool: BUSYBOX.name, package: BUSYBOX.package })?,
    };
    if !is_static_elf(&busybox)? {
        return Err(BuildError::BusyboxNotStatic { path: busybox });
    }
    let build = BuildDir::new(store, "busybox")?;
    let root = build.make_root()?;
    progress.stage("laying out the busybox root");
    make_dirs(&root)?;
    let installed = root.join("bin/busybox");
    fs::copy(&busybox, &installed).map_err(io_err("copying", &busybox))?;
    set_mode(&installed, 0o755)?;

    let applets = list_applets(&busybox)?;
    for (i, applet) in applets.iter().enumerate() {
        let link = root.join(applet);
        if link.symlink_metadata().is_ok() {
            continue; // bin/busybox itself, or listed twice
        }
        if let Some(parent) = link.parent() {
            fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
        }
        symlink("/bin/busybox", &link).map_err(io_err("creating symlink", &link))?;
        progress.advance(i as u64 + 1, Some(applets.len() as u64), Unit::Items);
    }

    write_accounts(&root)?;
    mkfs_into_store(store, &root, options, progress)
}

/// Directories with the modes a Unix root expects; /proc, /sys, /dev and
/// /run exist so the runtime can mount over them without writing to the
/// upper layer first.
fn make_dirs(root: &Path) -> Result<(), BuildError> {
    for (dir, mode) in [
        ("bin", 0o755),
        ("sbin", 0o755),
        ("usr/bin", 0o755),
        ("usr/sbin", 0o755),
        ("etc", 0o755),
        ("dev", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("run", 0o755),
        ("var", 0o755),
        ("var/tmp", 0o1777),
        ("tmp", 0o1777),
        ("root", 0o700),
        ("home", 0o755),
    ] {
        let path = root.join(dir);
        fs::DirBuilder::new().recursive(true).mode(0o755).create(&path).map_err(io_err("creating", &path))?;
        set_mode(&path, mode)?;
        chown(&path, Some(0), Some(0)).map_err(io_err("chown", &path))?;
    }
    Ok(())
}

fn write_accounts(root: &Path) -> Result<(), BuildError> {
    let days = crate::time::days_since_epoch();
    for (file, text, mode) in [
        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n".to_string(), 0o644),
        ("etc/group", "root:x:0:\n".to_string(), 0o644),
        ("etc/shadow", format!("root:*:{days}:0:99999:7:::\n"), 0o640),
    ] {
        let path = root.join(file);
        fs::write(&path, text).map_err(io_err("writing", &path))?;
        set_mode(&path, mode)?;
    }
    add_user(root, &sandbox_user("/bin/sh"))
}

/// Applet paths relative to the root, e.g. `bin/sh`, `usr/bin/awk`.
/// `--list-full` knows each applet's directory; older builds only have
/// `--list`, whose applets all go to /bin.
fn list_applets(busybox: &Path) -> Result<Vec<PathBuf>, BuildError> {
    let mut cmd = Command::new(busybox);
    cmd.arg("--list-full");
    let lines = match tool::run(&BUSYBOX, cmd, None) {
        Ok(lines) => lines,
        Err(BuildError::ToolFailed { .. }) => {
            let mut cmd = Command::new(busybox);
            cmd.arg("--list");
            tool::run(&BUSYBOX, cmd, None)?.into_iter().map(|name| format!("bin/{name}")).collect()
        }
        Err(e) => return Err(e),
    };
    lines
        .into_iter()
        .map(|line| {
            let path = PathBuf::from(line.trim().trim_start_matches('/'));
            // Only plain relative paths: a strange binary must not be able
            // to plant links outside the root.
            let plain = path.components().count() > 0 && path.components().all(|c| matches!(c, Component::Normal(_)));
            if plain {
                Ok(path)
            } else {
                Err(BuildError::BadApplet(line))
            }
        })
        .collect()
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(program))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// A 64- or 32-bit ELF with no `PT_INTERP` program header, i.e. one that
/// needs no dynamic loader (and so runs in a root without libc).
fn is_static_elf(path: &Path) -> Result<bool, BuildError> {
    const PT_INTERP: u32 = 3;
    let mut bytes = Vec::new();
    fs::File::open(path).and_then(|f| f.take(64 * 1024).read_to_end(&mut bytes)).map_err(io_err("reading", path))?;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
        return Ok(false);
    }
    let is64 = bytes[4] == 2;
    let little = bytes[5] == 1;
    let u16_at = |o: usize| {
        let b = [bytes[o], bytes[o + 1]];
        if little {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        }
    };
    let u32_at = |o: usize| {
        let b: [u8; 4] = bytes[o..o + 4].try_into().unwrap();
        if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    let (phoff, phentsize, phnum) = if is64 {
        let b: [u8; 8] = bytes[0x20..0x28].try_into().unwrap();
        let off = if little { u64::from_le_bytes(b) } else { u64::from_be_bytes(b) };
        (off as usize, u16_at(0x36) as usize, u16_at(0x38) as usize)
    } else {
        (u32_at(0x1c) as usize, u16_at(0x2a) as usize, u16_at(0x2c) as usize)
    };
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        if at + 4 > bytes.len() {
            return Ok(false); // headers beyond what we read: not a sane binary
        }
        if u32_at(at) == PT_INTERP {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_dynamic_binaries() {
        // Whatever runs this test is itself dynamically linked (std links libc).
        let me = std::env::current_exe().unwrap();
        assert!(!is_static_elf(&me).unwrap());
        let not_elf = tempfile::NamedTempFile::new().unwrap();
        fs::write(not_elf.path(), [0u8; 100]).unwrap();
        assert!(!is_static_elf(not_elf.path()).unwrap());
        if let Some(busybox) = find_on_path("busybox") {
            assert!(is_static_elf(&busybox).unwrap());
        }
    }
}
