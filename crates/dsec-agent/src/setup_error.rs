//! The error of every step that turns a fresh process into a sandbox's
//! agent: boot (a microVM's mounts, modules, port and NIC), the root's
//! assembly, a full VM's setup. Each names the step and the errno it met,
//! which is all the edge and the console need: the step says what, the
//! errno why.

use std::fmt;

use rustix::io::Errno;

#[derive(Debug)]
pub struct SetupError {
    pub step: String,
    pub errno: Errno,
}

impl SetupError {
    pub fn new(step: impl Into<String>, errno: Errno) -> Self {
        SetupError { step: step.into(), errno }
    }

    /// From a std error, keeping its errno (EIO when it carries none).
    pub fn io(step: impl Into<String>, e: &std::io::Error) -> Self {
        Self::new(step, Errno::from_io_error(e).unwrap_or(Errno::IO))
    }

    /// From the errno the last failed libc call left.
    pub fn last_os(step: impl Into<String>) -> Self {
        Self::io(step, &std::io::Error::last_os_error())
    }
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.step, self.errno)
    }
}

impl std::error::Error for SetupError {}

pub(crate) type Result<T> = std::result::Result<T, SetupError>;

/// For `map_err` on a call that returns an errno.
pub(crate) fn fail(step: impl Into<String>) -> impl FnOnce(Errno) -> SetupError {
    let step = step.into();
    move |errno| SetupError { step, errno }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_step_and_keeps_the_errno() {
        let e = SetupError::io("mkdir /x", &std::io::Error::from_raw_os_error(libc::EEXIST));
        assert_eq!(e.errno, Errno::EXIST);
        assert_eq!(e.to_string(), format!("mkdir /x: {}", Errno::EXIST));
        // An error with no errno (a std error made from a message) is EIO.
        assert_eq!(SetupError::io("read", &std::io::Error::other("odd")).errno, Errno::IO);
    }
}
