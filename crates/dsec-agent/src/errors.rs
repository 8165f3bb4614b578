//! Mapping of OS errors to the protocol's error kinds.
//!
//! The edge turns `ErrorKind` into HTTP status codes, so the mapping decides
//! what a user sees: keep it exact rather than lumping everything into `Io`.

use std::fmt::Display;

use dsec_agent_proto::{AgentError, ErrorKind};
use rustix::io::Errno;

/// The protocol error kind for an errno.
pub fn kind_of(e: Errno) -> ErrorKind {
    match e {
        Errno::NOENT => ErrorKind::NotFound,
        // A read-only layer refuses a write the same way a permission would.
        Errno::ACCESS | Errno::PERM | Errno::ROFS => ErrorKind::PermissionDenied,
        Errno::EXIST => ErrorKind::AlreadyExists,
        Errno::NOTDIR => ErrorKind::NotADirectory,
        Errno::ISDIR => ErrorKind::IsADirectory,
        Errno::NOTEMPTY => ErrorKind::DirectoryNotEmpty,
        Errno::NOSPC | Errno::DQUOT => ErrorKind::NoSpace,
        // openat2's RESOLVE_IN_ROOT / RESOLVE_BENEATH / RESOLVE_NO_MAGICLINKS
        // answer ELOOP or EXDEV when a path tries to leave the root or
        // crosses a /proc magic link.
        Errno::LOOP | Errno::XDEV | Errno::NAMETOOLONG => ErrorKind::InvalidPath,
        Errno::INVAL => ErrorKind::InvalidArgument,
        Errno::FBIG => ErrorKind::TooLarge,
        _ => ErrorKind::Io,
    }
}

/// An `AgentError` for a failed system call, with what was being done.
pub fn os_err(context: impl Display, e: Errno) -> AgentError {
    AgentError::new(kind_of(e), format!("{context}: {e}"))
}

/// Same, from a `std::io::Error` (for the few std APIs the agent uses).
pub fn io_err(context: impl Display, e: std::io::Error) -> AgentError {
    match e.raw_os_error() {
        Some(n) => os_err(context, Errno::from_raw_os_error(n)),
        None => AgentError::new(ErrorKind::Io, format!("{context}: {e}")),
    }
}

pub fn invalid(msg: impl Into<String>) -> AgentError {
    AgentError::new(ErrorKind::InvalidArgument, msg)
}

pub fn protocol(msg: impl Into<String>) -> AgentError {
    AgentError::new(ErrorKind::Protocol, msg)
}

pub fn cancelled() -> AgentError {
    AgentError::new(ErrorKind::Cancelled, "cancelled by the edge")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_table() {
        let cases = [
            (Errno::NOENT, ErrorKind::NotFound),
            (Errno::ACCESS, ErrorKind::PermissionDenied),
            (Errno::PERM, ErrorKind::PermissionDenied),
            (Errno::EXIST, ErrorKind::AlreadyExists),
            (Errno::NOTDIR, ErrorKind::NotADirectory),
            (Errno::ISDIR, ErrorKind::IsADirectory),
            (Errno::NOTEMPTY, ErrorKind::DirectoryNotEmpty),
            (Errno::NOSPC, ErrorKind::NoSpace),
            (Errno::DQUOT, ErrorKind::NoSpace),
            (Errno::LOOP, ErrorKind::InvalidPath),
            (Errno::XDEV, ErrorKind::InvalidPath),
            (Errno::IO, ErrorKind::Io),
        ];
        for (e, k) in cases {
            assert_eq!(kind_of(e), k, "{e:?}");
        }
    }

    #[test]
    fn message_names_the_step_and_the_error() {
        let e = os_err("mkdir /a", Errno::NOENT);
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(e.message.starts_with("mkdir /a: "), "{}", e.message);
        assert!(e.message.contains("No such file"), "{}", e.message);
    }
}
