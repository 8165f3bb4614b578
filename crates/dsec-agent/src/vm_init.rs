//! The agent as the init of a microVM (the initramfs's `/init`).
//!
//! Boot, before the edge says anything: mount /proc, /sys and a devtmpfs,
//! load the kernel modules the initramfs carries (their order is the file
//! names' order: Debian's cloud kernel builds virtio as modules, and a
//! module must follow the ones it needs), then find the agent's
//! virtio-serial port by its name (no udev here) and open it. The port is
//! the channel: QEMU connects its host side to the edge.
//!
//! Who can reach the port: only this process. virtio_console lets one
//! opener hold a port at a time (a second open gets EBUSY), the agent holds
//! it for its whole life, the sandbox's /dev has no vport node (it is the
//! same minimal /dev a container gets, on the writable disk), children
//! cannot mknod one (CAP_MKNOD is not in their bounding set), and the agent
//! is not dumpable, so /proc/1/fd is closed to them.
//!
//! Setup, on `SetupVm`: the layer disks (found by virtio-blk serial) are
//! mounted as EROFS, the writable disk as ext4, and the same root assembly
//! as a container's runs on top (`container_setup::assemble`), entered by
//! moving the new root over the initramfs (which cannot be pivoted away).

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use dsec_agent_proto::VmSetup;
use rustix::io::Errno;

use crate::container_setup::{assemble, check_abs, cstr, fail, mkdir, mount, Result, RootPlan, SetupError};

/// The name the edge gives the agent's virtio-serial port.
pub const PORT_NAME: &str = "dsec.agent";
/// Where the initramfs keeps the modules to load, as `NN-name.ko`.
pub const MODULES_DIR: &str = "/lib/modules/dsec";
/// What the agent prints on the console once booted, while it waits for
/// the host to connect (the edge's cue for a template's memory image).
pub const BOOTED_MARKER: &str = "dsec-agent: booted, waiting for the host";
/// How long boot waits for the port (and setup for a disk) to appear.
const DEVICE_WAIT: Duration = Duration::from_secs(20);

/// Whether this process is the init of a VM's initramfs.
pub fn is_vm_init(argv0: &str) -> bool {
    // SAFETY: getpid cannot fail.
    argv0 == "/init" && unsafe { libc::getpid() } == 1
}

/// Boot to a channel: mounts, modules, the port (opened on fd 3, where the
/// rest of the agent expects its channel). Errors go to the console.
pub fn boot() -> Result<()> {
    for (src, dir, fstype) in [(c"proc", c"/proc", c"proc"), (c"sysfs", c"/sys", c"sysfs"), (c"devtmpfs", c"/dev", c"devtmpfs")] {
        let _ = mkdir(dir, 0o755);
        mount(Some(src), dir, Some(fstype), libc::MS_NOSUID, None).map_err(fail(format!("mount {}", dir.to_string_lossy())))?;
    }
    load_modules()?;
    crate::vm_net::boot()?;
    apply_page_reporting_order();
    if probe_requested() {
        // The edge's accelerator probe: reaching here proves the kernel
        // runs; say so on the console and end the VM (-no-reboot turns
        // the reboot into an exit).
        eprintln!("DSEC-PROBE-OK");
        // SAFETY: reboot(2) with a valid command; nothing to flush.
        unsafe { libc::reboot(libc::RB_AUTOBOOT) };
    }
    port_to_channel()
}

/// Finds the agent's port, puts it on fd 3 (where the rest of the agent
/// expects its channel) and waits until the host side has a client.
pub fn port_to_channel() -> Result<()> {
    let port = find_port()?;
    if port.as_raw_fd() == crate::reattach::CHANNEL_FD {
        // Already where the channel belongs: keep it open.
        let _ = std::os::fd::IntoRawFd::into_raw_fd(port);
    } else {
        // SAFETY: dup2 onto fd 3, the channel's number; the original is
        // closed when `port` drops.
        if unsafe { libc::dup2(port.as_raw_fd(), crate::reattach::CHANNEL_FD) } < 0 {
            return Err(SetupError::last_os("dup2 the port"));
        }
    }
    // SAFETY: fd 3 now refers to the port; borrowed only for the wait.
    let chan = unsafe { std::os::fd::BorrowedFd::borrow_raw(crate::reattach::CHANNEL_FD) };
    if !host_connected(chan) {
        // The edge takes a node template's memory image at this line
        // (microvm/template.rs): nothing of any one sandbox is in the
        // guest yet, and the port is still unused.
        eprintln!("{BOOTED_MARKER}");
    }
    wait_host_connected_blocking(chan);
    Ok(())
}

fn probe_requested() -> bool {
    std::fs::read_to_string("/proc/cmdline").is_ok_and(|c| c.split_whitespace().any(|w| w == "dsec.probe"))
}

/// finit_module on every `*.ko` in [`MODULES_DIR`], in name order; then
/// the files go (their memory is the guest's).
fn load_modules() -> Result<()> {
    load_modules_from(MODULES_DIR)
}

/// finit_module on every `*.ko` in `dir`, in name order; then the files go.
pub(crate) fn load_modules_from(dir: &str) -> Result<()> {
    let Ok(dir) = std::fs::read_dir(dir) else { return Ok(()) };
    let mut files: Vec<_> = dir.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "ko")).collect();
    files.sort();
    for path in &files {
        let file = std::fs::File::open(path).map_err(|e| SetupError::io(format!("open {}", path.display()), &e))?;
        // SAFETY: finit_module with an open fd and an empty, NUL-terminated
        // parameter string.
        let r = unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), c"".as_ptr(), 0) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(SetupError::io(format!("load {}", path.display()), &e));
            }
        }
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// The kernel parameter that sets the smallest free block (as a buddy
/// order) the guest reports to the host through the balloon.
const REPORTING_ORDER_PARAM: &str = "page_reporting.page_reporting_order";
const REPORTING_ORDER_SYSFS: &str = "/sys/module/page_reporting/parameters/page_reporting_order";

/// Re-applies `page_reporting.page_reporting_order=N` from the kernel
/// command line once the balloon driver has registered. Linux 6.1 (the
/// guest kernel of Debian 12) overwrites the boot parameter with
/// pageblock_order (2 MiB blocks) when the driver registers, and at that
/// order a zone reports nothing until it has 32 blocks (64 MiB) free above
/// its low watermark: a small guest never gives a page back. Written after
/// the driver loaded, the parameter means what it says on every kernel.
/// Best effort: a guest that cannot report still runs.
fn apply_page_reporting_order() {
    let Ok(cmdline) = std::fs::read_to_string("/proc/cmdline") else { return };
    let Some(order) = cmdline_value(&cmdline, REPORTING_ORDER_PARAM) else { return };
    if let Err(e) = std::fs::write(REPORTING_ORDER_SYSFS, order) {
        eprintln!("dsec-agent: setting the page reporting order to {order}: {e}");
    }
}

/// The value of the last `name=value` word of a kernel command line (the
/// kernel, too, lets a later word win).
fn cmdline_value<'a>(cmdline: &'a str, name: &str) -> Option<&'a str> {
    cmdline.split_whitespace().rev().find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
}

/// Waits for the port named [`PORT_NAME`] and opens it.
fn find_port() -> Result<OwnedFd> {
    let deadline = Instant::now() + DEVICE_WAIT;
    loop {
        if let Some(dev) = port_device() {
            let path = format!("/dev/{dev}");
            // devtmpfs makes the node when the port is registered; the open
            // may still race it by a moment.
            match rustix::fs::open(
                path.as_str(),
                rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NOCTTY,
                rustix::fs::Mode::empty(),
            ) {
                Ok(fd) => return Ok(fd),
                Err(Errno::NOENT) => {}
                Err(e) => return Err(SetupError::new(format!("open {path}"), e)),
            }
        }
        if Instant::now() >= deadline {
            return Err(SetupError::new(format!("wait {DEVICE_WAIT:?} for the virtio-serial port {PORT_NAME}"), Errno::NODEV));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn port_device() -> Option<String> {
    for e in std::fs::read_dir("/sys/class/virtio-ports").ok()?.flatten() {
        if std::fs::read_to_string(e.path().join("name")).is_ok_and(|n| n.trim() == PORT_NAME) {
            return Some(e.file_name().to_string_lossy().into_owned());
        }
    }
    None
}

/// A virtio-serial port reports POLLHUP while its host side (QEMU's
/// socket to the edge) has no client. Frames written then would be lost,
/// so the agent speaks only once someone listens.
pub fn host_connected(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: poll on one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n >= 0 && p.revents & libc::POLLHUP == 0
}

fn wait_host_connected_blocking(fd: std::os::fd::BorrowedFd<'_>) {
    while !host_connected(fd) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The block device whose virtio-blk serial is `serial`.
pub(crate) fn disk_by_serial(serial: &str) -> Result<String> {
    let deadline = Instant::now() + DEVICE_WAIT;
    loop {
        if let Ok(dir) = std::fs::read_dir("/sys/block") {
            for e in dir.flatten() {
                if std::fs::read_to_string(e.path().join("serial")).is_ok_and(|s| s.trim() == serial) {
                    return Ok(format!("/dev/{}", e.file_name().to_string_lossy()));
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(SetupError::new(format!("find the disk with serial {serial:?}"), Errno::NODEV));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Builds the sandbox's root from the disks and enters it.
pub fn setup(cfg: &VmSetup) -> Result<()> {
    if cfg.layer_disks.is_empty() {
        return Err(SetupError::new("layer_disks is empty", Errno::INVAL));
    }
    for p in cfg.masked_paths.iter().chain(&cfg.readonly_paths) {
        check_abs("path", p)?;
    }
    set_clock(cfg.now_ms);
    let mut lower = Vec::with_capacity(cfg.layer_disks.len());
    for (i, serial) in cfg.layer_disks.iter().enumerate() {
        let dev = disk_by_serial(serial)?;
        let dir = format!("/layers/{i}");
        std::fs::create_dir_all(&dir).map_err(|e| SetupError::io(format!("mkdir {dir}"), &e))?;
        mount(Some(&cstr(&dev)?), &cstr(&dir)?, Some(c"erofs"), libc::MS_RDONLY | libc::MS_NODEV, None)
            .map_err(fail(format!("mount layer {serial} ({dev})")))?;
        lower.push(dir);
    }
    let scratch = "/scratch";
    mkdir(c"/scratch", 0o755).map_err(fail("mkdir /scratch"))?;
    let wr = disk_by_serial(&cfg.writable_disk)?;
    // noinit_itable: the template was made with lazy inode tables; zeroing
    // them in the background would only grow the sparse disk file.
    mount(Some(&cstr(&wr)?), c"/scratch", Some(c"ext4"), libc::MS_NOSUID | libc::MS_NODEV, Some(c"noinit_itable"))
        .map_err(fail(format!("mount the writable disk ({wr})")))?;
    let root = format!("{scratch}/root");
    let plan = RootPlan {
        scratch,
        root: &root,
        lower_dirs: &lower,
        sys_dir: "",
        masked_paths: &cfg.masked_paths,
        readonly_paths: &cfg.readonly_paths,
        hostname: &cfg.hostname,
        volumes: &[],
    };
    // The upper fd serves containers (tamper checks, pack_diff from the host).
    assemble(&plan, switch_root).map(drop)
}

/// The initramfs is the root mount itself and cannot be pivoted away:
/// move the new root over it and chroot (what switch_root(8) does).
fn switch_root(root: &CStr) -> Result<()> {
    rustix::process::chdir(root).map_err(fail("chdir to the new root"))?;
    mount(Some(c"."), c"/", None, libc::MS_MOVE, None).map_err(fail("move the new root to /"))?;
    rustix::process::chroot(".").map_err(fail("chroot"))?;
    rustix::process::chdir("/").map_err(fail("chdir /"))?;
    Ok(())
}

pub fn set_clock(now_ms: u64) {
    if now_ms == 0 {
        return;
    }
    let ts = libc::timespec { tv_sec: (now_ms / 1000) as libc::time_t, tv_nsec: ((now_ms % 1000) * 1_000_000) as libc::c_long };
    // SAFETY: clock_settime with a valid timespec.
    unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) };
}

/// Re-greets a later edge on the same port (after an edge restart): the
/// port stays ours, so the channel is a duplicate of it, used once the
/// host side has a client again.
pub async fn next_channel(port: &OwnedFd) -> std::io::Result<OwnedFd> {
    use std::os::fd::AsFd;
    // Short: after a restore the edge is waiting on the other side, and
    // every tick is resume latency.
    while !host_connected(port.as_fd()) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new fd we own.
    let fd = unsafe { libc::fcntl(port.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 5) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just created, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_word_of_a_kernel_parameter_wins() {
        let line = "quiet page_reporting.page_reporting_order=9 rdinit=/init page_reporting.page_reporting_order=5\n";
        assert_eq!(cmdline_value(line, REPORTING_ORDER_PARAM), Some("5"));
        assert_eq!(cmdline_value("quiet page_reporting.page_reporting_order_x=1", REPORTING_ORDER_PARAM), None);
        assert_eq!(cmdline_value("", REPORTING_ORDER_PARAM), None);
    }
}
