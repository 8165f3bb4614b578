//! The agent as a service of a full VM's own operating system
//! (`dsec-agent guest`, started at boot by the guest's init, e.g. the
//! `dsec-agent.service` unit of the `debian-vm` image).
//!
//! Unlike a microVM's agent it builds no root: the guest booted from its
//! own disk, and that disk's root is the sandbox's. It finds its
//! virtio-serial port by name exactly as a microVM's agent does (the
//! guest's udev loads `virtio_console`; the port is polled for until it
//! appears), then speaks the same protocol; the setup request carries no
//! disks and only sets the clock, the hostname and, for a networked VM,
//! the NIC's addresses (`vm_net::configure_nic`). It is not PID 1, so it
//! becomes a child subreaper (orphans of its commands come back to it) and
//! kills by process group, never `kill(-1)`, which would end the guest's
//! own services too.
//!
//! Read-only layers the edge attaches (`layer_disks`) are mounted as EROFS
//! at `/opt/dsec/layers/<i>`: `pmemN` names a virtio-pmem device, mounted
//! with DAX (the guest reads the host's page cache of the layer file
//! directly, no copy in its own memory); anything else is a virtio-blk
//! serial, as for microVMs.

use dsec_agent_proto::VmSetup;
use rustix::io::Errno;

use crate::container_setup::{cstr, fail, mount, SetupError};

/// Where a full VM's read-only layers appear in the guest.
pub const LAYERS_DIR: &str = "/opt/dsec/layers";

/// Finds the port and puts it on fd 3 (before `prepare_process`).
pub fn attach() -> Result<(), SetupError> {
    crate::vm_init::port_to_channel()
}

/// The setup of a full VM: no disks, only the guest's clock, hostname and
/// NIC.
pub fn setup(cfg: &VmSetup) -> Result<(), SetupError> {
    if !cfg.writable_disk.is_empty() {
        // A full VM's agent serves the guest's own root.
        return Err(SetupError::new("a full VM's setup naming a writable disk", Errno::INVAL));
    }
    for (i, name) in cfg.layer_disks.iter().enumerate() {
        mount_layer(i, name)?;
    }
    crate::vm_init::set_clock(cfg.now_ms);
    if let Some(nic) = &cfg.nic {
        let t0 = std::time::Instant::now();
        let name = crate::vm_net::configure_nic(nic)?;
        // To the guest's journal: where a networked VM's boot waited.
        eprintln!("dsec-agent: {name} set to {}/{} via {} in {} ms", nic.address, nic.prefix, nic.gateway, t0.elapsed().as_millis());
    }
    rustix::system::sethostname(cfg.hostname.as_bytes()).map_err(fail("sethostname"))?;
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(SetupError::last_os("become a child subreaper"));
    }
    Ok(())
}

fn mount_layer(i: usize, name: &str) -> Result<(), SetupError> {
    let dir = format!("{LAYERS_DIR}/{i}");
    std::fs::create_dir_all(&dir).map_err(|e| SetupError::io(format!("mkdir {dir}"), &e))?;
    let flags = libc::MS_RDONLY | libc::MS_NODEV | libc::MS_NOSUID;
    if name.strip_prefix("pmem").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
        let dev = format!("/dev/{name}");
        wait_for(&dev)?;
        mount(Some(&cstr(&dev)?), &cstr(&dir)?, Some(c"erofs"), flags, Some(c"dax=always"))
            .map_err(fail(format!("mount layer {dev} with DAX")))
    } else {
        let dev = crate::vm_init::disk_by_serial(name)?;
        mount(Some(&cstr(&dev)?), &cstr(&dir)?, Some(c"erofs"), flags, None).map_err(fail(format!("mount layer {name} ({dev})")))
    }
}

/// The guest's udev loads the pmem drivers from the device's modalias; the
/// node appears a moment after boot, or tens of seconds on a loaded host
/// under TCG (several guests booting at once: 20 s was seen to be short).
fn wait_for(dev: &str) -> Result<(), SetupError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while !std::path::Path::new(dev).exists() {
        if std::time::Instant::now() >= deadline {
            return Err(SetupError { step: format!("wait for {dev}"), errno: Errno::NODEV });
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}
