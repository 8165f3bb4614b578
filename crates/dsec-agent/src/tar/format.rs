//! The tar format itself: header blocks, PAX records, numeric fields.

use dsec_agent_proto::AgentError;

use crate::errors::invalid;

pub const BLOCK: usize = 512;

pub fn bad(msg: impl Into<String>) -> AgentError {
    invalid(format!("tar: {}", msg.into()))
}

pub fn octal(field: &mut [u8], v: u64) {
    // width-1 zero-padded octal digits, then NUL.
    let w = field.len() - 1;
    let s = format!("{v:0w$o}");
    field[..w].copy_from_slice(&s.as_bytes()[s.len() - w..]);
    field[w] = 0;
}

pub fn fits_octal(field_len: usize, v: u64) -> bool {
    v < 1u64 << (3 * (field_len as u32 - 1))
}

/// A PAX record `LEN key=value\n`, where LEN counts the whole record.
pub fn pax_record(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    let base = key.len() + value.len() + 3;
    let mut len = base + 1;
    while len != base + len.to_string().len() {
        len = base + len.to_string().len();
    }
    out.extend_from_slice(format!("{len} {key}=").as_bytes());
    out.extend_from_slice(value);
    out.push(b'\n');
}

pub struct EntryMeta {
    pub name: Vec<u8>,
    pub kind: u8,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: i64,
    pub link: Vec<u8>,
    pub dev: (u32, u32),
}

pub fn ustar_header(m: &EntryMeta) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    h[..m.name.len()].copy_from_slice(&m.name);
    octal(&mut h[100..108], u64::from(m.mode & 0o7777));
    octal(&mut h[108..116], u64::from(m.uid));
    octal(&mut h[116..124], u64::from(m.gid));
    octal(&mut h[124..136], m.size);
    octal(&mut h[136..148], m.mtime as u64);
    h[156] = m.kind;
    h[157..157 + m.link.len()].copy_from_slice(&m.link);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    octal(&mut h[329..337], u64::from(m.dev.0));
    octal(&mut h[337..345], u64::from(m.dev.1));
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    octal(&mut h[148..155], u64::from(sum));
    h[155] = b' ';
    h
}

/// The header block(s) of one entry: a PAX header first when a field does
/// not fit ustar (the ustar field then holds a truncated or zero value).
pub fn encode_header(m: &EntryMeta) -> Vec<u8> {
    let mut pax = Vec::new();
    let mut main = EntryMeta {
        name: m.name.clone(),
        kind: m.kind,
        mode: m.mode,
        uid: m.uid,
        gid: m.gid,
        size: m.size,
        // Negative or far-future times are clamped: rare, and not worth PAX.
        mtime: m.mtime.clamp(0, (1 << 33) - 1),
        link: m.link.clone(),
        dev: m.dev,
    };
    if m.name.len() > 100 {
        pax_record(&mut pax, "path", &m.name);
        main.name.truncate(100);
    }
    if m.link.len() > 100 {
        pax_record(&mut pax, "linkpath", &m.link);
        main.link.truncate(100);
    }
    if !fits_octal(12, m.size) {
        pax_record(&mut pax, "size", m.size.to_string().as_bytes());
        main.size = 0;
    }
    if !fits_octal(8, u64::from(m.uid)) {
        pax_record(&mut pax, "uid", m.uid.to_string().as_bytes());
        main.uid = 0;
    }
    if !fits_octal(8, u64::from(m.gid)) {
        pax_record(&mut pax, "gid", m.gid.to_string().as_bytes());
        main.gid = 0;
    }
    let mut out = Vec::with_capacity(3 * BLOCK);
    if !pax.is_empty() {
        let mut pname = b"PaxHeaders/".to_vec();
        pname.extend_from_slice(&main.name[..main.name.len().min(100 - pname.len())]);
        let ph = EntryMeta {
            name: pname,
            kind: b'x',
            mode: 0o644,
            uid: 0,
            gid: 0,
            size: pax.len() as u64,
            mtime: main.mtime,
            link: Vec::new(),
            dev: (0, 0),
        };
        out.extend_from_slice(&ustar_header(&ph));
        out.extend_from_slice(&pax);
        out.resize(out.len().next_multiple_of(BLOCK), 0);
    }
    out.extend_from_slice(&ustar_header(&main));
    out
}

pub fn parse_num(field: &[u8]) -> Result<u64, AgentError> {
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        // GNU base-256: big-endian, first byte's top bit is the marker.
        let mut v: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            v = v.checked_mul(256).and_then(|v| v.checked_add(u64::from(b))).ok_or_else(|| bad("number too large"))?;
        }
        return Ok(v);
    }
    let s: Vec<u8> = field.iter().copied().take_while(|&b| b != 0).filter(|&b| b != b' ').collect();
    if s.is_empty() {
        return Ok(0);
    }
    let s = std::str::from_utf8(&s).map_err(|_| bad("bad number"))?;
    u64::from_str_radix(s, 8).map_err(|_| bad(format!("bad octal number {s:?}")))
}

pub fn cstr_field(f: &[u8]) -> &[u8] {
    let end = f.iter().position(|&b| b == 0).unwrap_or(f.len());
    &f[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_record_length_counts_itself() {
        let mut v = Vec::new();
        pax_record(&mut v, "path", b"abc");
        assert_eq!(v, b"12 path=abc\n");
        let mut v = Vec::new();
        let long = vec![b'x'; 95];
        pax_record(&mut v, "path", &long);
        // 95 + 4 + 3 = 102 plus 3 digits = 105
        assert!(v.starts_with(b"105 path="));
        assert_eq!(v.len(), 105);
    }

    #[test]
    fn numbers_octal_and_base256() {
        let mut f = [0u8; 12];
        octal(&mut f, 0o1234);
        assert_eq!(&f, b"00000001234\0");
        assert_eq!(parse_num(&f).unwrap(), 0o1234);
        assert_eq!(parse_num(b"  755 \0").unwrap(), 0o755);
        let mut b = [0u8; 12];
        b[0] = 0x80;
        b[10] = 1;
        b[11] = 2;
        assert_eq!(parse_num(&b).unwrap(), 258);
        assert!(fits_octal(12, (1 << 33) - 1));
        assert!(!fits_octal(12, 1 << 33));
    }

    #[test]
    fn headers_are_readable_by_the_tar_crate() {
        let long_name = format!("{}/file.txt", "d".repeat(150));
        let mut archive = Vec::new();
        for (name, kind, link, size) in [(long_name.clone(), b'0', String::new(), 5u64), ("short".to_string(), b'2', "t".repeat(120), 0)] {
            let m = EntryMeta {
                name: name.into_bytes(),
                kind,
                mode: 0o640,
                uid: 3_000_000,
                gid: 7,
                size,
                mtime: 1_700_000_000,
                link: link.into_bytes(),
                dev: (0, 0),
            };
            archive.extend(encode_header(&m));
            if size > 0 {
                archive.extend(b"hello");
                archive.resize(archive.len().next_multiple_of(BLOCK), 0);
            }
        }
        archive.extend([0u8; 1024]);
        let mut a = ::tar::Archive::new(&archive[..]);
        let entries: Vec<_> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| {
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    e.header().uid().unwrap(),
                    e.link_name().unwrap().map(|l| l.to_string_lossy().into_owned()),
                )
            })
            .collect();
        assert_eq!(entries[0].0, long_name);
        assert_eq!(entries[0].1, 3_000_000);
        assert_eq!(entries[1].2.as_deref(), Some("t".repeat(120).as_str()));
    }
}
