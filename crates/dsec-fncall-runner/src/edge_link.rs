//! The monitor's own connection to the edge: a Unix socket the edge
//! connects to from the host (through `/proc/PID/root` of the runner's
//! agent), so that requests and answers go straight between the two
//! instead of through the guest agent's exec streams (one process and two
//! wake-ups fewer per call, and no framing or flow control on the way).
//!
//! The socket lives in a directory only root may enter, exists only until
//! the edge's one connection is accepted (before any call runs), and is
//! then removed with its directory, so no process of a call can ever
//! reach it.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

pub use dsec_agent_proto::fncall::MONITOR_SOCKET;

/// The socket's own directory.
fn socket_dir() -> &'static Path {
    Path::new(MONITOR_SOCKET).parent().expect("MONITOR_SOCKET is an absolute path")
}

/// A bound socket waiting for the edge.
pub struct Listener(UnixListener);

impl Listener {
    /// Binds `MONITOR_SOCKET`, replacing what an earlier monitor of
    /// this runner may have left (there is none unless it crashed).
    pub fn bind() -> io::Result<Listener> {
        let dir = socket_dir();
        let _ = std::fs::remove_dir_all(dir);
        std::fs::DirBuilder::new().mode(0o700).create(dir)?;
        // The mode asked of mkdir is cut by the umask; this one is not.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(Listener(UnixListener::bind(MONITOR_SOCKET)?))
    }

    /// Waits for the edge's connection (the runner is removed if it never
    /// comes: the edge bounds a runner's start), then removes the socket so
    /// that nothing else can connect.
    pub fn accept(self) -> io::Result<UnixStream> {
        let (stream, _) = self.0.accept()?;
        std::fs::remove_dir_all(socket_dir())?;
        Ok(stream)
    }
}
