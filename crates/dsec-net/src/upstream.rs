//! Asking the node's upstream resolvers over UDP. For a sandbox that asked
//! over TCP, a truncated UDP answer (the TC bit, RFC 1035 4.2.1: it did not
//! fit in a datagram) is asked again over TCP, so the sandbox gets the whole
//! answer. A sandbox that asked over UDP gets the truncated one, as from any
//! resolver, and retries over TCP (which the edge's resolver also serves):
//! a datagram bigger than it asked for could be cut short in its buffer.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UdpSocket};

const TIMEOUT: Duration = Duration::from_secs(3);

/// The first answer to `query` from `upstreams`, tried in order; `whole`:
/// a truncated answer is asked again over TCP.
pub(crate) async fn ask(upstreams: &[SocketAddr], query: &[u8], whole: bool) -> Option<Vec<u8>> {
    for up in upstreams {
        let Some(reply) = over_udp(*up, query).await else { continue };
        if !whole || !truncated(&reply) {
            return Some(reply);
        }
        // A truncated answer is still an answer if TCP fails.
        return Some(over_tcp(*up, query).await.unwrap_or(reply));
    }
    None
}

fn truncated(msg: &[u8]) -> bool {
    msg.len() >= 3 && msg[2] & 0x02 != 0
}

/// An answer to our question: at least a header, with our id.
fn answers(reply: &[u8], query: &[u8]) -> bool {
    reply.len() >= 12 && query.len() >= 2 && reply[..2] == query[..2]
}

async fn over_udp(up: SocketAddr, query: &[u8]) -> Option<Vec<u8>> {
    let bind: SocketAddr = if up.is_ipv4() { "0.0.0.0:0".parse().ok()? } else { "[::]:0".parse().ok()? };
    let s = UdpSocket::bind(bind).await.ok()?;
    s.connect(up).await.ok()?;
    s.send(query).await.ok()?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(TIMEOUT, s.recv(&mut buf)).await.ok()?.ok()?;
    buf.truncate(n);
    answers(&buf, query).then_some(buf)
}

async fn over_tcp(up: SocketAddr, query: &[u8]) -> Option<Vec<u8>> {
    let exchange = async {
        let mut s = TcpStream::connect(up).await.ok()?;
        let len = u16::try_from(query.len()).ok()?;
        let mut out = Vec::with_capacity(query.len() + 2);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(query);
        s.write_all(&out).await.ok()?;
        let mut len = [0u8; 2];
        s.read_exact(&mut len).await.ok()?;
        let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
        s.read_exact(&mut reply).await.ok()?;
        Some(reply)
    };
    let reply = tokio::time::timeout(TIMEOUT, exchange).await.ok()??;
    answers(&reply, query).then_some(reply)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A stand-in upstream on loopback: over UDP it answers with the TC bit
    /// set and no records; over TCP with a long answer (`tcp_body` bytes
    /// after the header).
    async fn truncating_upstream(tcp_body: usize) -> SocketAddr {
        let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        let tcp = TcpListener::bind(addr).await.unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                let mut reply = buf[..n.min(12)].to_vec();
                reply[2] |= 0x80 | 0x02; // a response, truncated
                let _ = udp.send_to(&reply, from).await;
            }
        });
        tokio::spawn(async move {
            while let Ok((mut s, _)) = tcp.accept().await {
                let mut len = [0u8; 2];
                s.read_exact(&mut len).await.unwrap();
                let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
                s.read_exact(&mut q).await.unwrap();
                let mut reply = q[..12].to_vec();
                reply[2] |= 0x80;
                reply.extend(std::iter::repeat_n(0xab, tcp_body));
                let mut out = (reply.len() as u16).to_be_bytes().to_vec();
                out.extend(reply);
                s.write_all(&out).await.unwrap();
            }
        });
        addr
    }

    fn query() -> Vec<u8> {
        // id 0x1234, RD, one question: example.org A IN
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in ["example", "org"] {
            q.push(label.len() as u8);
            q.extend(label.as_bytes());
        }
        q.extend([0, 0, 1, 0, 1]);
        q
    }

    #[tokio::test]
    async fn a_truncated_udp_answer_is_asked_again_over_tcp() {
        let up = truncating_upstream(3000).await;
        let reply = ask(&[up], &query(), true).await.expect("an answer");
        assert_eq!(&reply[..2], &[0x12, 0x34]);
        assert!(!truncated(&reply), "the TCP answer is whole");
        assert_eq!(reply.len(), 12 + 3000);
        // Asked over UDP, the sandbox gets what fits a datagram.
        let reply = ask(&[up], &query(), false).await.expect("an answer");
        assert!(truncated(&reply));
    }

    #[tokio::test]
    async fn the_truncated_answer_stands_when_tcp_is_refused() {
        // A UDP-only upstream: nothing listens on its TCP port.
        let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                let mut reply = buf[..n.min(12)].to_vec();
                reply[2] |= 0x80 | 0x02;
                let _ = udp.send_to(&reply, from).await;
            }
        });
        let reply = ask(&[addr], &query(), true).await.expect("an answer");
        assert!(truncated(&reply), "the sandbox gets the truncated answer and may retry over TCP");
    }
}
