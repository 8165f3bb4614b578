//! Just enough of Python's `marshal` format to hand a call to the worker.
//! The worker decodes it with `marshal.loads`, which builds the objects in
//! C with fewer allocations than JSON would (every page the worker writes
//! is a page copied from the zygote). The codes below are those of every
//! marshal version since Python 3.4 (Python/marshal.c).

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

#[cfg(test)]
mod tests {
    use super::*;

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
