//! Just enough of Python's `marshal` format to hand a call to the worker
//! (and, in `Reader`, to read it back in the exec zygote's worker).
//! The worker decodes it with `marshal.loads`, which builds the objects in
//! C with fewer allocations than JSON would (every page the worker writes
//! is a page copied from the zygote). The codes below are those of every
//! marshal version since Python 3.4 (Python/marshal.c).

use crate::error::{malformed, RunnerError};
const TYPE_NONE: u8 = b'N';
const TYPE_INT: u8 = b'i';
const TYPE_LONG: u8 = b'l';
const TYPE_BYTES: u8 = b's';
const TYPE_UNICODE: u8 = b'u';
const TYPE_TUPLE: u8 = b'(';
const TYPE_LIST: u8 = b'[';
const TYPE_DICT: u8 = b'{';
const TYPE_NULL: u8 = b'0';
/// TYPE_LONG stores 15-bit digits, least significant first.
const LONG_SHIFT: u32 = 15;

/// An append-only marshal writer.
#[derive(Default)]
pub struct Marshal {
    pub out: Vec<u8>,
}

impl Marshal {
    fn len32(&mut self, n: usize) {
        // Lengths here are bounded by the worker message size.
        self.out.extend_from_slice(&(n as i32).to_le_bytes());
    }

    pub fn none(&mut self) {
        self.out.push(TYPE_NONE);
    }

    pub fn int(&mut self, v: u64) {
        if let Ok(small) = i32::try_from(v) {
            self.out.push(TYPE_INT);
            self.out.extend_from_slice(&small.to_le_bytes());
            return;
        }
        let mut digits = Vec::new();
        let mut rest = v;
        while rest != 0 {
            digits.push((rest & ((1 << LONG_SHIFT) - 1)) as u16);
            rest >>= LONG_SHIFT;
        }
        self.out.push(TYPE_LONG);
        self.len32(digits.len());
        for d in digits {
            self.out.extend_from_slice(&d.to_le_bytes());
        }
    }

    pub fn bytes(&mut self, v: &[u8]) {
        self.out.push(TYPE_BYTES);
        self.len32(v.len());
        self.out.extend_from_slice(v);
    }

    pub fn str(&mut self, v: &str) {
        self.out.push(TYPE_UNICODE);
        self.len32(v.len());
        self.out.extend_from_slice(v.as_bytes());
    }

    /// Starts a tuple of `n` items; the caller writes them next.
    pub fn tuple(&mut self, n: usize) {
        self.out.push(TYPE_TUPLE);
        self.len32(n);
    }

    pub fn str_list<'a>(&mut self, items: impl ExactSizeIterator<Item = &'a str>) {
        self.out.push(TYPE_LIST);
        self.len32(items.len());
        for s in items {
            self.str(s);
        }
    }

    pub fn str_dict<'a>(&mut self, items: impl Iterator<Item = (&'a str, &'a str)>) {
        self.out.push(TYPE_DICT);
        for (k, v) in items {
            self.str(k);
            self.str(v);
        }
        self.out.push(TYPE_NULL);
    }
}

/// A reader of what `Marshal` writes, for the exec zygote's workers
/// (exec_zygote.rs), which are not Python. It reads exactly the types the
/// writer uses and refuses anything else.
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], RunnerError> {
        if self.data.len() < n {
            return Err(malformed("the message ends early"));
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }

    fn code(&mut self) -> Result<u8, RunnerError> {
        Ok(self.take(1)?[0])
    }

    fn expect(&mut self, want: u8) -> Result<(), RunnerError> {
        match self.code()? {
            c if c == want => Ok(()),
            c => Err(malformed(format!("expected marshal type {:?}, found {:?}", want as char, c as char))),
        }
    }

    fn len32(&mut self) -> Result<usize, RunnerError> {
        let n = i32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes"));
        usize::try_from(n).map_err(|_| malformed("a negative length"))
    }

    /// Whether the next item is None (skipped if so).
    pub fn none(&mut self) -> bool {
        if self.data.first() == Some(&TYPE_NONE) {
            self.data = &self.data[1..];
            return true;
        }
        false
    }

    pub fn tuple(&mut self) -> Result<usize, RunnerError> {
        self.expect(TYPE_TUPLE)?;
        self.len32()
    }

    pub fn str(&mut self) -> Result<&'a str, RunnerError> {
        self.expect(TYPE_UNICODE)?;
        let n = self.len32()?;
        std::str::from_utf8(self.take(n)?).map_err(|_| malformed("a string that is not UTF-8"))
    }

    pub fn int(&mut self) -> Result<u64, RunnerError> {
        match self.code()? {
            TYPE_INT => {
                let v = i32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes"));
                u64::try_from(v).map_err(|_| malformed("a negative number"))
            }
            TYPE_LONG => {
                let n = self.len32()?;
                let mut v: u64 = 0;
                for i in 0..n {
                    let d = u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")) as u64;
                    let shift = LONG_SHIFT * i as u32;
                    if d != 0 && (shift >= 64 || (d << shift) >> shift != d) {
                        return Err(malformed("a number past 64 bits"));
                    }
                    if d != 0 {
                        v |= d << shift;
                    }
                }
                Ok(v)
            }
            c => Err(malformed(format!("expected a number, found marshal type {:?}", c as char))),
        }
    }

    pub fn str_list(&mut self) -> Result<Vec<&'a str>, RunnerError> {
        self.expect(TYPE_LIST)?;
        let n = self.len32()?;
        (0..n).map(|_| self.str()).collect()
    }

    pub fn str_dict(&mut self) -> Result<Vec<(&'a str, &'a str)>, RunnerError> {
        self.expect(TYPE_DICT)?;
        let mut items = Vec::new();
        loop {
            if self.data.first() == Some(&TYPE_NULL) {
                self.data = &self.data[1..];
                return Ok(items);
            }
            items.push((self.str()?, self.str()?));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reader_reads_what_the_writer_wrote() {
        let mut m = Marshal::default();
        m.tuple(6);
        m.str("/s");
        m.str_list(["a", "b\u{e9}"].into_iter());
        m.none();
        m.str_dict([("K", "v"), ("L", "")].into_iter());
        m.int(7);
        m.int(u64::MAX);
        let mut r = Reader::new(&m.out);
        assert_eq!(r.tuple().unwrap(), 6);
        assert_eq!(r.str().unwrap(), "/s");
        assert!(!r.none());
        assert_eq!(r.str_list().unwrap(), ["a", "b\u{e9}"]);
        assert!(r.none());
        assert_eq!(r.str_dict().unwrap(), [("K", "v"), ("L", "")]);
        assert_eq!((r.int().unwrap(), r.int().unwrap()), (7, u64::MAX));
        assert!(r.str().unwrap_err().to_string().contains("ends early"));
        assert!(Reader::new(b"u\x05\x00\x00\x00ab").str().unwrap_err().to_string().contains("ends early"));
        assert!(Reader::new(b"i\xff\xff\xff\xff").int().unwrap_err().to_string().contains("negative"));
        assert!(Reader::new(b"N").str().is_err());
    }

    // Expected bytes are what CPython's marshal.dumps writes for the same
    // values with references off (version 2 leaves out FLAG_REF).

    #[test]
    fn small_and_large_ints() {
        let mut m = Marshal::default();
        m.int(7);
        assert_eq!(m.out, b"i\x07\x00\x00\x00");
        // marshal.dumps(1 << 40, 2): 3 digits of 15 bits.
        let mut m = Marshal::default();
        m.int(1 << 40);
        assert_eq!(m.out, b"l\x03\x00\x00\x00\x00\x00\x00\x00\x00\x04");
        let mut m = Marshal::default();
        m.int(u64::MAX);
        assert_eq!(&m.out[..5], b"l\x05\x00\x00\x00");
    }

    #[test]
    fn containers_of_strings_and_bytes() {
        let mut m = Marshal::default();
        m.tuple(5);
        m.str("h\u{e9}");
        m.str_list(["a"].into_iter());
        m.str_dict([("K", "v")].into_iter());
        m.bytes(b"\x00");
        m.none();
        assert_eq!(
            m.out,
            b"(\x05\x00\x00\x00u\x03\x00\x00\x00h\xc3\xa9[\x01\x00\x00\x00u\x01\x00\x00\x00a{u\x01\x00\x00\x00Ku\x01\x00\x00\x00v0s\x01\x00\x00\x00\x00N"
        );
    }
}
