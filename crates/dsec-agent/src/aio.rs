//! Small async helpers over non-blocking fds (pipes, PTY masters).

use std::io;
use std::os::fd::OwnedFd;

use dsec_agent_proto::AgentError;
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

use crate::channel::set_nonblocking;
use crate::errors::io_err;

pub type Fd = AsyncFd<OwnedFd>;

/// Registers `fd` with the event loop (switching it to non-blocking).
pub fn register(fd: OwnedFd) -> Result<Fd, AgentError> {
    set_nonblocking(&fd).map_err(|e| io_err("fcntl", e))?;
    watch(fd).map_err(|e| io_err("epoll", e))
}

/// Registers an already non-blocking fd.
pub fn watch(fd: OwnedFd) -> io::Result<Fd> {
    // SAFETY: an OwnedFd is open, and it stays open and unchanged for as
    // long as the AsyncFd owns it.
    unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)
}

/// Readiness of an optional fd; a missing fd is never ready.
pub async fn readable(fd: &Option<Fd>) -> io::Result<AsyncFdReadyGuard<'_, OwnedFd>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

pub async fn writable(fd: &Option<Fd>) -> io::Result<AsyncFdReadyGuard<'_, OwnedFd>> {
    match fd {
        Some(fd) => fd.writable().await,
        None => std::future::pending().await,
    }
}

pub enum Read {
    Data(usize),
    Eof,
    /// Spurious readiness; wait again.
    NotReady,
}

/// One non-blocking read after readiness. EIO counts as end of file: a PTY
/// master reports it once every slave fd is closed.
pub fn read(guard: &mut AsyncFdReadyGuard<'_, OwnedFd>, buf: &mut [u8]) -> Read {
    match guard.try_io(|fd| rustix::io::read(fd.get_ref(), &mut *buf).map_err(io::Error::from)) {
        Ok(Ok(0)) => Read::Eof,
        Ok(Ok(n)) => Read::Data(n),
        Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => Read::NotReady,
        Ok(Err(_)) => Read::Eof,
        Err(_would_block) => Read::NotReady,
    }
}

pub enum Write {
    Wrote(usize),
    /// The reader is gone (EPIPE) or the fd broke.
    Closed,
    NotReady,
}

pub fn write(guard: &mut AsyncFdReadyGuard<'_, OwnedFd>, data: &[u8]) -> Write {
    match guard.try_io(|fd| rustix::io::write(fd.get_ref(), data).map_err(io::Error::from)) {
        Ok(Ok(n)) => Write::Wrote(n),
        Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => Write::NotReady,
        Ok(Err(_)) => Write::Closed,
        Err(_would_block) => Write::NotReady,
    }
}
