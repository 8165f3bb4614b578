//! The runner's one error type. Its message is what the edge relays to
//! the caller (as a call's error) or what the mode says before it exits,
//! so each says what the runner was doing.
//!
//! Written out rather than derived: the crate is linked into the static
//! agent and keeps its dependencies to the few the crate docs list.

use std::borrow::Cow;
use std::fmt;
use std::io;

#[derive(Debug)]
pub enum RunnerError {
    /// A system call or file operation of the runner's own. `what` is
    /// borrowed when constant: `os` is made before the call it maps, on
    /// every call's path, and must not allocate when nothing fails.
    Sys { what: Cow<'static, str>, source: io::Error },
    /// A helper process (the zygote, the compiler, a worker, the monitor
    /// on the other end) died or broke its protocol.
    Helper(String),
    /// A request of the edge's, or a message of a helper's, that does not
    /// parse.
    Malformed(String),
    /// A call asks for what the runner cannot do (a path outside its
    /// working directory, an interpreter the image lacks, an environment
    /// too large for a worker's message).
    Refused(String),
    /// The mode was started with arguments it does not take.
    Usage(String),
}

impl fmt::Display for RunnerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunnerError::Sys { what, source } => write!(f, "{what}: {source}"),
            RunnerError::Helper(m) | RunnerError::Malformed(m) | RunnerError::Refused(m) | RunnerError::Usage(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for RunnerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunnerError::Sys { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// For `map_err` on a system call (std's or rustix's error): "`what`: why".
pub fn os<E: Into<io::Error>>(what: impl Into<Cow<'static, str>>) -> impl FnOnce(E) -> RunnerError {
    let what = what.into();
    move |e| RunnerError::Sys { what, source: e.into() }
}

/// A libc call that just failed: "`what`: errno's message".
pub fn last_os(what: impl Into<Cow<'static, str>>) -> RunnerError {
    RunnerError::Sys { what: what.into(), source: io::Error::last_os_error() }
}

/// A helper's failure.
pub fn broken(why: impl Into<String>) -> RunnerError {
    RunnerError::Helper(why.into())
}

/// A message that does not parse.
pub fn malformed(why: impl Into<String>) -> RunnerError {
    RunnerError::Malformed(why.into())
}

/// A call the runner refuses.
pub fn refused(why: impl Into<String>) -> RunnerError {
    RunnerError::Refused(why.into())
}
