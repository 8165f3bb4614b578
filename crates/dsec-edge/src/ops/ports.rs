//! Connections to a TCP port inside a running sandbox, for the API's port
//! proxy (`/v1/sandboxes/{id}/ports/{port}/...`).
//!
//! A container's port is reached at `127.0.0.1:PORT` of its own network
//! namespace: a short-lived thread joins that namespace through the agent's
//! pidfd, creates and connects the socket there, and ends. A socket stays
//! in the namespace it was created in, so the connection reaches the
//! sandbox's loopback and nothing else: not the host, not another sandbox.
//! A VM's ports are not reachable this way (its network stack is inside
//! the guest kernel): refused as an unsupported backend.

use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use crate::edge::{ActivityGuard, Edge};
use crate::error::EdgeError;
use crate::model::{BackendKind, Caller};

/// A loopback connect either completes or is refused at once; the bound
/// only covers a listener whose accept queue is full.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An open connection to a port inside a sandbox.
pub struct PortConnection {
    pub stream: tokio::net::TcpStream,
    /// Resolves when the sandbox's process ends: the proxy then drops the
    /// connection (and whatever it carries).
    pub ended: SandboxEnded,
    /// Counts the connection as activity for the idle TTL while it is open.
    pub activity: ActivityGuard,
}

/// The end of a sandbox's process, as a future (its pidfd turns readable).
pub struct SandboxEnded(AsyncFd<OwnedFd>);

impl SandboxEnded {
    pub async fn wait(&self) {
        // An error (the fd cannot be polled) counts as ended: the proxy
        // must never outlive a sandbox it cannot watch.
        let _ = self.0.readable().await;
    }
}

impl Edge {
    /// Connects to `port` on the loopback of a running container sandbox
    /// (resuming it first if paused).
    pub async fn connect_port(&self, caller: &Caller, id: &str, port: u16) -> Result<PortConnection, EdgeError> {
        if port == 0 {
            return Err(EdgeError::Invalid("port 0 is not a port".into()));
        }
        let (entry, inst) = self.running(caller, id).await?;
        match entry.record().spec.backend {
            BackendKind::Container => {}
            other => {
                return Err(EdgeError::UnsupportedBackend(format!("{id} is a {other:?} sandbox: port forwarding reaches containers only")))
            }
        }
        let activity = entry.begin();
        let dup = |what: &str| inst.pidfd.try_clone().map_err(|e| EdgeError::Internal(format!("dup the pidfd of {id} ({what}): {e}")));
        let (for_connect, for_watch) = (dup("connect")?, dup("watch")?);
        // SAFETY: the AsyncFd owns `for_watch`, so it stays open for as long
        // as it is registered.
        let ended = unsafe { AsyncFd::register(for_watch) }.map_err(|e| EdgeError::Internal(format!("watch the pidfd of {id}: {e}")))?;
        let connected = tokio::task::spawn_blocking(move || connect_inside(for_connect, port))
            .await
            .map_err(|e| EdgeError::Internal(format!("port connect task: {e}")))?;
        let stream = match connected {
            Ok(s) => s,
            Err(ConnectError::Refused(e)) => {
                return Err(EdgeError::PortClosed(format!("nothing accepts connections on port {port} of sandbox {id} ({e})")))
            }
            Err(ConnectError::Setup(e)) => return Err(EdgeError::Internal(format!("reach the network of {id}: {e}"))),
        };
        stream.set_nonblocking(true).map_err(|e| EdgeError::Internal(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let stream = tokio::net::TcpStream::from_std(stream).map_err(|e| EdgeError::Internal(e.to_string()))?;
        Ok(PortConnection { stream, ended: SandboxEnded(ended), activity })
    }
}

enum ConnectError {
    /// Joining the namespace or the thread failed: the platform's fault.
    Setup(std::io::Error),
    /// The connect itself failed: nothing listens there.
    Refused(std::io::Error),
}

/// Connects from a fresh thread that joins the network namespace of the
/// process behind `pidfd`; the thread ends right after, so no thread of the
/// edge is ever left in a sandbox's namespace.
fn connect_inside(pidfd: OwnedFd, port: u16) -> Result<TcpStream, ConnectError> {
    let worker = std::thread::Builder::new().name("dsec-port-connect".into()).spawn(move || {
        // SAFETY: setns on this thread only (it ends after the connect),
        // with a pidfd we own; CLONE_NEWNET is the one namespace joined.
        if unsafe { libc::setns(pidfd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(ConnectError::Setup(std::io::Error::last_os_error()));
        }
        let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
        TcpStream::connect_timeout(&addr.into(), CONNECT_TIMEOUT).map_err(ConnectError::Refused)
    });
    match worker {
        Ok(handle) => handle.join().unwrap_or_else(|_| Err(ConnectError::Setup(std::io::Error::other("connect thread panicked")))),
        Err(e) => Err(ConnectError::Setup(e)),
    }
}
