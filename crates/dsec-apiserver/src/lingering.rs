//! A TCP listener whose connections close the way HTTP/1.1 asks a server to
//! ("lingering close", RFC 9112 section 9.6).
//!
//! The API answers some requests before it has read their body: an upload
//! over the size limit gets its 413 as soon as the limit is known. hyper then
//! closes the connection with the rest of the body unread, and a close with
//! unread data makes the kernel send a reset instead of a FIN. A client still
//! sending (aiohttp, `requests`, http.client all do) then fails its write with
//! EPIPE or ECONNRESET, and most of them report that broken pipe and never
//! read the 413 that is already in their receive queue. The user sees "cannot
//! reach the server" where the answer was "too large".
//!
//! So a connection that ends is not closed at once: its write side is shut
//! (the client reads the answer, then end of stream), and whatever the client
//! still sends is read and dropped until it stops, falls idle for
//! [`LINGER_IDLE`], or [`LINGER_MAX`] has passed. Then the socket closes. A
//! connection the client ended first (the usual case) reads end of stream at
//! once, so it costs one spawned task and two system calls.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// How long a closing connection may go without sending anything.
pub const LINGER_IDLE: Duration = Duration::from_secs(5);
/// How long a closing connection is drained at most.
pub const LINGER_MAX: Duration = Duration::from_secs(30);

/// Accepts TCP connections whose [`LingeringStream`] lingers when dropped.
/// Give it to `axum::serve` in place of a `TcpListener`.
pub struct LingeringListener(TcpListener);

impl LingeringListener {
    pub fn new(listener: TcpListener) -> Self {
        Self(listener)
    }
}

impl axum::serve::Listener for LingeringListener {
    type Io = LingeringStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, addr) = axum::serve::Listener::accept(&mut self.0).await;
        // Streamed answers (exec output, Connect envelopes, event streams)
        // are many small writes: with Nagle's algorithm each one after the
        // first waits for the client's delayed ACK, some 40 ms.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set on an accepted connection");
        }
        (LingeringStream(Some(stream)), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// A TCP stream that, when dropped, hands its socket to a task that lingers
/// (see the module's comment). The stream is `None` only once dropped.
pub struct LingeringStream(Option<TcpStream>);

impl LingeringStream {
    fn stream(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        self.0.as_mut().map(Pin::new).ok_or_else(|| io::ErrorKind::NotConnected.into())
    }

    /// Reads what the client sent first without taking it from the
    /// socket (the TLS listener tells a ClientHello from plain HTTP).
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.0 {
            Some(s) => s.peek(buf).await,
            None => Err(io::ErrorKind::NotConnected.into()),
        }
    }
}

impl AsyncRead for LingeringStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.stream()?.poll_read(cx, buf)
    }
}

impl AsyncWrite for LingeringStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.stream()?.poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        self.stream()?.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream()?.poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream()?.poll_shutdown(cx)
    }
}

impl Drop for LingeringStream {
    fn drop(&mut self) {
        let Some(stream) = self.0.take() else { return };
        // Outside a runtime (never, in the server) the socket just closes.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(linger(stream));
        }
    }
}

async fn linger(mut stream: TcpStream) {
    // Our FIN, if hyper has not sent it: the client's read of the answer ends.
    // An error means the peer is gone already; draining then ends at once.
    let _ = stream.shutdown().await;
    let deadline = Instant::now() + LINGER_MAX;
    let mut sink = vec![0u8; 64 << 10];
    loop {
        let until = deadline.min(Instant::now() + LINGER_IDLE);
        match tokio::time::timeout_at(until, stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => continue,
            // End of stream, an error, or time is up: close.
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use axum::http::StatusCode;
    use axum::routing::put;
    use axum::Router;

    use super::*;

    /// A body far larger than the socket buffers, so the client is still
    /// writing when the server answers and ends the connection.
    const BODY: usize = 64 << 20;

    /// Serves a route that answers 413 without reading the body, and sends
    /// it a large upload the way a simple client does: the whole body first,
    /// then the answer. Returns what the client read, or its write's error.
    async fn upload_to_early_413(lingering: bool) -> io::Result<String> {
        let app = Router::new().route("/up", put(|| async { StatusCode::PAYLOAD_TOO_LARGE }));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = if lingering {
            tokio::spawn(async move { axum::serve(LingeringListener::new(listener), app).await })
        } else {
            tokio::spawn(async move { axum::serve(listener, app).await })
        };
        let client = tokio::task::spawn_blocking(move || -> io::Result<String> {
            let mut s = std::net::TcpStream::connect(addr)?;
            s.set_read_timeout(Some(Duration::from_secs(60)))?;
            write!(s, "PUT /up HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\n\r\n")?;
            let chunk = vec![7u8; 1 << 20];
            for _ in 0..BODY / chunk.len() {
                s.write_all(&chunk)?;
            }
            let mut answer = String::new();
            s.read_to_string(&mut answer)?;
            Ok(answer)
        });
        let answer = client.await.map_err(io::Error::other)?;
        server.abort();
        answer
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_sends_its_whole_body_reads_the_early_answer() {
        let answer = upload_to_early_413(true).await.expect("the client's upload and read");
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    }

    /// Why the listener exists: without it the same client meets a reset.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_lingering_the_same_client_meets_a_reset() {
        let err = upload_to_early_413(false).await.expect_err("a plain close resets the upload");
        assert!(matches!(err.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset), "{err:?}");
    }
}
