//! Sanity checks of an EROFS image that do not depend on erofs-utils: the
//! superblock magic, a plausible block size, the superblock checksum when the
//! image carries one, and that the file is as long as the superblock says
//! (which catches truncated copies).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Byte offset of the superblock in the image.
const SUPERBLOCK_OFFSET: u64 = 1024;
/// `EROFS_SUPER_MAGIC_V1`; also the `f_type` statfs reports for a mount.
pub const EROFS_MAGIC: u32 = 0xE0F5_E1E2;
/// `EROFS_FEATURE_COMPAT_SB_CHKSUM`.
const COMPAT_SB_CHKSUM: u32 = 0x1;

#[derive(Debug, thiserror::Error)]
pub enum ErofsError {
    #[error("file is {len} bytes, too small to hold an EROFS superblock")]
    TooSmall { len: u64 },
    #[error("no EROFS superblock: magic at offset 1024 is {found:#010x}, expected {EROFS_MAGIC:#010x}")]
    BadMagic { found: u32 },
    #[error("unsupported EROFS block size 2^{bits}")]
    BadBlockSize { bits: u8 },
    #[error("truncated EROFS image: superblock says {expected} bytes, file has {actual}")]
    Truncated { expected: u64, actual: u64 },
    #[error("EROFS superblock checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("reading the EROFS superblock: {0}")]
    Io(#[from] io::Error),
}

/// What the checks learnt from the superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SuperblockInfo {
    pub block_size: u32,
    pub blocks: u32,
}

/// Checks the image in `file`, whose length is `len` bytes.
pub fn check_image(file: &File, len: u64) -> Result<SuperblockInfo, ErofsError> {
    // Covers the largest block size we accept (the superblock's checksum
    // spans from offset 1024 to the end of block 0).
    const MAX_BLOCK: usize = 64 * 1024;
    if len < SUPERBLOCK_OFFSET + 128 {
        return Err(ErofsError::TooSmall { len });
    }
    let want = (len.min(MAX_BLOCK as u64)) as usize;
    let mut block0 = vec![0u8; want];
    file.read_exact_at(&mut block0, 0)?;
    let sb = &block0[SUPERBLOCK_OFFSET as usize..];
    let le32 = |off: usize| u32::from_le_bytes(sb[off..off + 4].try_into().unwrap());

    let magic = le32(0);
    if magic != EROFS_MAGIC {
        return Err(ErofsError::BadMagic { found: magic });
    }
    let bits = sb[12];
    // The kernel accepts 512 B .. 64 KiB blocks (9..=16 bits) on file-backed
    // mounts; anything else is garbage.
    if !(9..=16).contains(&bits) {
        return Err(ErofsError::BadBlockSize { bits });
    }
    let block_size = 1u32 << bits;
    let blocks = le32(36);
    let expected = u64::from(blocks) * u64::from(block_size);
    if len < expected || (block_size as usize) > block0.len() {
        return Err(ErofsError::Truncated { expected: expected.max(u64::from(block_size)), actual: len });
    }
    if le32(8) & COMPAT_SB_CHKSUM != 0 {
        // Same rule as the kernel: crc32c (seed !0, no final inversion) of
        // the rest of block 0 from the superblock on, checksum field zeroed.
        let mut region = block0[SUPERBLOCK_OFFSET as usize..block_size as usize].to_vec();
        let stored = le32(4);
        region[4..8].fill(0);
        let computed = crc32c(!0, &region);
        if computed != stored {
            return Err(ErofsError::BadChecksum { stored, computed });
        }
    }
    Ok(SuperblockInfo { block_size, blocks })
}

/// Opens `path` and checks it.
pub fn check_image_file(path: &std::path::Path) -> Result<SuperblockInfo, ErofsError> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    check_image(&file, len)
}

/// Bitwise CRC-32C (Castagnoli, reflected polynomial 0x82F63B78). Only ever
/// run over one superblock (< 64 KiB), so a table buys nothing.
fn crc32c(mut crc: u32, data: &[u8]) -> u32 {
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82F6_3B78 & (crc & 1).wrapping_neg());
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn crc32c_check_value() {
        // The standard check value is for the finalised CRC (inverted).
        assert_eq!(!crc32c(!0, b"123456789"), 0xE306_9283);
    }

    fn image_with(block_bits: u8, blocks: u32, len: usize, with_csum: bool) -> tempfile::NamedTempFile {
        let mut img = vec![0u8; len];
        let sb = 1024;
        img[sb..sb + 4].copy_from_slice(&EROFS_MAGIC.to_le_bytes());
        img[sb + 12] = block_bits;
        img[sb + 36..sb + 40].copy_from_slice(&blocks.to_le_bytes());
        if with_csum {
            img[sb + 8..sb + 12].copy_from_slice(&COMPAT_SB_CHKSUM.to_le_bytes());
            let crc = crc32c(!0, &img[sb..1usize << block_bits]);
            img[sb + 4..sb + 8].copy_from_slice(&crc.to_le_bytes());
        }
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&img).unwrap();
        f
    }

    #[test]
    fn accepts_well_formed() {
        let f = image_with(12, 2, 8192, true);
        let info = check_image_file(f.path()).unwrap();
        assert_eq!(info, SuperblockInfo { block_size: 4096, blocks: 2 });
    }

    #[test]
    fn detects_damage() {
        let f = image_with(12, 3, 8192, false);
        assert!(matches!(check_image_file(f.path()), Err(ErofsError::Truncated { expected: 12288, actual: 8192 })));
        let f = image_with(12, 2, 8192, true);
        let file = std::fs::OpenOptions::new().write(true).open(f.path()).unwrap();
        file.write_all_at(b"X", 2000).unwrap();
        assert!(matches!(check_image_file(f.path()), Err(ErofsError::BadChecksum { .. })));
        file.write_all_at(&[0; 4], 1024).unwrap();
        assert!(matches!(check_image_file(f.path()), Err(ErofsError::BadMagic { found: 0 })));
        let f = image_with(30, 1, 4096, false);
        assert!(matches!(check_image_file(f.path()), Err(ErofsError::BadBlockSize { bits: 30 })));
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[0; 100]).unwrap();
        assert!(matches!(check_image_file(f.path()), Err(ErofsError::TooSmall { len: 100 })));
    }
}
