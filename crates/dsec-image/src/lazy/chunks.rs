//! Per-chunk digest tables of layer blobs.
//!
//! A blob's own digest can only be checked once the whole blob is local;
//! on-demand loading reads a few chunks of it. So `push` writes, next to
//! each blob in the shared store, a table of the sha256 of every fixed-size
//! chunk, and records the table's own digest in the image manifest
//! (`Manifest::chunk_tables`). The chain of trust is manifest -> table ->
//! chunk: a node checks the table against the manifest once, then every
//! chunk it fetches against the table before any byte of it is served.
//!
//! Format (little endian): `DSECCHK1`, chunk size (u32), 0 (u32), blob size
//! (u64), blob digest (32 bytes), then one 32-byte sha256 per chunk.

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

use crate::digest::Digest;

const MAGIC: &[u8; 8] = b"DSECCHK1";
const HEADER_LEN: usize = 8 + 4 + 4 + 8 + 32;

/// The chunk size `push` uses: the unit of one fetch from the store. Large
/// enough that a ranged GET's latency is amortised, small enough that a
/// task reading 5% of an image fetches not much more than that.
pub const DEFAULT_CHUNK_SIZE: u32 = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error("chunk table is malformed: {0}")]
    Malformed(&'static str),
    #[error("chunk table digest mismatch: the manifest says {expected}, the table is {actual}")]
    TableMismatch { expected: Digest, actual: Digest },
    #[error("chunk table is for blob {found} ({found_size} bytes), not for layer {expected} ({expected_size} bytes)")]
    WrongBlob { expected: Digest, expected_size: u64, found: Digest, found_size: u64 },
    #[error("chunk {index} of layer {blob} failed its digest check (corrupt or changed in the store)")]
    CorruptChunk { blob: Digest, index: u64 },
    #[error("chunk {index} of layer {blob} is {actual} bytes, expected {expected}")]
    ShortChunk { blob: Digest, index: u64, expected: u64, actual: u64 },
    #[error("reading the blob to index it: {0}")]
    Io(#[from] io::Error),
}

/// The chunk digests of one blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkTable {
    pub chunk_size: u32,
    pub blob_size: u64,
    pub blob_digest: Digest,
    pub chunks: Vec<[u8; 32]>,
}

impl ChunkTable {
    /// Indexes a blob (one pass; also yields the blob's digest, which is
    /// checked against `expected` so a table never describes other bytes).
    pub fn build(mut reader: impl Read, chunk_size: u32, expected: &Digest) -> Result<ChunkTable, ChunkError> {
        if chunk_size == 0 {
            return Err(ChunkError::Malformed("chunk size 0"));
        }
        let mut whole = Sha256::new();
        let mut chunks = Vec::new();
        let mut buf = vec![0u8; chunk_size as usize];
        let mut size = 0u64;
        loop {
            let n = read_full(&mut reader, &mut buf)?;
            if n == 0 {
                break;
            }
            whole.update(&buf[..n]);
            chunks.push(Sha256::digest(&buf[..n]).into());
            size += n as u64;
            if n < buf.len() {
                break;
            }
        }
        let blob_digest = Digest::from_bytes(whole.finalize().into());
        if blob_digest != *expected {
            return Err(ChunkError::WrongBlob { expected: *expected, expected_size: size, found: blob_digest, found_size: size });
        }
        Ok(ChunkTable { chunk_size, blob_size: size, blob_digest, chunks })
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + 32 * self.chunks.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.chunk_size.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.blob_size.to_le_bytes());
        out.extend_from_slice(self.blob_digest.as_bytes());
        for c in &self.chunks {
            out.extend_from_slice(c);
        }
        out
    }

    /// The digest a manifest records for this table.
    pub fn digest(&self) -> Digest {
        Digest::of_bytes(&self.to_bytes())
    }

    /// Parses a table fetched from a store and checks it against what the
    /// manifest says: the table's digest, the layer's digest and size.
    pub fn from_trusted_bytes(bytes: &[u8], table_digest: &Digest, blob: &Digest, blob_size: u64) -> Result<ChunkTable, ChunkError> {
        let actual = Digest::of_bytes(bytes);
        if actual != *table_digest {
            return Err(ChunkError::TableMismatch { expected: *table_digest, actual });
        }
        if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC || (bytes.len() - HEADER_LEN) % 32 != 0 {
            return Err(ChunkError::Malformed("bad header or length"));
        }
        let chunk_size = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        let size = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
        let digest = Digest::from_bytes(bytes[24..56].try_into().expect("32 bytes"));
        if digest != *blob || size != blob_size {
            return Err(ChunkError::WrongBlob { expected: *blob, expected_size: blob_size, found: digest, found_size: size });
        }
        let chunks: Vec<[u8; 32]> = bytes[HEADER_LEN..].chunks_exact(32).map(|c| c.try_into().expect("32 bytes")).collect();
        if chunk_size == 0 || chunks.len() as u64 != size.div_ceil(u64::from(chunk_size)) {
            return Err(ChunkError::Malformed("chunk count does not match the blob size"));
        }
        Ok(ChunkTable { chunk_size, blob_size: size, blob_digest: digest, chunks })
    }

    pub fn count(&self) -> u64 {
        self.chunks.len() as u64
    }

    /// Byte range `(offset, len)` of chunk `index`.
    pub fn range(&self, index: u64) -> (u64, u64) {
        let offset = index * u64::from(self.chunk_size);
        (offset, u64::from(self.chunk_size).min(self.blob_size - offset))
    }

    /// Checks a fetched chunk; nothing unchecked is ever written to a cache.
    pub fn verify(&self, index: u64, data: &[u8]) -> Result<(), ChunkError> {
        let (_, len) = self.range(index);
        if data.len() as u64 != len {
            return Err(ChunkError::ShortChunk { blob: self.blob_digest, index, expected: len, actual: data.len() as u64 });
        }
        let got: [u8; 32] = Sha256::digest(data).into();
        if got != self.chunks[index as usize] {
            return Err(ChunkError::CorruptChunk { blob: self.blob_digest, index });
        }
        Ok(())
    }
}

fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_checks() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let digest = Digest::of_bytes(&data);
        let t = ChunkTable::build(&data[..], 4096, &digest).unwrap();
        assert_eq!((t.count(), t.range(2)), (3, (8192, 10_000 - 8192)));
        let bytes = t.to_bytes();
        let back = ChunkTable::from_trusted_bytes(&bytes, &t.digest(), &digest, 10_000).unwrap();
        assert_eq!(back, t);
        t.verify(1, &data[4096..8192]).unwrap();
        assert!(matches!(t.verify(1, &data[0..4096]), Err(ChunkError::CorruptChunk { index: 1, .. })));
        assert!(matches!(t.verify(2, &data[8192..9000]), Err(ChunkError::ShortChunk { .. })));
        // A table that is not the one the manifest names is refused.
        let mut bad = bytes.clone();
        bad[60] ^= 1;
        assert!(matches!(ChunkTable::from_trusted_bytes(&bad, &t.digest(), &digest, 10_000), Err(ChunkError::TableMismatch { .. })));
        assert!(matches!(ChunkTable::from_trusted_bytes(&bytes, &t.digest(), &digest, 9_999), Err(ChunkError::WrongBlob { .. })));
        assert!(ChunkTable::build(&data[..], 4096, &Digest::of_bytes(b"x")).is_err());
    }
}
