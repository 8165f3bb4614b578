//! The master boot record of the full VM's base disk: boot code (syslinux's
//! `mbr.bin`, which chain-loads the active partition's boot sector), a disk
//! signature and the partition table. Written by the project rather than by
//! a partitioning tool: it is 512 bytes of plain data, and this way the
//! layout is unit-tested.

/// Bytes of boot code before the disk signature.
pub const BOOT_CODE_LEN: usize = 440;
pub const SECTOR: u64 = 512;

/// One primary partition, in 512-byte sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    pub active: bool,
    /// MBR type byte: 0xef EFI system (FAT), 0x83 Linux.
    pub kind: u8,
    pub start: u32,
    pub sectors: u32,
}

/// The 512-byte sector 0. `boot_code` longer than 440 bytes is cut (the
/// rest of syslinux's 512-byte file is an empty table); shorter is padded.
pub fn mbr(boot_code: &[u8], signature: u32, parts: &[Partition]) -> Result<[u8; 512], String> {
    if parts.len() > 4 {
        return Err(format!("an MBR holds 4 primary partitions, not {}", parts.len()));
    }
    let mut sorted = parts.to_vec();
    sorted.sort_by_key(|p| p.start);
    for w in sorted.windows(2) {
        if u64::from(w[0].start) + u64::from(w[0].sectors) > u64::from(w[1].start) {
            return Err(format!("partitions overlap: {:?} and {:?}", w[0], w[1]));
        }
    }
    if parts.iter().any(|p| p.start == 0 || p.sectors == 0) {
        return Err("a partition must start after sector 0 and not be empty".into());
    }
    let mut s = [0u8; 512];
    let n = boot_code.len().min(BOOT_CODE_LEN);
    s[..n].copy_from_slice(&boot_code[..n]);
    s[440..444].copy_from_slice(&signature.to_le_bytes());
    for (i, p) in parts.iter().enumerate() {
        let e = 446 + 16 * i;
        s[e] = if p.active { 0x80 } else { 0 };
        // CHS fields say "beyond CHS, use the LBA fields" (every BIOS since
        // the 1990s reads those).
        s[e + 1..e + 4].copy_from_slice(&[0xfe, 0xff, 0xff]);
        s[e + 4] = p.kind;
        s[e + 5..e + 8].copy_from_slice(&[0xfe, 0xff, 0xff]);
        s[e + 8..e + 12].copy_from_slice(&p.start.to_le_bytes());
        s[e + 12..e + 16].copy_from_slice(&p.sectors.to_le_bytes());
    }
    s[510] = 0x55;
    s[511] = 0xaa;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_the_partitions_at_their_offsets() {
        let code = vec![0xeb; 512];
        let parts = [
            Partition { active: true, kind: 0xef, start: 2048, sectors: 131072 },
            Partition { active: false, kind: 0x83, start: 133120, sectors: 8388608 },
        ];
        let s = mbr(&code, 0xdead_beef, &parts).unwrap();
        assert!(s[..440].iter().all(|&b| b == 0xeb), "boot code kept");
        assert_eq!(&s[440..444], &0xdead_beefu32.to_le_bytes());
        assert_eq!(s[446], 0x80);
        assert_eq!(s[446 + 4], 0xef);
        assert_eq!(u32::from_le_bytes(s[454..458].try_into().unwrap()), 2048);
        assert_eq!(u32::from_le_bytes(s[458..462].try_into().unwrap()), 131072);
        assert_eq!(s[462], 0);
        assert_eq!(s[462 + 4], 0x83);
        assert_eq!(u32::from_le_bytes(s[470..474].try_into().unwrap()), 133120);
        assert_eq!(s[478..510], [0u8; 32], "unused entries stay empty");
        assert_eq!(&s[510..], &[0x55, 0xaa]);
    }

    #[test]
    fn overlapping_empty_or_too_many_partitions_are_refused() {
        let p = |start, sectors| Partition { active: false, kind: 0x83, start, sectors };
        assert!(mbr(&[], 0, &[p(2048, 100), p(2100, 10)]).is_err());
        assert!(mbr(&[], 0, &[p(0, 100)]).is_err());
        assert!(mbr(&[], 0, &[p(2048, 0)]).is_err());
        assert!(mbr(&[], 0, &[p(1, 1), p(2, 1), p(3, 1), p(4, 1), p(5, 1)]).is_err());
        assert!(mbr(&[], 0, &[p(2048, 100), p(2148, 10)]).is_ok());
    }
}
