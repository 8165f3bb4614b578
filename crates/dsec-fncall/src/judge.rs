//! Turning the zygote's raw answers into step results and verdicts.

use base64::Engine as _;
use dsec_api::{RunStatus, StepResult, Verdict};

use crate::protocol::ZResponse;

const SIGKILL: i32 = 9;
const SIGABRT: i32 = 6;
const SIGSEGV: i32 = 11;

pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

pub fn unb64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(s).unwrap_or_default()
}

/// What runtimes print when an allocation fails: the JVM's and V8's own
/// out-of-memory errors, C++'s bad_alloc, Rust's allocation failure
/// ("memory allocation of N bytes failed", then an abort), Perl's and Lua's
/// reports at the address-space limit, and the dynamic loader's when the
/// limit leaves no room to map a program's libraries.
const OUT_OF_MEMORY_REPORTS: &[&[u8]] = &[
    b"java.lang.OutOfMemoryError",
    b"JavaScript heap out of memory",
    b"std::bad_alloc",
    b"memory allocation of ",
    b"Out of memory!",
    b"not enough memory",
    b"failed to map segment from shared object",
];

/// Why a run that did not exit 0 ran out of memory, if it did (a peak past
/// the limit was already found by step_result): Python's MemoryError (the
/// zygote exits 137 after printing it), a runtime's own report
/// (OUT_OF_MEMORY_REPORTS), the runner's OOM killer (SIGKILL that the time
/// limit did not send), or a crash at the address-space limit.
fn out_of_memory(r: &ZResponse, stderr: &[u8], memory_bytes: u64) -> bool {
    let ends_with = |s: &[u8], t: &[u8]| s.len() >= t.len() && &s[s.len() - t.len()..] == t;
    let contains = |s: &[u8], t: &[u8]| s.windows(t.len()).any(|w| w == t);
    (r.exit_code == Some(137) && ends_with(stderr, b"MemoryError\n"))
        || OUT_OF_MEMORY_REPORTS.iter().any(|t| contains(stderr, t))
        || (r.signal == Some(SIGKILL) && !r.timed_out)
        || (matches!(r.signal, Some(SIGABRT | SIGSEGV)) && memory_bytes > 0 && r.peak_memory_kb * 1024 >= memory_bytes / 10 * 9)
}

/// The step's outcome, with outputs decoded (invalid UTF-8 replaced).
pub fn step_result(r: &ZResponse, memory_bytes: u64) -> (StepResult, Vec<u8>) {
    let (stdout, stderr) = (r.out.clone(), &r.err);
    // Output past the limit first: a runtime that ignores SIGXFSZ (a JVM,
    // Node.js, Go) goes on after its writes fail, and may then run out of
    // time too.
    let status = if r.output_exceeded {
        RunStatus::OutputLimit
    } else if r.timed_out {
        RunStatus::Timeout
    } else if r.memory_exceeded {
        // Past the limit is past it, even for a run that then succeeded.
        RunStatus::MemoryLimit
    } else if r.exit_code == Some(0) {
        RunStatus::Ok
    } else if out_of_memory(r, stderr, memory_bytes) {
        RunStatus::MemoryLimit
    } else {
        RunStatus::RuntimeError
    };
    let step = StepResult {
        status,
        exit_code: r.exit_code,
        signal: r.signal,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(stderr).into_owned(),
        duration_ms: r.wall_ms,
        cpu_ms: r.cpu_ms,
        peak_memory_kb: r.peak_memory_kb,
        truncated: r.output_exceeded,
    };
    (step, stdout)
}

/// The verdict of a run that did not end with status `Ok`.
pub fn failure_verdict(status: RunStatus) -> Verdict {
    match status {
        RunStatus::Ok => Verdict::AC,
        RunStatus::RuntimeError => Verdict::RE,
        RunStatus::Timeout => Verdict::TLE,
        RunStatus::MemoryLimit => Verdict::MLE,
        RunStatus::OutputLimit => Verdict::OLE,
    }
}

pub fn status_name(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Ok => "ok",
        RunStatus::RuntimeError => "runtime_error",
        RunStatus::Timeout => "timeout",
        RunStatus::MemoryLimit => "memory_limit",
        RunStatus::OutputLimit => "output_limit",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(exit: Option<i32>, signal: Option<i32>, stderr: &[u8]) -> ZResponse {
        ZResponse { exit_code: exit, signal, err: stderr.to_vec(), peak_memory_kb: 1000, ..Default::default() }
    }

    #[test]
    fn statuses() {
        let mem = 256 << 20;
        assert_eq!(step_result(&resp(Some(0), None, b""), mem).0.status, RunStatus::Ok);
        assert_eq!(step_result(&resp(Some(1), None, b"Traceback"), mem).0.status, RunStatus::RuntimeError);
        assert_eq!(step_result(&resp(Some(137), None, b"MemoryError\n"), mem).0.status, RunStatus::MemoryLimit);
        assert_eq!(step_result(&resp(Some(137), None, b"other\n"), mem).0.status, RunStatus::RuntimeError);
        assert_eq!(
            step_result(&resp(None, Some(6), b"terminate called after throwing an instance of 'std::bad_alloc'"), mem).0.status,
            RunStatus::MemoryLimit
        );
        assert_eq!(step_result(&resp(None, Some(9), b""), mem).0.status, RunStatus::MemoryLimit);
        assert_eq!(step_result(&resp(None, Some(11), b""), mem).0.status, RunStatus::RuntimeError);
        let java = b"Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space\n";
        assert_eq!(step_result(&resp(Some(1), None, java), mem).0.status, RunStatus::MemoryLimit);
        let node = b"FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory\n";
        assert_eq!(step_result(&resp(None, Some(6), node), mem).0.status, RunStatus::MemoryLimit);
        // Rust, Perl and Lua at the address-space limit, and a program
        // whose libraries do not fit under it.
        for report in [
            &b"memory allocation of 419430400 bytes failed\n"[..],
            b"Out of memory!\npanic: fold_constants JMPENV_PUSH returned 2 at main.pl line 1.\n",
            b"/usr/bin/lua5.4: not enough memory\n",
            b"./prog: error while loading shared libraries: libstdc++.so.6: failed to map segment from shared object\n",
        ] {
            let (exit, signal) = if report.starts_with(b"memory") { (None, Some(6)) } else { (Some(1), None) };
            assert_eq!(
                step_result(&resp(exit, signal, report), mem).0.status,
                RunStatus::MemoryLimit,
                "{}",
                String::from_utf8_lossy(report)
            );
        }
        assert_eq!(step_result(&resp(Some(1), None, b"/usr/bin/lua5.4: main.lua:1: boom\n"), mem).0.status, RunStatus::RuntimeError);
        let mut peaked = resp(Some(0), None, b"");
        peaked.memory_exceeded = true;
        assert_eq!(step_result(&peaked, mem).0.status, RunStatus::MemoryLimit, "a run past the limit is MLE even if it exits 0");
        let mut t = resp(None, Some(9), b"");
        t.timed_out = true;
        assert_eq!(step_result(&t, mem).0.status, RunStatus::Timeout);
        let mut o = resp(None, Some(25), b"");
        o.output_exceeded = true;
        assert_eq!(step_result(&o, mem).0.status, RunStatus::OutputLimit);
        o.timed_out = true;
        assert_eq!(step_result(&o, mem).0.status, RunStatus::OutputLimit, "output past the limit, then out of time");
    }
}
