//! The host-side cap on a full VM's writes (`disk_limit_mb`).
//!
//! A VM writes into its qcow2 overlay, which QEMU opens through a `raw`
//! node of fixed size (`cmdline::disk_drive`): the overlay file is made
//! exactly `disk_limit_mb` long (sparse: only what is written takes space),
//! qcow2 allocates its clusters inside it, and one it would need beyond the
//! end is refused with ENOSPC, which the guest sees as an I/O error on its
//! disk. So the host never holds more than `disk_limit_mb` of a VM's
//! writes (qcow2's own tables included), however large the guest's disk
//! looks, and a VM that fills its share fills nobody else's.
//!
//! The edge notices a VM at its limit by the overlay's allocated blocks
//! (`limit_reached`, checked by the sweeper) and says so in the sandbox's
//! `state_reason`; the VM keeps running (its files can still be read).

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use crate::error::EdgeError;

/// Less than this and a Debian guest cannot even boot (journal, logs,
/// the agent's files: a few MiB) with room to work.
pub const MIN_LIMIT_MB: u64 = 64;

/// How close to the cap the overlay must be for the VM to count as full:
/// one guest request (at most a few MiB: virtio-blk's segment limit) plus
/// qcow2's tables for it.
const FULL_MARGIN: u64 = 4 << 20;

/// Makes `overlay` (a qcow2 file) `limit` bytes long if it is shorter: the
/// raw node QEMU reads it through must not be larger than the file. Never
/// shrinks (an overlay written before the cap existed may hold more).
pub fn cap(overlay: &Path, limit: u64) -> Result<(), EdgeError> {
    let err = |e| EdgeError::io("capping the size of", overlay)(e);
    let f = std::fs::OpenOptions::new().write(true).open(overlay).map_err(err)?;
    if f.metadata().map_err(err)?.len() < limit {
        f.set_len(limit).map_err(err)?;
    }
    Ok(())
}

/// `Some((held, limit))` (bytes) when the overlay holds all the host will
/// give it, i.e. the guest's next writes to new blocks fail.
pub fn limit_reached(overlay: &Path) -> Option<(u64, u64)> {
    let m = std::fs::metadata(overlay).ok()?;
    let held = m.blocks() * 512;
    (held + FULL_MARGIN >= m.len()).then_some((held, m.len()))
}

/// Bytes the overlay holds on the host (its allocated blocks).
pub fn held(overlay: &Path) -> Option<u64> {
    std::fs::metadata(overlay).ok().map(|m| m.blocks() * 512)
}

/// The `state_reason` of a VM at its write limit.
pub fn reason(held: u64, limit: u64) -> String {
    format!(
        "disk limit reached: the VM's writes take {} of its disk_limit_mb of {} MiB on the host; \
         further writes to new blocks fail with I/O errors in the guest (delete files and run fstrim to free space)",
        held >> 20,
        limit >> 20
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn an_overlay_is_made_as_long_as_its_cap_and_counts_as_full_only_when_written_up_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let overlay = dir.path().join("vm.qcow2");
        std::fs::write(&overlay, vec![1u8; 64 << 10]).unwrap();
        cap(&overlay, 32 << 20).unwrap();
        let m = std::fs::metadata(&overlay).unwrap();
        assert_eq!(m.len(), 32 << 20);
        assert!(m.blocks() * 512 < 1 << 20, "the cap is a hole, not written space");
        assert_eq!(limit_reached(&overlay), None);
        // Written up to within the margin: full.
        let mut f = std::fs::OpenOptions::new().write(true).open(&overlay).unwrap();
        f.write_all(&vec![2u8; 30 << 20]).unwrap();
        f.sync_all().unwrap();
        let (held, limit) = limit_reached(&overlay).unwrap();
        assert!(held >= 30 << 20 && limit == 32 << 20);
        assert!(reason(held, limit).contains("of 32 MiB"));
        // Never shrunk; a missing overlay is an error, not a panic.
        cap(&overlay, 1 << 20).unwrap();
        assert_eq!(std::fs::metadata(&overlay).unwrap().len(), 32 << 20);
        assert!(cap(&dir.path().join("missing"), 1 << 20).is_err());
        assert_eq!(limit_reached(&dir.path().join("missing")), None);
    }
}
