//! The agent as a service of a full VM's own operating system
//! (`dsec-agent guest`, started at boot by the guest's init, e.g. the
//! `dsec-agent.service` unit of the `debian-vm` image).
//!
//! Unlike a microVM's agent it builds no root: the guest booted from its
//! own disk, and that disk's root is the sandbox's. It finds its
//! virtio-serial port by name exactly as a microVM's agent does (the
//! guest's udev loads `virtio_console`; the port is polled for until it
//! appears), then speaks the same protocol; the setup request carries no
//! disks and only sets the clock and the hostname. It is not PID 1, so it
//! becomes a child subreaper (orphans of its commands come back to it) and
//! kills by process group, never `kill(-1)`, which would end the guest's
//! own services too.

use dsec_agent_proto::VmSetup;

/// Finds the port and puts it on fd 3 (before `prepare_process`).
pub fn attach() -> Result<(), String> {
    crate::vm_init::port_to_channel()
}

/// The setup of a full VM: no disks, only the guest's clock and hostname.
pub fn setup(cfg: &VmSetup) -> Result<(), String> {
    if !cfg.layer_disks.is_empty() || !cfg.writable_disk.is_empty() {
        return Err("a full VM's agent serves the guest's own root: the setup must name no disks".into());
    }
    crate::vm_init::set_clock(cfg.now_ms);
    rustix::system::sethostname(cfg.hostname.as_bytes()).map_err(|e| format!("sethostname: {e}"))?;
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(format!("becoming a child subreaper: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}
