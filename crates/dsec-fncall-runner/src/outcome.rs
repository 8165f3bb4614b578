//! What a call's end means: the result fields of an answer, from the
//! worker's wait status, its resource usage and the monitor's clock.

use std::time::Duration;

use serde::Serialize;

use super::report::WorkerEnd;

#[derive(Debug, Default, PartialEq, Serialize)]
pub struct Outcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The wall-clock limit passed, or the CPU limit (SIGXCPU).
    pub timed_out: bool,
    pub wall_ms: f64,
    pub cpu_ms: f64,
    pub peak_memory_kb: u64,
    /// The output passed its limit (SIGXFSZ here; the monitor also sets it
    /// when a memfd holds more than the limit).
    pub output_exceeded: bool,
    /// A language whose memory limit RLIMIT_AS does not hold (langs.rs
    /// MemoryCap::Runtime) peaked above it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub memory_exceeded: bool,
    /// A process of the call would not die (the edge retires the runner).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unclean: bool,
}

pub fn outcome(end: &WorkerEnd, timed_out: bool, wall: Duration) -> Outcome {
    let status = end.status;
    let (exit_code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None) // stopped or continued: the zygote reports only ends
    };
    Outcome {
        exit_code,
        signal,
        timed_out: timed_out || signal == Some(libc::SIGXCPU),
        wall_ms: wall.as_secs_f64() * 1000.0,
        cpu_ms: (end.utime_s + end.stime_s) * 1000.0,
        peak_memory_kb: end.maxrss_kb,
        output_exceeded: signal == Some(libc::SIGXFSZ),
        memory_exceeded: false,
        unclean: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(status: i32) -> WorkerEnd {
        WorkerEnd { status, utime_s: 0.25, stime_s: 0.5, maxrss_kb: 77, strays: false }
    }

    #[test]
    fn exits_and_signals() {
        let ok = outcome(&end(3 << 8), false, Duration::from_millis(12));
        assert_eq!((ok.exit_code, ok.signal, ok.timed_out, ok.output_exceeded), (Some(3), None, false, false));
        assert_eq!((ok.wall_ms, ok.cpu_ms, ok.peak_memory_kb), (12.0, 750.0, 77));
        let killed = outcome(&end(libc::SIGKILL), false, Duration::ZERO);
        assert_eq!((killed.exit_code, killed.signal, killed.timed_out), (None, Some(libc::SIGKILL), false));
    }

    #[test]
    fn limits_become_verdict_flags() {
        assert!(outcome(&end(libc::SIGKILL), true, Duration::ZERO).timed_out, "the wall clock ran out");
        assert!(outcome(&end(libc::SIGXCPU), false, Duration::ZERO).timed_out, "the CPU limit ran out");
        let big = outcome(&end(libc::SIGXFSZ), false, Duration::ZERO);
        assert!(big.output_exceeded && !big.timed_out);
    }

    #[test]
    fn unclean_appears_only_when_set() {
        let mut o = outcome(&end(0), false, Duration::ZERO);
        assert!(!serde_json::to_string(&o).unwrap().contains("unclean"));
        o.unclean = true;
        assert!(serde_json::to_string(&o).unwrap().contains("\"unclean\":true"));
    }
}
