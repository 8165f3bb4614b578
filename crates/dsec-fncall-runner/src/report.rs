//! The zygote's lines on its report pipe: first the modules it preloaded,
//! then one line per worker that ended.

use crate::error::{broken, os, RunnerError};
use std::os::fd::{AsFd, OwnedFd};

/// What the zygote says about one worker once it has reaped it.
#[derive(Debug, PartialEq)]
pub struct WorkerEnd {
    /// The wait status (as waitpid gives it).
    pub status: i32,
    pub utime_s: f64,
    pub stime_s: f64,
    pub maxrss_kb: u64,
    /// Whether the zygote has other children left (a call made a sibling
    /// of its worker with CLONE_PARENT).
    pub strays: bool,
}

/// Parses "PID STATUS UTIME STIME MAXRSS LEFT".
pub fn parse_report(line: &str) -> Option<WorkerEnd> {
    let f: Vec<&str> = line.split_ascii_whitespace().collect();
    if f.len() != 6 {
        return None;
    }
    f[0].parse::<i32>().ok()?;
    Some(WorkerEnd {
        status: f[1].parse().ok()?,
        utime_s: f[2].parse().ok()?,
        stime_s: f[3].parse().ok()?,
        maxrss_kb: f[4].parse().ok()?,
        strays: f[5] != "0",
    })
}

/// The read end of the report pipe, with what was read past a line.
pub struct Reports {
    pub fd: OwnedFd,
    buf: Vec<u8>,
}

impl Reports {
    pub fn new(fd: OwnedFd) -> Self {
        Reports { fd, buf: Vec::new() }
    }

    /// Whether a whole line was already read.
    pub fn has_line(&self) -> bool {
        self.buf.contains(&b'\n')
    }

    /// The next line, without its newline. Err at the end of the pipe
    /// (the zygote is gone) or on a read error.
    pub fn line(&mut self) -> Result<String, RunnerError> {
        loop {
            if let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
                let rest = self.buf.split_off(nl + 1);
                let mut line = std::mem::replace(&mut self.buf, rest);
                line.pop();
                return String::from_utf8(line).map_err(|_| broken("a report that is not text"));
            }
            let mut chunk = [0u8; 4096];
            match rustix::io::read(self.fd.as_fd(), &mut chunk) {
                Ok(0) => return Err(broken("the zygote is gone")),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(os("reading the zygote's reports")(e)),
            }
        }
    }

    /// The next worker's end.
    pub fn worker_end(&mut self) -> Result<WorkerEnd, RunnerError> {
        let line = self.line()?;
        parse_report(&line).ok_or_else(|| broken(format!("a bad report from the zygote: {line:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_zygotes_report() {
        assert_eq!(
            parse_report("123 256 0.010000 0.002000 9000 0"),
            Some(WorkerEnd { status: 256, utime_s: 0.01, stime_s: 0.002, maxrss_kb: 9000, strays: false })
        );
        assert!(parse_report("1 9 0.0 0.0 1 1").unwrap().strays);
        assert_eq!(parse_report("1 9 0.0 0.0 1"), None);
        assert_eq!(parse_report("1 x 0.0 0.0 1 0"), None);
    }

    #[test]
    fn lines_split_across_reads_and_the_end() {
        let (r, w) = rustix::pipe::pipe().unwrap();
        rustix::io::write(&w, b"math,json\n1 0 0").unwrap();
        let mut reports = Reports::new(r);
        assert_eq!(reports.line().unwrap(), "math,json");
        rustix::io::write(&w, b".0 0.0 5 0\n").unwrap();
        drop(w);
        assert_eq!(reports.worker_end().unwrap().maxrss_kb, 5);
        assert_eq!(reports.line().unwrap_err().to_string(), "the zygote is gone");
    }
}
