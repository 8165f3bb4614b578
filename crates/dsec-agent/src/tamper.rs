//! Noticing that the sandbox changed the programs its commands run through.
//!
//! The agent runs every shell command through the image's shell. A sandbox
//! may replace it (DSec saw /bin/bash overwritten to tamper with later
//! sessions): that only affects the sandbox's own commands, since the
//! platform never runs an image program for itself, but the first use of a
//! changed shell (or of an /etc/ld.so.preload, which every dynamically
//! linked program loads) is recorded as an audit event.
//!
//! A changed image file is one that exists in the overlay's upper
//! directory (copy-up happens on any write, chmod or chown; metacopy is
//! off), so one fstatat per watched path tells, without reading anything.

use std::cell::{Cell, RefCell};
use std::os::fd::OwnedFd;

use crate::audit::Ring;

/// Watched in addition to the shell itself.
const ALSO_WATCHED: &[&str] = &["/etc/ld.so.preload"];

#[derive(Default)]
pub struct Watch {
    /// Already reported (once per sandbox is enough to raise the flag).
    reported: Cell<bool>,
}

impl Watch {
    /// `upper`: the overlay's upper directory (None outside containers).
    pub fn check(&self, upper: Option<&OwnedFd>, shell: &str, audit: &RefCell<Ring>) {
        let Some(upper) = upper else { return };
        if self.reported.get() {
            return;
        }
        for path in std::iter::once(shell).chain(ALSO_WATCHED.iter().copied()) {
            for real in upper_candidates(path) {
                if changed(upper, &real) {
                    self.reported.set(true);
                    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
                    let detail = format!("{real} was changed inside the sandbox; its commands now run the changed file");
                    audit.borrow_mut().push(now, "tamper", 0, detail);
                    return;
                }
            }
        }
    }
}

/// Where the upper layer would hold `path`: under its directory's real path
/// (/bin is often a symlink to /usr/bin), and, if `path` itself is now a
/// symlink, under its target's real path too.
fn upper_candidates(path: &str) -> Vec<String> {
    let p = std::path::Path::new(path);
    let mut out = Vec::new();
    if let (Some(dir), Some(name)) = (p.parent(), p.file_name()) {
        if let Ok(d) = std::fs::canonicalize(dir) {
            out.push(d.join(name).to_string_lossy().into_owned());
        }
    }
    if let Ok(real) = std::fs::canonicalize(p) {
        out.push(real.to_string_lossy().into_owned());
    }
    out
}

/// The file exists in the upper layer, other than as a whiteout (a 0/0
/// character device marking a deletion, which the shell lookup notices).
fn changed(upper: &OwnedFd, real: &str) -> bool {
    match rustix::fs::statat(upper, real.trim_start_matches('/'), rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::CharacterDevice,
        Err(_) => false,
    }
}
