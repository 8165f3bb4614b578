//! The edge's requests: a decimal length, a newline, then that many bytes
//! of JSON (see dsec-fncall's protocol.rs, which writes them).

use crate::error::{malformed, os, RunnerError};
use std::os::fd::BorrowedFd;

use serde::Deserialize;

/// A header longer than this (20 digits and the newline) is not a length.
const MAX_HEADER: usize = 21;
/// Bytes asked of the socket per read: a whole ordinary request at once.
const READ_CHUNK: usize = 1 << 16;

/// The request itself is defined once for the edge and the monitor.
pub use dsec_agent_proto::fncall::{CallLimits as Limits, MonitorRequest as Request};

/// What could be made of one request's bytes.
pub enum Parsed<'a> {
    Ok(Box<Request<'a>>),
    /// Not a request we understand; the id, if one could be read.
    Bad {
        id: serde_json::Value,
        error: String,
    },
}

pub fn parse(data: &[u8]) -> Parsed<'_> {
    match serde_json::from_slice::<Request>(data) {
        Ok(r) => Parsed::Ok(Box::new(r)),
        Err(e) => {
            #[derive(Deserialize)]
            struct IdOnly {
                #[serde(default)]
                id: serde_json::Value,
            }
            let id = serde_json::from_slice::<IdOnly>(data).map(|r| r.id).unwrap_or_default();
            Parsed::Bad { id, error: format!("bad request: {e}") }
        }
    }
}

/// Reads framed requests from the edge's socket. The monitor is its only
/// reader, so it reads in large chunks and keeps what
/// belongs to the next request: one read per request, not one per byte.
/// The buffer is allocated (and zeroed) once and grows only for a request
/// bigger than it: `start..end` is what has been read and not yet handed
/// out.
pub struct RequestReader<'fd> {
    fd: BorrowedFd<'fd>,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl<'fd> RequestReader<'fd> {
    pub fn new(fd: BorrowedFd<'fd>) -> Self {
        RequestReader { fd, buf: Vec::new(), start: 0, end: 0 }
    }

    /// Reads the next chunk after what is kept; false at the end of the
    /// input.
    fn more(&mut self) -> Result<bool, RunnerError> {
        if self.end == self.buf.len() {
            // Full: move what is kept to the front, or grow.
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                let grown = (self.buf.len() * 2).max(READ_CHUNK);
                self.buf.resize(grown, 0);
            }
        }
        let n = loop {
            match rustix::io::read(self.fd, &mut self.buf[self.end..]) {
                Err(rustix::io::Errno::INTR) => continue,
                r => break r.map_err(os("reading requests"))?,
            }
        };
        self.end += n;
        Ok(n > 0)
    }

    /// The next request's bytes; None at a clean end of the input. Any
    /// error means the stream cannot be trusted any more (fatal).
    pub fn next(&mut self) -> Result<Option<Vec<u8>>, RunnerError> {
        let nl = loop {
            let kept = &self.buf[self.start..self.end];
            let head = &kept[..kept.len().min(MAX_HEADER)];
            if let Some(nl) = head.iter().position(|b| *b == b'\n') {
                break nl;
            }
            if kept.len() >= MAX_HEADER {
                return Err(malformed("bad request header"));
            }
            if !self.more()? {
                if self.start == self.end {
                    return Ok(None);
                }
                return Err(malformed("truncated request"));
            }
        };
        let header = &self.buf[self.start..self.start + nl];
        let n: usize =
            std::str::from_utf8(header).ok().and_then(|s| s.trim().parse().ok()).ok_or_else(|| malformed("bad request header"))?;
        let end = (nl + 1).checked_add(n).ok_or_else(|| malformed("bad request header"))?;
        while self.end - self.start < end {
            if !self.more()? {
                return Err(malformed("truncated request"));
            }
        }
        let data = self.buf[self.start + nl + 1..self.start + end].to_vec();
        self.start += end;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
            // A big request (files) grew the buffer: give the memory back,
            // which counts against the runner's limit like the calls'.
            if self.buf.len() > READ_CHUNK {
                self.buf.truncate(READ_CHUNK);
                self.buf.shrink_to_fit();
            }
        }
        Ok(Some(data))
    }
}

/// `path` made relative to the scratch directory (empty and `.` parts
/// dropped), or None if it is absolute, empty, contains a NUL or a `..`.
pub fn safe_rel(path: &str) -> Option<String> {
    if path.is_empty() || path.contains('\0') || path.starts_with('/') {
        return None;
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    if parts.is_empty() || parts.contains(&"..") {
        return None;
    }
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn reader_over(input: &[u8]) -> (std::fs::File, tempfile::NamedTempFile) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(input).unwrap();
        (std::fs::File::open(f.path()).unwrap(), f)
    }

    #[test]
    fn reads_consecutive_requests_then_a_clean_end() {
        let (file, _keep) = reader_over(b"2\n{}10\n{\"op\":\"x\"}");
        let mut r = RequestReader::new(file.as_fd());
        assert_eq!(r.next().unwrap().unwrap(), b"{}");
        assert_eq!(r.next().unwrap().unwrap(), b"{\"op\":\"x\"}");
        assert_eq!(r.next().unwrap(), None);
    }

    #[test]
    fn a_large_request_spans_several_reads() {
        let body = vec![b'a'; 3 * READ_CHUNK + 17];
        let mut input = format!("{}\n", body.len()).into_bytes();
        input.extend_from_slice(&body);
        let (file, _keep) = reader_over(&input);
        let mut r = RequestReader::new(file.as_fd());
        assert_eq!(r.next().unwrap().unwrap(), body);
        assert_eq!(r.buf.capacity(), READ_CHUNK, "the buffer shrinks back once the big request is out");
        assert_eq!(r.next().unwrap(), None);
    }

    #[test]
    fn a_request_cut_by_the_end_of_the_buffer_is_kept_and_completed() {
        // The first read fills the buffer with the first request and the
        // start of the second, which is moved to the front before reading on.
        let first = vec![b'x'; READ_CHUNK - 50];
        let second = vec![b'y'; 300];
        let mut input = Vec::new();
        for body in [&first, &second, &first] {
            input.extend_from_slice(format!("{}\n", body.len()).as_bytes());
            input.extend_from_slice(body);
        }
        let (file, _keep) = reader_over(&input);
        let mut r = RequestReader::new(file.as_fd());
        assert_eq!(r.next().unwrap().unwrap(), first);
        assert_eq!(r.next().unwrap().unwrap(), second);
        assert_eq!(r.next().unwrap().unwrap(), first);
        assert_eq!(r.next().unwrap(), None);
        assert_eq!(r.buf.len(), READ_CHUNK, "the buffer did not grow for requests that fit it");
    }

    #[test]
    fn bad_headers_and_truncation_are_errors() {
        for (input, want) in [
            (&b"x\n{}"[..], "bad request header"),
            (&b"123456789012345678901234"[..], "bad request header"),
            (&b"99999999999999999999\n"[..], "bad request header"),
            (&b"10\n{}"[..], "truncated request"),
            (&b"10"[..], "truncated request"),
        ] {
            let (file, _keep) = reader_over(input);
            let mut r = RequestReader::new(file.as_fd());
            assert_eq!(r.next().unwrap_err().to_string(), want, "{:?}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn parses_a_run_request_and_keeps_the_id_of_a_bad_one() {
        let Parsed::Ok(r) = parse(br#"{"id":7,"op":"run","language":"python","code":"print(1)","limits":{"time_ms":1000,"memory_bytes":0,"output_bytes":10,"file_bytes":10},"max_binary_bytes":0}"#) else {
            panic!("not parsed")
        };
        assert_eq!((r.id, &*r.op, &*r.language), (7, "run", "python"));
        assert_eq!(r.limits.unwrap().output_bytes, 10);
        match parse(br#"{"id":8,"op":"run","limits":"no"}"#) {
            Parsed::Bad { id, error } => {
                assert_eq!(id.as_u64(), Some(8));
                assert!(error.starts_with("bad request"), "{error}");
            }
            Parsed::Ok(_) => panic!("accepted bad limits"),
        }
        assert!(matches!(parse(b"not json"), Parsed::Bad { id: serde_json::Value::Null, .. }));
    }

    #[test]
    fn safe_rel_keeps_paths_inside_scratch() {
        assert_eq!(safe_rel("a/./b//c").as_deref(), Some("a/b/c"));
        assert_eq!(safe_rel("main.py").as_deref(), Some("main.py"));
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a/..", ".", "./", "a\0b"] {
            assert_eq!(safe_rel(bad), None, "{bad:?}");
        }
    }
}
