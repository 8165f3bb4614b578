//! The microVM guest: Debian's cloud kernel and the initramfs around the
//! guest agent.
//!
//! Setup fetches the kernel package with apt (`apt-get download`, never an
//! install: the host's /boot and its hooks are left alone), unpacks it with
//! `dpkg-deb -x` into a temporary directory and keeps only the kernel image
//! and the few modules a guest needs, under `<images>/vm/kernel`. The
//! initramfs is that module set plus the statically linked agent as
//! `/init`; it is cheap to build (a few MB of cpio), so whoever starts VMs
//! builds it for the agent it runs, cached by content.

pub mod base_image;
mod initramfs;
pub mod mbr;

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::build::tool::{self, APT_GET, DPKG_DEB};
use crate::build::{io_err, BuildError};
use crate::progress::Progress;

pub use initramfs::{build_initramfs, initramfs_name};

/// The Debian package whose dependency is the current cloud kernel.
pub const KERNEL_PACKAGE: &str = "linux-image-cloud-amd64";

/// Modules the guest loads, in this order (each after what it needs):
/// virtio over MMIO, the serial channel, block disks, EROFS (which needs
/// libcrc32c), overlayfs, the balloon. Everything else the guest uses
/// (ext4, devtmpfs, the 8250 console) is built into the cloud kernel.
pub const GUEST_MODULES: &[&str] =
    &["virtio_ring", "virtio", "virtio_mmio", "virtio_console", "virtio_blk", "libcrc32c", "erofs", "overlay", "virtio_balloon"];

/// Modules a networked microVM loads after [`GUEST_MODULES`] (asked for on
/// the kernel command line): the virtio NIC its QEMU's user-mode network
/// sits behind. Optional: a kernel directory set up before networked
/// microVMs existed lacks them, and such a node refuses microVMs with
/// network rules until `dsec image setup` runs again.
pub const NET_MODULES: &[&str] = &["failover", "net_failover", "virtio_net"];

/// A kernel ready to boot, as kept by setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmKernel {
    /// `<images>/vm/kernel`.
    pub dir: PathBuf,
    /// The kernel release, e.g. `6.1.0-57-cloud-amd64`.
    pub version: String,
    pub vmlinuz: PathBuf,
    /// The modules of [`GUEST_MODULES`], in load order.
    pub modules: Vec<PathBuf>,
    /// The modules of [`NET_MODULES`], in load order; empty if any is
    /// missing (the guest then has no NIC driver).
    pub net_modules: Vec<PathBuf>,
}

/// Where the VM assets live in an image store directory.
pub fn vm_dir(images_dir: &Path) -> PathBuf {
    images_dir.join("vm")
}

/// The kernel setup left in `vm_dir`, if complete.
pub fn find_kernel(vm_dir: &Path) -> Result<VmKernel, BuildError> {
    let dir = vm_dir.join("kernel");
    let missing = || BuildError::InvalidRecipe(format!("no microVM kernel in {}: run `dsec image setup`", dir.display()));
    let version = std::fs::read_to_string(dir.join("version")).map_err(|_| missing())?.trim().to_string();
    let vmlinuz = dir.join("vmlinuz");
    let modules: Vec<PathBuf> = GUEST_MODULES.iter().map(|m| dir.join("modules").join(format!("{m}.ko"))).collect();
    if version.is_empty() || !vmlinuz.is_file() || modules.iter().any(|m| !m.is_file()) {
        return Err(missing());
    }
    let net_modules: Vec<PathBuf> = NET_MODULES.iter().map(|m| dir.join("modules").join(format!("{m}.ko"))).collect();
    let net_modules = if net_modules.iter().all(|m| m.is_file()) { net_modules } else { Vec::new() };
    Ok(VmKernel { dir, version, vmlinuz, modules, net_modules })
}

/// The kernel in `vm_dir`, fetched first if absent. `package` is normally
/// [`KERNEL_PACKAGE`].
pub fn ensure_kernel(vm_dir: &Path, package: &str, progress: &dyn Progress) -> Result<VmKernel, BuildError> {
    match find_kernel(vm_dir) {
        Ok(k) if !k.net_modules.is_empty() => {
            progress.stage(&format!("microVM kernel {} already present", k.version));
            return Ok(k);
        }
        // Set up before networked microVMs: fetched again, with them.
        Ok(k) => progress.stage(&format!("microVM kernel {} lacks the network modules: fetching again", k.version)),
        Err(_) => {}
    }
    std::fs::create_dir_all(vm_dir).map_err(io_err("creating", vm_dir))?;
    let work = tempfile_dir(vm_dir)?;
    let result = fetch_into(&work, package, progress).and_then(|staged| {
        let dest = vm_dir.join("kernel");
        // A damaged earlier attempt is replaced whole.
        if dest.exists() {
            std::fs::remove_dir_all(&dest).map_err(io_err("removing", &dest))?;
        }
        std::fs::rename(&staged, &dest).map_err(io_err("moving into place", &dest))?;
        find_kernel(vm_dir)
    });
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn tempfile_dir(parent: &Path) -> Result<PathBuf, BuildError> {
    let dir = parent.join(format!(".fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
    Ok(dir)
}

/// Downloads and unpacks the kernel into `work`; returns the staged
/// `kernel` directory.
fn fetch_into(work: &Path, package: &str, progress: &dyn Progress) -> Result<PathBuf, BuildError> {
    progress.stage(&format!("downloading {package}"));
    let meta = download(work, package, progress)?;
    // The meta package depends on exactly one versioned image package.
    let depends = tool::run(&DPKG_DEB, cmd("dpkg-deb", &["-f", path_str(&meta)?, "Depends"]), None)?.join(" ");
    let image_pkg = image_package(&depends)
        .ok_or_else(|| BuildError::InvalidRecipe(format!("{package} depends on no linux-image package ({depends:?})")))?;
    progress.stage(&format!("downloading {image_pkg}"));
    let deb = download(work, &image_pkg, progress)?;
    progress.stage(&format!("unpacking {image_pkg}"));
    let unpacked = work.join("unpacked");
    tool::run(&DPKG_DEB, cmd("dpkg-deb", &["-x", path_str(&deb)?, path_str(&unpacked)?]), None)?;
    let version = image_pkg.trim_start_matches("linux-image-").to_string();
    let staged = work.join("kernel");
    let modules_out = staged.join("modules");
    std::fs::create_dir_all(&modules_out).map_err(io_err("creating", &modules_out))?;
    let vmlinuz = unpacked.join("boot").join(format!("vmlinuz-{version}"));
    std::fs::copy(&vmlinuz, staged.join("vmlinuz")).map_err(io_err("copying", &vmlinuz))?;
    let tree = unpacked.join("lib/modules").join(&version).join("kernel");
    for m in GUEST_MODULES.iter().chain(NET_MODULES) {
        let found = find_module(&tree, m).ok_or_else(|| BuildError::InvalidRecipe(format!("{image_pkg} has no module {m}.ko")))?;
        std::fs::copy(&found, modules_out.join(format!("{m}.ko"))).map_err(io_err("copying", &found))?;
    }
    std::fs::write(staged.join("version"), format!("{version}\n")).map_err(io_err("writing", &staged))?;
    progress.stage(&format!("microVM kernel {version} ready"));
    Ok(staged)
}

fn cmd(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

fn path_str(p: &Path) -> Result<&str, BuildError> {
    p.to_str().ok_or_else(|| BuildError::InvalidRecipe(format!("non-UTF-8 path {}", p.display())))
}

/// `apt-get download` into `dir`; returns the .deb it fetched.
fn download(dir: &Path, package: &str, progress: &dyn Progress) -> Result<PathBuf, BuildError> {
    let mut c = cmd("apt-get", &["download", "-q", package]);
    c.current_dir(dir);
    tool::run(&APT_GET, c, Some(progress))?;
    let prefix = format!("{package}_");
    std::fs::read_dir(dir)
        .map_err(io_err("listing", dir))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb")))
        .ok_or_else(|| BuildError::InvalidRecipe(format!("apt-get download {package} left no .deb")))
}

/// `linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)` -> the package name.
fn image_package(depends: &str) -> Option<String> {
    depends
        .split(',')
        .flat_map(|alt| alt.split('|'))
        .map(|d| d.split_whitespace().next().unwrap_or(""))
        .find(|name| name.starts_with("linux-image-"))
        .map(str::to_string)
}

fn find_module(tree: &Path, name: &str) -> Option<PathBuf> {
    let want = format!("{name}.ko");
    let mut stack = vec![tree.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.file_name().to_str() == Some(want.as_str()) {
                return Some(p);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_meta_package_names_its_image_package() {
        assert_eq!(image_package("linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)").as_deref(), Some("linux-image-6.1.0-57-cloud-amd64"));
        assert_eq!(image_package("foo, linux-image-6.1.0-9-cloud-amd64").as_deref(), Some("linux-image-6.1.0-9-cloud-amd64"));
        assert_eq!(image_package("libc6"), None);
    }

    #[test]
    fn a_missing_kernel_says_how_to_get_one() {
        let dir = tempfile::tempdir().unwrap();
        let e = find_kernel(dir.path()).unwrap_err().to_string();
        assert!(e.contains("dsec image setup"), "{e}");
    }
}
