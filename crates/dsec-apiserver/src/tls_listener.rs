//! A listener that serves TLS: connections are accepted and their
//! handshakes completed in tasks of their own, so one slow or silent
//! client never holds up the next connection, and handshakes run as soon
//! as the socket is bound (an edge that is joining answers the
//! apiserver's certificate check before it serves HTTP). Below TLS the
//! connections linger on close, as plain ones do (see `lingering`).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::lingering::{LingeringListener, LingeringStream};

/// How long a client may take over its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const BACKLOG: usize = 1024;

pub type TlsStream = dsec_tls::ServerTlsStream<LingeringStream>;

/// Give it to `axum::serve` in place of a `TcpListener`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `listener` at once (within a tokio runtime).
    pub fn new(listener: TcpListener, config: Arc<dsec_tls::ServerConfig>) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(BACKLOG);
        let acceptor = dsec_tls::TlsAcceptor::from(config);
        let mut tcp = LingeringListener::new(listener);
        tokio::spawn(async move {
            loop {
                let (stream, addr) = tokio::select! {
                    accepted = axum::serve::Listener::accept(&mut tcp) => accepted,
                    // The server is gone: stop accepting, free the port.
                    () = tx.closed() => return,
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, addr)).await;
                        }
                        // A client that does not trust us, or speaks plain
                        // HTTP to a TLS port: its own error tells it.
                        Ok(Err(e)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task never ends while this receiver lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}
