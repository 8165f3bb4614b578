//! Readers that hash and count what passes through them, so a layer is
//! checked against its digest in the same pass that unpacks it.

use std::cell::RefCell;
use std::io::{self, BufRead, BufReader, Read};
use std::rc::Rc;

use sha2::{Digest as _, Sha256};

use crate::digest::Digest;
use crate::progress::{Progress, Unit};

/// The running hash and byte count of a [`Hashing`] reader, readable after
/// the reader itself has been moved into a decoder.
#[derive(Default)]
pub(crate) struct Tally {
    hasher: Sha256,
    bytes: u64,
}

impl Tally {
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn digest(&self) -> Digest {
        Digest::from_bytes(self.hasher.clone().finalize().into())
    }
}

pub(crate) struct Hashing<'p, R> {
    inner: R,
    tally: Rc<RefCell<Tally>>,
    /// Reports the byte count (raw side only), every MiB or so.
    progress: Option<(&'p dyn Progress, Option<u64>)>,
    reported: u64,
}

impl<'p, R: Read> Hashing<'p, R> {
    pub(crate) fn new(inner: R, progress: Option<(&'p dyn Progress, Option<u64>)>) -> Self {
        Hashing { inner, tally: Rc::default(), progress, reported: 0 }
    }

    pub(crate) fn tally(&self) -> Rc<RefCell<Tally>> {
        Rc::clone(&self.tally)
    }
}

impl<R: Read> Read for Hashing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut t = self.tally.borrow_mut();
        t.hasher.update(&buf[..n]);
        t.bytes += n as u64;
        if let Some((p, total)) = self.progress {
            if t.bytes - self.reported >= 1 << 20 || n == 0 {
                self.reported = t.bytes;
                p.advance(t.bytes, total, Unit::Bytes);
            }
        }
        Ok(n)
    }
}

/// Compression of a layer blob, told by its first bytes (media types lie
/// often enough: `docker save` names gzip nowhere, and some registries
/// serve plain tars under a gzip type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

pub(crate) fn sniff<R: Read>(reader: &mut BufReader<R>) -> io::Result<Compression> {
    let head = reader.fill_buf()?;
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_and_counts_through_a_decoder() {
        let data = b"hello layer".repeat(1000);
        let mut r = Hashing::new(&data[..], None);
        let tally = r.tally();
        io::copy(&mut r, &mut io::sink()).unwrap();
        assert_eq!(tally.borrow().bytes(), data.len() as u64);
        assert_eq!(tally.borrow().digest(), Digest::of_bytes(&data));
    }

    #[test]
    fn sniffs_compression() {
        let gz = [0x1f, 0x8b, 8, 0];
        assert_eq!(sniff(&mut BufReader::new(&gz[..])).unwrap(), Compression::Gzip);
        let zs = [0x28, 0xb5, 0x2f, 0xfd, 0];
        assert_eq!(sniff(&mut BufReader::new(&zs[..])).unwrap(), Compression::Zstd);
        assert_eq!(sniff(&mut BufReader::new(&b"ustar"[..])).unwrap(), Compression::None);
    }
}
