//! Answers to the edge: one JSON line, then the raw parts it announces
//! (stdout, stderr, fetched files), copied by sendfile from their
//! descriptors.

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

/// Writes the answer's line and then its parts to stdout.
pub fn send(out: BorrowedFd<'_>, answer: &Answer, parts: &[Part]) -> io::Result<()> {
    let mut line = serde_json::to_vec(answer).map_err(io::Error::other)?;
    line.push(b'\n');
    write_all(out, &line)?;
    for p in parts {
        send_part(out, p.fd.as_fd(), p.len)?;
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
