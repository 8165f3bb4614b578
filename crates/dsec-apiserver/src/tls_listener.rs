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
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&acceptor, stream)).await {
                        Ok(Ok(Some(tls))) => {
                            let _ = tx.send((tls, addr)).await;
                        }
                        Ok(Ok(None)) => tracing::debug!(%addr, "plain HTTP on the TLS port: told to use https"),
                        // A client that does not trust us: its own error
                        // tells it.
                        Ok(Err(e)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local })
    }
}

/// What a plain HTTP request to this port gets instead of a closed
/// connection (which curl and browsers report as an empty reply).
const USE_HTTPS: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 37\r\nConnection: close\r\n\r\nthis port serves HTTPS: use https://\n";

/// The TLS handshake, or `None` when the client spoke plain HTTP (its
/// first byte a letter, where a TLS record starts with 0x16): it is told
/// to use https.
async fn handshake(acceptor: &dsec_tls::TlsAcceptor, mut stream: LingeringStream) -> io::Result<Option<TlsStream>> {
    use tokio::io::AsyncWriteExt;
    let mut first = [0u8; 1];
    if stream.peek(&mut first).await? == 1 && first[0].is_ascii_uppercase() {
        stream.write_all(USE_HTTPS).await?;
        return Ok(None);
    }
    acceptor.accept(stream).await.map(Some)
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn plain_http_on_the_tls_port_is_told_to_use_https_and_tls_works() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dsec_tls::init_ca(&dir.path().join("ca"), "t").unwrap();
        let node = dsec_tls::issue(&dir.path().join("ca"), "n", &["127.0.0.1".into()], 1, dir.path()).unwrap();
        let config = dsec_tls::server_config(&node.cert, &node.key).unwrap();
        let mut listener = TlsListener::new(TcpListener::bind("127.0.0.1:0").await.unwrap(), config).unwrap();
        let port = axum::serve::Listener::local_addr(&listener).unwrap().port();

        let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        plain.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        plain.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 400 ") && answer.ends_with("use https://\n"), "{answer:?}");
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())), "{head}");

        let client = tokio::spawn(async move {
            let mut s = dsec_tls::connect(dsec_tls::client_config(Some(&ca.cert)).unwrap(), "127.0.0.1", port).await.unwrap();
            s.write_all(b"ping").await.unwrap();
            let mut back = [0u8; 4];
            s.read_exact(&mut back).await.unwrap();
            back
        });
        let (mut tls, _) = axum::serve::Listener::accept(&mut listener).await;
        let mut got = [0u8; 4];
        tls.read_exact(&mut got).await.unwrap();
        tls.write_all(&got).await.unwrap();
        tls.flush().await.unwrap();
        assert_eq!(&client.await.unwrap(), b"ping");
    }
}
