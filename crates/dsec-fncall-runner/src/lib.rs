//! The inside of a FnCall runner: what runs in the runner's sandbox, and the
//! facts about it that the edge and the judge image's build must share.
//!
//! A runner is a container sandbox that serves one call at a time. The edge
//! (dsec-fncall's runner.rs) copies its static guest agent binary and
//! [`ZYGOTE`] into the runner and starts the binary's [`MONITOR_MODE`]
//! through the runner's agent; this crate is that mode, and the exec
//! zygote's, linked into the agent binary:
//!
//! - the monitor (monitor.rs) reads the edge's requests on its own socket,
//!   prepares each call, hands it to the zygote's pre-forked worker,
//!   answers and cleans up after it;
//! - the Python zygote is zygote.py (a warm interpreter that forks one worker
//!   ahead of each call) and its compiler; in a runner of any other language
//!   ([`EXEC_ZYGOTE_FLAG`]) the zygote is exec_zygote.rs, which forks far more
//!   cheaply and execs every step;
//! - the language table (langs.rs): each language's files, compile and run
//!   argv, environment and how its memory limit holds.
//!
//! **Invariants.** The crate is linked into the statically linked agent:
//! it depends on std, libc, rustix, serde, serde_json, base64 and
//! dsec-agent-proto's message types only, and starts no thread and no async
//! runtime (the monitor is single-threaded and makes blocking system calls).
//! The monitor never forks after starting its compiler and zygote, so no
//! call inherits its memory, and nothing of a call survives into the next
//! (processes, files, IPC objects, the scratch directory). Whatever the
//! edge or the image builder must agree on with the runner is defined here
//! once, and they take it from here: the languages and which of them
//! compile, zygote.py, the mode names, the C++ options the judge image
//! precompiles `<bits/stdc++.h>` with, and the Java class-data archives with
//! the JVM options javac's is made under.
//!
//! **API boundary.** For the agent binary: [`mode`], the [`Entry`] of a
//! mode by its name. For the edge: [`ZYGOTE`], [`MONITOR_MODE`],
//! [`EXEC_ZYGOTE_FLAG`], [`languages`] and [`is_compiled`]; the requests
//! themselves are dsec-agent-proto's `fncall::MonitorRequest`. For the judge
//! image's build: [`CPP_FLAGS`], [`JAVAC_JVM_FLAGS`], [`JAVAC_CDS_ARCHIVE`]
//! and [`JAVA_CDS_ARCHIVE`].

mod answer;
mod cleanup;
mod compiled_cache;
mod compiler;
mod edge_link;
mod error;
mod exec_zygote;
mod ipc;
mod java_class;
mod landlock;
mod langs;
mod marshal;
mod monitor;
mod outcome;
mod report;
mod request;
mod scratch;
mod spawn;
mod sweep;
mod sys;
mod worker;
mod zygote;

pub use error::RunnerError;
pub use langs::{is_compiled, languages, CPP_FLAGS, JAVAC_CDS_ARCHIVE, JAVAC_JVM_FLAGS, JAVA_CDS_ARCHIVE};

/// zygote.py, the Python zygote and compiler: the edge writes it into each
/// runner and gives its path to the monitor.
pub const ZYGOTE: &str = include_str!("zygote.py");

/// The agent binary's mode that is a runner's monitor:
/// `dsec-agent fncall-monitor ZYGOTE_PY [--exec-zygote]`.
pub const MONITOR_MODE: &str = "fncall-monitor";
/// The monitor's flag for a runner whose steps all exec a program (every
/// language but Python): its zygote is the exec zygote, and it starts no
/// compiler.
pub const EXEC_ZYGOTE_FLAG: &str = "--exec-zygote";
/// The agent binary's mode that is the exec zygote, started by the monitor.
const EXEC_ZYGOTE_MODE: &str = "fncall-exec-zygote";

/// A mode's entry point: it takes the arguments after the mode's name, and
/// its error is what the process says before it exits with a failure.
pub type Entry = fn(&[String]) -> Result<(), RunnerError>;

/// The entry point of the mode `name`, or None if it is no mode of this
/// crate.
pub fn mode(name: &str) -> Option<Entry> {
    match name {
        MONITOR_MODE => Some(monitor::run),
        EXEC_ZYGOTE_MODE => Some(exec_zygote::run),
        _ => None,
    }
}

const CALL_UID: u32 = 65534; // nobody
const CALL_GID: u32 = 65534; // nogroup
/// The compiler's own identity: neither root nor the call user.
const COMPILER_UID: u32 = 65533;
const COMPILER_GID: u32 = 65533;
const ROOT_UID: u32 = 0;
const BASE: &str = "/var/lib/dsec-fncall";
/// Every call's working directory (one call at a time per runner).
const SCRATCH: &str = "/var/lib/dsec-fncall/call";
const PROG_DIR: &str = "/var/lib/dsec-fncall/prog";
