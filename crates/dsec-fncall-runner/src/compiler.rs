//! The compiler: a warm Python interpreter (`zygote.py --compiler`) that
//! turns a Python call's source into a marshalled code object, so that the
//! worker only loads it. A worker is a fresh fork of the zygote, and
//! compiling there writes to some fifty pages it shares with the zygote,
//! each a copied page: about 0.9 ms of the worker's CPU per call on a
//! loaded 2-core machine, against well under 0.1 ms in this process, which
//! never forks.
//!
//! It runs the call's code through CPython's compiler, never the code
//! itself, but that code is hostile: the compiler runs as its own uid
//! (COMPILER_UID: not root, not the call user, so calls can neither signal
//! nor trace it), with no_new_privs and in a Landlock domain where it can
//! write nowhere. It serves one source at a time and keeps nothing of one
//! call for the next. The monitor remembers what became of the last
//! sources (compiled_cache.rs) and asks again only for a new one.
//!
//! Protocol (two pipes): the monitor writes an 8-byte little-endian length
//! and the source; the compiler answers with one kind byte, an 8-byte
//! length and the payload. Kinds: `c` the marshalled code, `e` the text of
//! the SyntaxError `python3 main.py` would print, `f` "let the worker
//! compile it" (a code object too big for the worker's message, or a
//! compile that ran out of stack or memory here: the worker then fails the
//! same way, within the call's limits). It says `r` once, when ready.

use crate::error::{broken, os, RunnerError};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use super::compiled_cache::{CompiledCache, MAX_SOURCE};
use super::landlock;
use super::spawn::{python_helper, Confinement};
use super::sys::write_all;
use super::{COMPILER_GID, COMPILER_UID};

/// What became of a source.
#[derive(Debug, Clone, PartialEq)]
pub enum Compiled {
    /// The marshalled code object.
    Code(Vec<u8>),
    /// What `python3 main.py` prints for it (exit status 1).
    SyntaxError(Vec<u8>),
    /// The worker compiles it from its file.
    InWorker,
}

impl Compiled {
    /// Bytes it holds.
    pub fn payload_len(&self) -> usize {
        match self {
            Compiled::Code(b) | Compiled::SyntaxError(b) => b.len(),
            Compiled::InWorker => 0,
        }
    }
}

pub struct Compiler {
    pub pid: i32,
    to: OwnedFd,
    from: OwnedFd,
    /// A source was sent and its answer not read yet.
    pending: bool,
    /// That source, if small enough to remember what became of it.
    submitted: Option<Vec<u8>>,
    /// The answer `result` gives without asking the compiler.
    known: Option<Compiled>,
    cache: CompiledCache,
}

/// Kind byte and length before every answer.
const HEADER: usize = 9;
/// Bytes asked of the pipe per read (a whole ordinary answer).
const READ_CHUNK: usize = 64 << 10;
/// More than this is not an answer (a code object is at most the worker's
/// message; a SyntaxError's text holds one line of the source).
const MAX_ANSWER: usize = 64 << 20;

impl Compiler {
    /// Starts the compiler from `script` (zygote.py) with `python`. It
    /// compiles for `path` (the file name tracebacks show).
    pub fn start(python: &str, script: &str, path: &str) -> Result<Compiler, RunnerError> {
        let (src_theirs, to) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(os("pipe"))?;
        let (from, out_theirs) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(os("pipe"))?;
        // Writes nowhere: a ruleset handling every write right, with no rule.
        let ruleset = landlock::ruleset(&[]).map_err(os("confining the compiler"))?;
        // The script is root's: opened here, read by Python from stdin.
        let script = rustix::fs::open(script, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
            .map_err(|e| os(script.to_string())(e))?;
        let confinement = Confinement {
            ruleset: ruleset.as_ref().map(|r| r.as_raw_fd()),
            user: Some((COMPILER_UID, COMPILER_GID)),
            stdin: Some(script.as_raw_fd()),
        };
        let keep = [src_theirs.as_raw_fd(), out_theirs.as_raw_fd()];
        let pid = python_helper(python, "-", "compiler", &keep, &confinement, &[])?;
        drop((ruleset, script, src_theirs, out_theirs));
        let mut c = Compiler { pid, to, from, pending: false, submitted: None, known: None, cache: CompiledCache::default() };
        // Its first message: the file name the code objects carry.
        c.send(path.as_bytes())?;
        match c.answer()? {
            (b'r', _) => Ok(c),
            (kind, _) => Err(broken(format!("the compiler started with {:?}", kind as char))),
        }
    }

    fn send(&self, data: &[u8]) -> Result<(), RunnerError> {
        let mut msg = Vec::with_capacity(8 + data.len());
        msg.extend_from_slice(&(data.len() as u64).to_le_bytes());
        msg.extend_from_slice(data);
        write_all(self.to.as_fd(), &msg).map_err(os("the compiler is gone"))
    }

    #[cfg(test)]
    fn compile(&mut self, source: &[u8]) -> Result<Compiled, RunnerError> {
        self.submit(source)?;
        self.result()
    }

    /// The next answer: kind and payload. The compiler writes each answer
    /// at once and nothing before it is asked, so one read usually takes
    /// it all.
    fn answer(&mut self) -> Result<(u8, Vec<u8>), RunnerError> {
        let mut got = Vec::new();
        read_at_least(&self.from, &mut got, HEADER)?;
        let len = u64::from_le_bytes(got[1..HEADER].try_into().expect("8 bytes")) as usize;
        if len > MAX_ANSWER {
            return Err(broken(format!("the compiler announced {len} bytes")));
        }
        read_at_least(&self.from, &mut got, HEADER + len)?;
        if got.len() != HEADER + len {
            return Err(broken("the compiler answered more than it announced"));
        }
        Ok((got[0], got.split_off(HEADER)))
    }

    /// Hands the compiler a source, unless what became of it is
    /// remembered; `result` gets the answer. The monitor prepares the call
    /// meanwhile (on another core, if free). An answer nobody asked for
    /// (the call failed before it needed its code) is read first, and
    /// remembered. Err means the compiler is gone.
    pub fn submit(&mut self, source: &[u8]) -> Result<(), RunnerError> {
        if self.pending {
            self.take_answer()?;
        }
        self.known = self.cache.get(source);
        if self.known.is_some() {
            return Ok(());
        }
        self.submitted = (source.len() <= MAX_SOURCE).then(|| source.to_vec());
        self.send(source)?;
        self.pending = true;
        Ok(())
    }

    /// What became of the source last submitted. Err means the compiler is
    /// gone or confused (the runner is then retired).
    pub fn result(&mut self) -> Result<Compiled, RunnerError> {
        if let Some(known) = self.known.take() {
            return Ok(known);
        }
        if !self.pending {
            return Err(broken("no source was submitted to the compiler"));
        }
        self.take_answer()
    }

    /// Reads the pending answer and remembers it.
    fn take_answer(&mut self) -> Result<Compiled, RunnerError> {
        self.pending = false;
        let compiled = match self.answer()? {
            (b'c', code) => Compiled::Code(code),
            (b'e', text) => Compiled::SyntaxError(text),
            (b'f', _) => Compiled::InWorker,
            (kind, _) => return Err(broken(format!("the compiler answered {:?}", kind as char))),
        };
        if let Some(source) = self.submitted.take() {
            self.cache.put(source, compiled.clone());
        }
        Ok(compiled)
    }
}

/// Reads into `buf` until it holds at least `want` bytes.
fn read_at_least(fd: &OwnedFd, buf: &mut Vec<u8>, want: usize) -> Result<(), RunnerError> {
    while buf.len() < want {
        let have = buf.len();
        buf.resize(have + (want - have).max(READ_CHUNK), 0);
        let r = rustix::io::read(fd, &mut buf[have..]);
        buf.truncate(have + *r.as_ref().unwrap_or(&0));
        match r {
            Ok(0) => return Err(broken("the compiler is gone")),
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(os("reading from the compiler")(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real compiler (this machine's python3, as root like the monitor).
    #[test]
    fn compiles_refuses_and_defers() {
        let python = crate::sys::which("python3").expect("python3 is needed to test the compiler");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/src/zygote.py");
        let mut c = Compiler::start(&python, script, "/x/main.py").unwrap();
        let Compiled::Code(code) = c.compile(b"print(6 * 7)").unwrap() else { panic!("not compiled") };
        assert_eq!(code[0] & 0x7f, b'c', "a marshalled code object");
        let Compiled::SyntaxError(text) = c.compile(b"x = (1,\nprint(x").unwrap() else { panic!("no SyntaxError") };
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("/x/main.py\", line 2") && text.ends_with("SyntaxError: '(' was never closed\n"), "{text}");
        let Compiled::SyntaxError(text) = c.compile(b"print(1)\0").unwrap() else { panic!("NUL accepted") };
        assert!(String::from_utf8_lossy(&text).contains("null bytes"));
        // Too deep for the compiler's stack: the worker meets it within the call's limits.
        assert_eq!(c.compile(&[b"-".repeat(200_000), b"1".to_vec()].concat()).unwrap(), Compiled::InWorker);
        // An answer never asked for is read before the next one.
        c.submit(b"print(1)").unwrap();
        assert!(matches!(c.compile(b"x = (").unwrap(), Compiled::SyntaxError(_)));
        // A source seen before is answered from memory (the compiler,
        // killed here, is not asked), even after others; a new one is the
        // compiler's again.
        let Compiled::Code(first) = c.compile(b"print(6 * 7)").unwrap() else { panic!("not compiled") };
        let status = std::fs::read_to_string(format!("/proc/{}/status", c.pid)).unwrap();
        // SAFETY: kill takes integers; the pid is our own child's.
        assert_eq!(unsafe { libc::kill(c.pid, libc::SIGKILL) }, 0);
        let mut exit = 0;
        // SAFETY: waitpid writes only `exit`.
        unsafe { libc::waitpid(c.pid, &mut exit, 0) };
        assert_eq!(c.compile(b"print(6 * 7)").unwrap(), Compiled::Code(first));
        assert!(matches!(c.compile(b"print(1)").unwrap(), Compiled::Code(_)), "an answer nobody asked for is remembered too");
        assert!(c.compile(b"print(6 * 8)").is_err(), "a new source needs the compiler");
        // Compiled in the worker is not remembered: asked again.
        assert!(c.compile(&[b"-".repeat(200_000), b"1".to_vec()].concat()).is_err());
        // Neither root nor able to gain privileges (read before the kill).
        assert!(
            status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().skip(1).all(|u| u == COMPILER_UID.to_string())),
            "{status}"
        );
        assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{status}");
        drop(c);
    }
}
