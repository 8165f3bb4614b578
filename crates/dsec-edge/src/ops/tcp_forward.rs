//! Plain TCP forwards: a port of a sandbox published as `HOST:PORT` of the
//! node, for clients that can name neither a path nor a header (a database
//! driver, an SSH client, a game server's protocol).
//!
//! A forward is a listener of its own on the node's forward address
//! (`EdgeConfig::port_forward_addr`, loopback by default) on a port the
//! kernel picks. Each connection it accepts is one more connection to the
//! sandbox's port, made exactly as the HTTP proxy makes them
//! (`connect_port`: the sandbox's loopback and nothing else), spliced byte
//! for byte. Who may connect is decided when the forward is made (its
//! caller's token) and, per connection, by its source address
//! (`allow_from`); the forward closes, with its open connections, at its
//! expiry or when the sandbox's process ends (stop, a VM suspended to
//! disk), whichever is first.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpListener;

use crate::edge::Edge;
use crate::error::EdgeError;
use crate::model::{now_ms, Caller};

/// The longest a forward may live.
pub const MAX_FORWARD_TTL_S: u64 = 7 * 24 * 3600;
/// Without a lifetime given: an hour, as a signed URL.
pub const DEFAULT_FORWARD_TTL_S: u64 = 3600;

/// A source prefix a forward accepts connections from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourcePrefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl SourcePrefix {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match (self.addr, ip) {
            // A v4 client on a dual-stack socket shows as ::ffff:a.b.c.d.
            (IpAddr::V4(_), IpAddr::V6(v6)) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            _ => ip,
        };
        match (self.addr, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => prefix_eq(&a.octets(), &b.octets(), self.len),
            (IpAddr::V6(a), IpAddr::V6(b)) => prefix_eq(&a.octets(), &b.octets(), self.len),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], len: u8) -> bool {
    let (whole, rest) = (usize::from(len / 8), len % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0
}

impl std::str::FromStr for SourcePrefix {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, len) = s.split_once('/').map_or((s, None), |(a, l)| (a, Some(l)));
        let addr: IpAddr = a.parse().map_err(|_| format!("{s:?} is not an IP address or prefix"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) => l.parse::<u8>().ok().filter(|l| *l <= max).ok_or_else(|| format!("{s:?}: the prefix length must be 0-{max}"))?,
        };
        Ok(SourcePrefix { addr, len })
    }
}

/// A forward as made.
#[derive(Debug, Clone)]
pub struct TcpForward {
    /// Where clients connect (the node's forward address and the port).
    pub address: SocketAddr,
    pub expires_at_ms: u64,
}

impl Edge {
    /// Publishes `port` of sandbox `id` as a TCP port of the node until
    /// `ttl_s` has passed or the sandbox ends; connections only from
    /// `allow_from` when given.
    pub async fn forward_port(
        &self,
        caller: &Caller,
        id: &str,
        port: u16,
        ttl_s: Option<u64>,
        allow_from: Vec<SourcePrefix>,
    ) -> Result<TcpForward, EdgeError> {
        let ttl = ttl_s.unwrap_or(DEFAULT_FORWARD_TTL_S);
        if ttl == 0 || ttl > MAX_FORWARD_TTL_S {
            return Err(EdgeError::Invalid(format!("ttl_s must be 1-{MAX_FORWARD_TTL_S} seconds")));
        }
        if port == 0 {
            return Err(EdgeError::Invalid("port 0 is not a port".into()));
        }
        // The sandbox must be the caller's and running; its process's end
        // bounds the forward. Nothing need listen yet: each connection is
        // made when a client comes.
        let ended = self.end_of(caller, id).await?;
        let bind = self.inner.config.port_forward_addr;
        let listener = TcpListener::bind((bind, 0)).await.map_err(EdgeError::sandbox_sys(id, "bind a TCP forward"))?;
        let address = listener.local_addr().map_err(EdgeError::sys("the address of a TCP forward"))?;
        let expires_at_ms = now_ms() + ttl * 1000;
        let (edge, caller, id_owned) = (self.clone(), caller.clone(), id.to_string());
        let mut shutdown = self.inner.shutdown.subscribe();
        tracing::info!(sandbox = id, port, %address, ttl_s = ttl, "TCP forward opened");
        tokio::spawn(async move {
            let accept = async {
                loop {
                    let (client, peer) = match listener.accept().await {
                        Ok(c) => c,
                        Err(e) => {
                            // Out of descriptors, say: wait rather than spin.
                            tracing::warn!(sandbox = %id_owned, error = %e, "TCP forward: accept failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    if !allow_from.is_empty() && !allow_from.iter().any(|p| p.contains(peer.ip())) {
                        tracing::debug!(sandbox = %id_owned, %peer, "TCP forward: a source it does not allow");
                        continue;
                    }
                    let (edge, caller, id) = (edge.clone(), caller.clone(), id_owned.clone());
                    tokio::spawn(async move { splice(&edge, &caller, &id, port, client).await });
                }
            };
            tokio::select! {
                _ = accept => {}
                _ = ended.wait() => {}
                _ = shutdown.wait_for(|down| *down) => {}
                _ = tokio::time::sleep(Duration::from_secs(ttl)) => {}
            }
            tracing::info!(sandbox = %id_owned, port, %address, "TCP forward closed");
        });
        Ok(TcpForward { address, expires_at_ms })
    }
}

/// One accepted connection, spliced to a fresh connection to the port; it
/// ends with either side, or with the sandbox.
async fn splice(edge: &Edge, caller: &Caller, id: &str, port: u16, mut client: tokio::net::TcpStream) {
    let _ = client.set_nodelay(true);
    let mut conn = match edge.connect_port(caller, id, port).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(sandbox = id, port, error = %e, "TCP forward: the port refused a connection");
            return;
        }
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut conn.stream) => {}
        _ = conn.ended.wait() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_prefixes_parse_and_match() {
        let p: SourcePrefix = "10.1.0.0/16".parse().unwrap();
        assert!(p.contains("10.1.200.3".parse().unwrap()) && !p.contains("10.2.0.1".parse().unwrap()));
        assert!(p.contains("::ffff:10.1.0.9".parse().unwrap()), "a v4 client on a dual-stack socket");
        let one: SourcePrefix = "127.0.0.1".parse().unwrap();
        assert_eq!(one.len, 32);
        assert!(one.contains("127.0.0.1".parse().unwrap()) && !one.contains("127.0.0.2".parse().unwrap()));
        let odd: SourcePrefix = "192.168.4.0/22".parse().unwrap();
        assert!(odd.contains("192.168.7.255".parse().unwrap()) && !odd.contains("192.168.8.0".parse().unwrap()));
        let all: SourcePrefix = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()) && !all.contains("::1".parse().unwrap()));
        let v6: SourcePrefix = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()) && !v6.contains("fe80::1".parse().unwrap()));
        for bad in ["10.0.0.0/33", "fd00::/129", "example.org", "10.0.0.0/x", ""] {
            assert!(bad.parse::<SourcePrefix>().is_err(), "{bad}");
        }
    }
}
