//! Answers to the edge: one JSON line, then the raw parts it announces
//! (stdout, stderr, fetched files). Small parts are read into the line's
//! buffer and go out with it in one write (one wake-up of the agent that
//! relays it, instead of one per part); big ones are copied by sendfile.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use serde::Serialize;

use super::outcome::Outcome;
use super::sys::write_all;

#[derive(Debug, Default, Serialize)]
pub struct Answer {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The runner itself is broken (the edge retires it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fatal: bool,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// `compile`: the program (base64) if small enough, else null.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binary: Option<Option<String>>,
    /// The raw parts after the line: [name, length].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw: Option<Vec<(String, u64)>>,
    pub id: serde_json::Value,
}

impl Answer {
    pub fn ok() -> Self {
        Answer { ok: Some(true), ..Default::default() }
    }

    pub fn error(msg: impl Into<String>) -> Self {
        Answer { error: Some(msg.into()), ..Default::default() }
    }
}

/// A raw part: `len` bytes of `fd` from offset 0.
pub struct Part {
    pub fd: OwnedFd,
    pub len: u64,
}

/// Parts are gathered into one write up to this many bytes.
const GATHER_BYTES: u64 = 256 << 10;

/// Writes the answer's line and then its parts to `out`.
pub fn send(out: BorrowedFd<'_>, answer: &Answer, parts: &[Part]) -> io::Result<()> {
    let mut buf = serde_json::to_vec(answer).map_err(io::Error::other)?;
    buf.push(b'\n');
    for p in parts {
        if buf.len() as u64 + p.len <= GATHER_BYTES {
            append_part(&mut buf, p.fd.as_fd(), p.len as usize)?;
        } else {
            write_all(out, &buf)?;
            buf.clear();
            send_part(out, p.fd.as_fd(), p.len)?;
        }
    }
    write_all(out, &buf)
}

/// Appends `count` bytes of `fd` (from offset 0) to `buf`, padded with
/// zeros if the file shrank under us (only fetched files can).
fn append_part(buf: &mut Vec<u8>, fd: BorrowedFd<'_>, count: usize) -> io::Result<()> {
    let start = buf.len();
    buf.resize(start + count, 0);
    let mut done = 0;
    while done < count {
        match rustix::io::pread(fd, &mut buf[start + done..], done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Copies `count` bytes of `fd` (from offset 0) to `out` in the kernel.
fn send_part(out: BorrowedFd<'_>, fd: BorrowedFd<'_>, count: u64) -> io::Result<()> {
    let mut offset = 0u64;
    while offset < count {
        let want = (count - offset).min(1 << 30) as usize;
        match rustix::fs::sendfile(out, fd, Some(&mut offset), want) {
            Ok(0) => break,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if offset < count {
        // The file shrank under us (only fetched files can): pad, keeping
        // the announced length.
        let zeros = vec![0u8; (count - offset) as usize];
        write_all(out, &zeros)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn part(data: &[u8], len: u64) -> Part {
        Part { fd: crate::sys::memfd("part", data).unwrap(), len }
    }

    #[test]
    fn line_then_parts_small_and_big_in_order() {
        let (mut r, w) = std::io::pipe().unwrap();
        let big = vec![b'b'; GATHER_BYTES as usize];
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            r.read_to_end(&mut all).unwrap();
            all
        });
        let answer =
            Answer { raw: Some(vec![("stdout".into(), 2), ("file:x".into(), big.len() as u64), ("stderr".into(), 4)]), ..Answer::ok() };
        // The stderr memfd holds 2 bytes but 4 are announced: padded.
        let parts = [part(b"hi", 2), part(&big, big.len() as u64), part(b"er", 4)];
        send(w.as_fd(), &answer, &parts).unwrap();
        drop(w);
        let all = reader.join().unwrap();
        let nl = all.iter().position(|b| *b == b'\n').unwrap();
        let line: serde_json::Value = serde_json::from_slice(&all[..nl]).unwrap();
        assert_eq!(line["ok"], true);
        assert_eq!(line["id"], serde_json::Value::Null);
        assert!(line.get("error").is_none() && line.get("exit_code").is_none());
        let rest = &all[nl + 1..];
        assert_eq!(&rest[..2], b"hi");
        assert_eq!(&rest[2..2 + big.len()], &big[..]);
        assert_eq!(&rest[2 + big.len()..], b"er\0\0");
    }
}
