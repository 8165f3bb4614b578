//! `Op::ConnectPort`: a connection to a port of the sandbox's loopback,
//! relayed over the request's `Data` frames.
//!
//! This is how the edge reaches a port inside a VM, whose network stack is
//! the guest kernel's: the agent, inside, connects to `127.0.0.1:PORT` and
//! relays. Nothing else is reachable this way (the address is fixed), and
//! both directions keep the channel's flow control: the guest's bytes go
//! out only as the edge grants credit, the edge's as the socket takes them.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::rc::Rc;
use std::time::Duration;

use dsec_agent_proto::{AgentError, ErrorKind, Reply, Stream, MAX_CHUNK_BYTES};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::errors::invalid;
use crate::request::ReqCtx;

/// A loopback connect completes or is refused at once; this bounds only a
/// listener whose accept queue is full.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn connect(ctx: &Rc<ReqCtx>, port: u16) -> Result<Reply, AgentError> {
    if port == 0 {
        return Err(invalid("port 0 is not a port"));
    }
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let closed = |why: String| AgentError::new(ErrorKind::NotFound, format!("nothing accepts connections on port {port} ({why})"));
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(closed(e.to_string())),
        Err(_) => return Err(closed(format!("no accept within {} s", CONNECT_TIMEOUT.as_secs()))),
    };
    let _ = stream.set_nodelay(true);
    // Connected: an empty frame says so before any byte flows.
    ctx.send_data(Stream::Content, &[]);
    relay(ctx, stream).await
}

async fn relay(ctx: &Rc<ReqCtx>, stream: TcpStream) -> Result<Reply, AgentError> {
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = vec![0u8; MAX_CHUNK_BYTES];
    // Bytes from the edge not yet taken by the socket, and how far in.
    let mut pending: Option<(Vec<u8>, usize)> = None;
    let mut reading = true;
    let mut writing = true;
    loop {
        if let Some(e) = ctx.abort_error() {
            return Err(e);
        }
        if pending.is_none() {
            pending = ctx.take_input().map(|chunk| (chunk, 0));
        }
        if !writing {
            // The guest stopped reading: what still comes is dropped (and
            // credited, so the edge is never stuck on a full window).
            if let Some((chunk, _)) = pending.take() {
                ctx.consumed(chunk.len());
                continue;
            }
        }
        if writing && pending.is_none() && ctx.input_done() {
            let _ = wr.shutdown().await;
            writing = false;
        }
        if !reading && !writing && pending.is_none() {
            return Ok(Reply::Done);
        }
        let room = ctx.sendable();
        tokio::select! {
            _ = ctx.changed() => {}
            r = rd.read(&mut buf[..room.max(1)]), if reading && room > 0 => match r {
                Ok(0) | Err(_) => reading = false,
                Ok(n) => ctx.send_data(Stream::Content, &buf[..n]),
            },
            w = async {
                let (chunk, off) = pending.as_ref().expect("guarded by is_some");
                wr.write(&chunk[*off..]).await
            }, if writing && pending.is_some() => match w {
                Ok(n) if n > 0 => {
                    let (chunk, off) = pending.as_mut().expect("guarded by is_some");
                    *off += n;
                    if *off == chunk.len() {
                        ctx.consumed(chunk.len());
                        pending = None;
                    }
                }
                _ => writing = false,
            },
        }
    }
}
