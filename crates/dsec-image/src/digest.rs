//! Content digests of layer blobs (`sha256:<64 hex>`).

use std::fmt;
use std::io::{self, Read, Write};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The only algorithm the store accepts; the prefix keeps the text form
/// compatible with OCI digests should another algorithm ever be added.
const PREFIX: &str = "sha256:";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("invalid digest `{0}`: expected `sha256:` followed by 64 lowercase hex digits")]
    Invalid(String),
}

/// A sha256 digest of a layer blob. Text form: `sha256:<hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest([u8; 32]);

impl Digest {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Digest(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 lowercase hex digits without the algorithm prefix (used for
    /// file and mountpoint names).
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses the bare 64-hex form (as found in file and mountpoint names).
    pub fn from_hex(s: &str) -> Result<Self, DigestError> {
        // hex::decode accepts uppercase; the canonical form is lowercase only,
        // so that one digest has exactly one file name.
        if s.len() != 64 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(DigestError::Invalid(s.to_string()));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|_| DigestError::Invalid(s.to_string()))?;
        Ok(Digest(out))
    }

    /// Digest of everything `reader` yields.
    pub fn of_reader(mut reader: impl Read) -> io::Result<(Digest, u64)> {
        let mut w = HashingWriter::new(io::sink());
        io::copy(&mut reader, &mut w)?;
        Ok(w.finish())
    }

    pub fn of_bytes(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = DigestError;
    fn from_str(s: &str) -> Result<Self, DigestError> {
        let hex = s.strip_prefix(PREFIX).ok_or_else(|| DigestError::Invalid(s.to_string()))?;
        Digest::from_hex(hex).map_err(|_| DigestError::Invalid(s.to_string()))
    }
}

impl TryFrom<String> for Digest {
    type Error = DigestError;
    fn try_from(s: String) -> Result<Self, DigestError> {
        s.parse()
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.to_string()
    }
}

/// A writer that hashes and counts what passes through it, so a blob is
/// digested in the same pass that copies it (no second read of 100+ MB).
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    len: u64,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        HashingWriter { inner, hasher: Sha256::new(), len: 0 }
    }

    pub(crate) fn finish(self) -> (Digest, u64) {
        (Digest(self.hasher.finalize().into()), self.len)
    }

    /// The digest, the count and the writer underneath (to finish it).
    pub(crate) fn into_parts(self) -> (Digest, u64, W) {
        (Digest(self.hasher.finalize().into()), self.len, self.inner)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        let d = Digest::of_bytes(b"abc");
        assert_eq!(d.to_string(), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let (d2, len) = Digest::of_reader(&b"abc"[..]).unwrap();
        assert_eq!((d2, len), (d, 3));
    }

    #[test]
    fn parse_round_trip() {
        let d = Digest::of_bytes(b"x");
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        assert_eq!(Digest::from_hex(&d.hex()).unwrap(), d);
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, format!("\"{d}\""));
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
    }

    #[test]
    fn rejects_bad_forms() {
        let hex = Digest::of_bytes(b"x").hex();
        for bad in [
            hex.clone(),                              // no prefix
            format!("sha512:{hex}"),                  // wrong algorithm
            format!("sha256:{}", &hex[1..]),          // too short
            format!("sha256:{}", hex.to_uppercase()), // not canonical
            format!("sha256:{}g", &hex[1..]),         // not hex
            String::new(),
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<Digest>("\"sha256:00\"").is_err());
    }
}
