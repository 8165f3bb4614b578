//! Connections to a TCP port inside a running sandbox, for the API's port
//! proxy (`/v1/sandboxes/{id}/ports/{port}/...`).
//!
//! A container's port is reached at `127.0.0.1:PORT` of its own network
//! namespace: a short-lived thread joins that namespace through the agent's
//! pidfd, creates and connects the socket there, and ends. A socket stays
//! in the namespace it was created in, so the connection reaches the
//! sandbox's loopback and nothing else: not the host, not another sandbox.
//!
//! A VM's network stack is the guest kernel's, out of reach of `setns`:
//! its agent connects to `127.0.0.1:PORT` inside and relays the bytes over
//! the agent channel (`Op::ConnectPort`), with the channel's flow control
//! both ways. The proxy sees one byte stream either way.

use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use dsec_agent_proto::client::{AgentClient, CallEvent};
use dsec_agent_proto::{ErrorKind, Op};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::edge::{ActivityGuard, Edge};
use crate::error::EdgeError;
use crate::model::{BackendKind, Caller};

/// A loopback connect either completes or is refused at once; the bound
/// only covers a listener whose accept queue is full.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes both ways: a TCP stream (containers) or the relay through a VM's
/// agent.
pub trait PortIo: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> PortIo for T {}

/// The bytes of the relay in flight between the proxy and the agent.
const RELAY_BUFFER: usize = 256 << 10;

/// An open connection to a port inside a sandbox.
pub struct PortConnection {
    pub stream: Box<dyn PortIo>,
    /// Resolves when the sandbox's process ends: the proxy then drops the
    /// connection (and whatever it carries).
    pub ended: SandboxEnded,
    /// Counts the connection as activity for the idle TTL while it is open.
    pub activity: ActivityGuard,
}

/// The end of a sandbox's process, as a future (its pidfd turns readable).
pub struct SandboxEnded(AsyncFd<OwnedFd>);

impl SandboxEnded {
    /// Watches the sandbox process behind `pidfd` (a duplicate of it).
    fn of(pidfd: &OwnedFd, id: &str) -> Result<SandboxEnded, EdgeError> {
        let fd = pidfd.try_clone().map_err(EdgeError::sandbox_sys(id, "dup the pidfd"))?;
        // SAFETY: the AsyncFd owns `fd`, so it stays open for as long as it
        // is registered.
        let watch = unsafe { AsyncFd::register(fd) }.map_err(|e| EdgeError::sandbox_sys(id, "watch the pidfd")(e.into()))?;
        Ok(SandboxEnded(watch))
    }

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
        let relayed = match entry.record().spec.backend {
            BackendKind::Container => false,
            BackendKind::Microvm | BackendKind::Vm => true,
            other => return Err(EdgeError::UnsupportedBackend(format!("{id} is a {other:?} sandbox: it has no ports"))),
        };
        let activity = entry.begin();
        let ended = SandboxEnded::of(&inst.pidfd, id)?;
        if relayed {
            let stream = relay(&inst.agent, id, port).await?;
            return Ok(PortConnection { stream, ended, activity });
        }
        let for_connect = inst.pidfd.try_clone().map_err(EdgeError::sandbox_sys(id, "dup the pidfd"))?;
        let connected =
            tokio::task::spawn_blocking(move || connect_inside(for_connect, port)).await.map_err(EdgeError::task("port connect"))?;
        let stream = match connected {
            Ok(s) => s,
            Err(ConnectError::Refused(e)) => {
                return Err(EdgeError::PortClosed(format!("nothing accepts connections on port {port} of sandbox {id} ({e})")))
            }
            Err(ConnectError::Setup(e)) => return Err(EdgeError::SandboxSys { id: id.to_string(), call: "reach the network", source: e }),
        };
        stream.set_nonblocking(true).map_err(EdgeError::sys("set a port connection non-blocking"))?;
        let _ = stream.set_nodelay(true);
        let stream = tokio::net::TcpStream::from_std(stream).map_err(EdgeError::sys("register a port connection"))?;
        Ok(PortConnection { stream: Box::new(stream), ended, activity })
    }
}

impl Edge {
    /// The end of the current process of sandbox `id` (resumed first if
    /// paused), as a future: what bounds a TCP forward.
    pub(crate) async fn end_of(&self, caller: &Caller, id: &str) -> Result<SandboxEnded, EdgeError> {
        let (_, inst) = self.running(caller, id).await?;
        SandboxEnded::of(&inst.pidfd, id)
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

/// Asks the VM's agent to connect to `port` inside and relays the
/// connection: one end of an in-memory pipe is the caller's stream, the
/// other is pumped to and from the agent's request.
async fn relay(agent: &AgentClient, id: &str, port: u16) -> Result<Box<dyn PortIo>, EdgeError> {
    let mut call = agent.open(Op::ConnectPort { port }).await?;
    match call.recv().await? {
        // The empty frame that says the agent is connected.
        Some(CallEvent::Data { .. }) => {}
        Some(CallEvent::Reply(Err(e))) if e.kind == ErrorKind::NotFound => {
            return Err(EdgeError::PortClosed(format!("{} in sandbox {id}", e.message)))
        }
        Some(CallEvent::Reply(Err(e))) => return Err(EdgeError::Agent(e)),
        Some(CallEvent::Reply(Ok(_))) | None => {
            return Err(EdgeError::PortClosed(format!("port {port} of sandbox {id} closed the connection at once")))
        }
    }
    let (ours, theirs) = tokio::io::duplex(RELAY_BUFFER);
    tokio::spawn(pump(call, theirs));
    Ok(Box::new(ours))
}

/// Moves bytes between `pipe` and the agent's request until the agent's
/// side ends (its reply) or the pipe's reader is gone. Dropping the
/// request's receiver before its reply cancels it in the agent.
async fn pump(call: dsec_agent_proto::client::Call, pipe: tokio::io::DuplexStream) {
    let (sender, mut receiver) = call.into_split();
    let (mut from_proxy, mut to_proxy) = tokio::io::split(pipe);
    let to_guest = async {
        let mut buf = vec![0u8; dsec_agent_proto::MAX_CHUNK_BYTES];
        loop {
            match from_proxy.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = sender.send_eof();
                    break;
                }
                Ok(n) => {
                    if sender.send_data(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        // Input ended: the guest's side may still answer.
        std::future::pending::<()>().await
    };
    let from_guest = async {
        loop {
            match receiver.recv().await {
                Ok(Some(CallEvent::Data { data, .. })) => {
                    if to_proxy.write_all(&data).await.is_err() {
                        return;
                    }
                }
                // The reply, or the channel gone: nothing more comes.
                _ => {
                    let _ = to_proxy.shutdown().await;
                    return;
                }
            }
        }
    };
    tokio::select! {
        _ = to_guest => {}
        _ = from_guest => {}
    }
}
