//! The node's DNS resolver for sandboxes, and the little of the DNS wire
//! format it needs (RFC 1035: the question, A records of an answer).
//!
//! Every networked sandbox's resolv.conf names the resolver. A query for a
//! domain the sandbox's rules allow is forwarded upstream, the A records
//! of the answer are added to that sandbox's allowlist *before* the answer
//! is relayed (so the connect right after it succeeds), and the answer goes
//! back unchanged. Any other query is answered REFUSED and recorded. The
//! sandbox is known by the source address of the query (the host side of
//! its veth drops spoofed sources: strict rp_filter).

use std::net::Ipv4Addr;

/// The question of a query: the name (lowercase, no trailing dot) and the
/// type.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    pub name: String,
    pub qtype: u16,
}

pub const TYPE_A: u16 = 1;
const RCODE_SERVFAIL: u8 = 2;
const RCODE_REFUSED: u8 = 5;

/// Reads a (possibly compressed) name at `off`; returns it and the offset
/// after it in the original position.
fn read_name(msg: &[u8], mut off: usize) -> Option<(String, usize)> {
    let mut labels: Vec<String> = Vec::new();
    let mut end = None;
    let mut jumps = 0;
    loop {
        let len = *msg.get(off)? as usize;
        if len & 0xc0 == 0xc0 {
            let ptr = ((len & 0x3f) << 8) | *msg.get(off + 1)? as usize;
            end.get_or_insert(off + 2);
            jumps += 1;
            if jumps > 16 {
                return None;
            }
            off = ptr;
            continue;
        }
        if len & 0xc0 != 0 {
            return None;
        }
        if len == 0 {
            let after = end.unwrap_or(off + 1);
            return Some((labels.join("."), after));
        }
        let label = msg.get(off + 1..off + 1 + len)?;
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        if labels.len() > 127 {
            return None;
        }
        off += 1 + len;
    }
}

/// The first question of a query (QDCOUNT must be 1, QR 0).
pub fn parse_query(msg: &[u8]) -> Option<Question> {
    if msg.len() < 12 || msg[2] & 0x80 != 0 || u16::from_be_bytes([msg[4], msg[5]]) != 1 {
        return None;
    }
    let (name, off) = read_name(msg, 12)?;
    let qtype = u16::from_be_bytes([*msg.get(off)?, *msg.get(off + 1)?]);
    Some(Question { name, qtype })
}

/// The IPv4 addresses in the answer section of a response.
pub fn answer_addrs(msg: &[u8]) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    if msg.len() < 12 {
        return out;
    }
    let qd = u16::from_be_bytes([msg[4], msg[5]]);
    let an = u16::from_be_bytes([msg[6], msg[7]]);
    let mut off = 12;
    for _ in 0..qd {
        let Some((_, o)) = read_name(msg, off) else { return out };
        off = o + 4;
    }
    for _ in 0..an {
        let Some((_, o)) = read_name(msg, off) else { return out };
        let Some(h) = msg.get(o..o + 10) else { return out };
        let rtype = u16::from_be_bytes([h[0], h[1]]);
        let rdlen = u16::from_be_bytes([h[8], h[9]]) as usize;
        let Some(rdata) = msg.get(o + 10..o + 10 + rdlen) else { return out };
        if rtype == TYPE_A && rdlen == 4 {
            out.push(Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3]));
        }
        off = o + 10 + rdlen;
    }
    out
}

/// An answer with only the query's header and question, and `rcode`.
fn reply_with(query: &[u8], rcode: u8) -> Vec<u8> {
    let end = read_name(query, 12).map(|(_, o)| (o + 4).min(query.len())).unwrap_or(12.min(query.len()));
    let mut out = query[..end].to_vec();
    if out.len() >= 12 {
        out[2] = 0x80 | (query[2] & 0x79); // QR, keep opcode and RD
        out[3] = 0x80 | rcode; // RA
        out[6..12].fill(0); // no answer, authority or additional records
    }
    out
}

pub fn refused(query: &[u8]) -> Vec<u8> {
    reply_with(query, RCODE_REFUSED)
}

pub fn servfail(query: &[u8]) -> Vec<u8> {
    reply_with(query, RCODE_SERVFAIL)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut m = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in name.split('.') {
            m.push(l.len() as u8);
            m.extend_from_slice(l.as_bytes());
        }
        m.push(0);
        m.extend_from_slice(&qtype.to_be_bytes());
        m.extend_from_slice(&1u16.to_be_bytes());
        m
    }

    #[test]
    fn questions_and_compressed_answers_parse() {
        let q = query("Mirror.Example.org", TYPE_A);
        assert_eq!(parse_query(&q), Some(Question { name: "mirror.example.org".into(), qtype: TYPE_A }));
        let mut r = q.clone();
        r[2] = 0x81;
        r[3] = 0x80;
        r[7] = 2; // two answers, both pointing at the question's name
        for ip in [[198, 18, 0, 20], [198, 18, 0, 21]] {
            r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
            r.extend_from_slice(&ip);
        }
        assert_eq!(answer_addrs(&r), vec![Ipv4Addr::new(198, 18, 0, 20), Ipv4Addr::new(198, 18, 0, 21)]);
        assert!(parse_query(&r).is_none(), "a response is not a query");
    }

    #[test]
    fn refusals_echo_the_question() {
        let q = query("exfil.attacker.test", TYPE_A);
        let r = refused(&q);
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert_eq!(r[3] & 0x0f, RCODE_REFUSED);
        assert_eq!(&r[12..], &q[12..]);
    }

    #[test]
    fn hostile_messages_do_not_loop_or_panic() {
        let mut m = vec![0u8; 12];
        m[5] = 1;
        m.extend_from_slice(&[0xc0, 12]); // a pointer to itself
        assert!(parse_query(&m).is_none());
        assert!(answer_addrs(&m).is_empty());
        assert!(parse_query(&[1, 2, 3]).is_none());
        let _ = refused(&[1, 2, 3]);
    }
}
