//! The node's tasks: the DNS resolver sandboxes ask (its address is a /32
//! on the host's loopback device: a local address the sandboxes route to
//! through their veth, owned by no interface a sandbox has; dummy
//! interfaces are not available on every kernel), over UDP and over TCP
//! (RFC 7766: two-byte length, then the message; the same decisions and
//! audit events), and the reader of the eBPF denials.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use crate::netlink::{link_index, Batch, Netlink};
use crate::{dns, now_ms, Denial, Egress};

/// Queries answered at once; more wait (a sandbox flooding its resolver
/// slows only the resolver's answers, never the edge).
const MAX_IN_FLIGHT: usize = 256;
/// TCP connections served at once; more wait in the listen backlog.
const MAX_TCP_CONNECTIONS: usize = 64;
/// A TCP client that sends nothing for this long is dropped (RFC 7766
/// suggests seconds), so idle connections cannot hold the slots.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// Puts the resolver's address on the host's loopback (kept if a crashed
/// edge left it there).
pub fn add_address(ip: Ipv4Addr) -> std::io::Result<()> {
    let mut nl = Netlink::open()?;
    let mut b = Batch::new();
    b.add_addr(link_index("lo")?, ip, 32);
    match nl.exchange(b) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

pub fn remove_address(ip: Ipv4Addr) {
    if let (Ok(mut nl), Ok(lo)) = (Netlink::open(), link_index("lo")) {
        let mut b = Batch::new();
        b.del_addr(lo, ip, 32);
        let _ = nl.exchange(b);
    }
}

pub fn spawn(egress: Egress) -> std::io::Result<()> {
    let addr = SocketAddr::from((egress.config().resolver_ip(), 53));
    spawn_tcp(egress.clone(), addr)?;
    let std_sock = std::net::UdpSocket::bind(addr)?;
    std_sock.set_nonblocking(true)?;
    let sock = Arc::new(UdpSocket::from_std(std_sock)?);
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    tokio::spawn(async move {
        let mut buf = vec![0u8; 1500];
        loop {
            let (n, from) = match sock.recv_from(&mut buf).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "resolver socket");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = limit.clone().acquire_owned().await else { return };
            let query = buf[..n].to_vec();
            let (egress, sock) = (egress.clone(), sock.clone());
            tokio::spawn(async move {
                let _permit = permit;
                if let Some(answer) = answer(&egress, &query, from, false).await {
                    let _ = sock.send_to(&answer, from).await;
                }
            });
        }
    });
    Ok(())
}

/// The resolver over TCP, on the same address and port.
fn spawn_tcp(egress: Egress, addr: SocketAddr) -> std::io::Result<()> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(std_listener)?;
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_TCP_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = limit.clone().acquire_owned().await else { return };
            let (stream, from) = match listener.accept().await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "resolver TCP socket");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let egress = egress.clone();
            tokio::spawn(async move {
                let _permit = permit;
                serve_tcp(&egress, stream, from).await;
            });
        }
    });
    Ok(())
}

/// Answers the queries of one TCP connection, in order, until it closes,
/// idles or sends what is not DNS.
async fn serve_tcp(egress: &Egress, mut stream: TcpStream, from: SocketAddr) {
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
        match tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut query)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let Some(reply) = answer(egress, &query, from, true).await else { return };
        let Ok(n) = u16::try_from(reply.len()) else { return };
        let mut out = Vec::with_capacity(reply.len() + 2);
        out.extend_from_slice(&n.to_be_bytes());
        out.extend_from_slice(&reply);
        if stream.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// `over_tcp`: the sandbox asked over TCP, so it gets a whole answer.
async fn answer(egress: &Egress, query: &[u8], from: SocketAddr, over_tcp: bool) -> Option<Vec<u8>> {
    let SocketAddr::V4(from4) = from else { return None };
    let q = dns::parse_query(query)?;
    let (sandbox, allowed) = egress.sandbox_by_ip(*from4.ip(), &q.name)?;
    if !allowed {
        egress.report(Denial {
            sandbox_id: sandbox,
            time_ms: now_ms(),
            pid: 0,
            detail: format!("DNS query for {} refused (no rule of the sandbox allows this domain)", q.name),
        });
        return Some(dns::refused(query));
    }
    let Some(reply) = crate::upstream::ask(&egress.config().dns_upstream, query, over_tcp).await else { return Some(dns::servfail(query)) };
    if q.qtype == dns::TYPE_A {
        let addrs = dns::answer_addrs(&reply);
        // Open the addresses before the sandbox sees them.
        egress.learn(*from4.ip(), &q.name, &addrs);
    }
    Some(reply)
}

fn proto_name(p: u8) -> &'static str {
    match p {
        6 => "tcp",
        17 => "udp",
        1 => "icmp",
        58 => "icmpv6",
        255 => "raw",
        _ => "ip",
    }
}

/// Turns eBPF denials into events for the edge.
pub fn spawn_denial_reader(egress: Egress, ring: RingBuf<MapData>) -> std::io::Result<()> {
    // SAFETY: the ring owns its map's descriptor for its whole life and
    // its as_raw_fd always returns that descriptor; the AsyncFd owns the
    // ring.
    let mut afd = unsafe { AsyncFd::register(ring) }.map_err(|e| std::io::Error::other(e.to_string()))?;
    tokio::spawn(async move {
        loop {
            let Ok(mut guard) = afd.readable_mut().await else { return };
            let ring = guard.get_inner_mut();
            let mut batch = Vec::new();
            while let Some(item) = ring.next() {
                if let Some(d) = crate::bpf::decode(&item) {
                    batch.push(d);
                }
            }
            guard.clear_ready();
            for d in batch {
                let Some(id) = egress.sandbox_by_cgid(d.cgid) else { continue };
                let what = match d.kind {
                    1 | 3 => "connect",
                    2 | 4 => "send",
                    _ => "packet",
                };
                let target = match d.daddr {
                    std::net::IpAddr::V4(a) if d.dport != 0 => format!("{a}:{}", d.dport),
                    std::net::IpAddr::V6(a) if d.dport != 0 => format!("[{a}]:{}", d.dport),
                    a => a.to_string(),
                };
                egress.report(Denial {
                    sandbox_id: id,
                    time_ms: now_ms(),
                    pid: pid_in_sandbox(d.pid),
                    detail: format!("{what} to {target}/{} refused (no rule of the sandbox allows it)", proto_name(d.proto)),
                });
            }
        }
    });
    Ok(())
}

/// A host pid as the sandbox sees it (the last NSpid), 0 if gone.
fn pid_in_sandbox(host_pid: u32) -> u32 {
    if host_pid == 0 {
        return 0;
    }
    std::fs::read_to_string(format!("/proc/{host_pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("NSpid:")).and_then(|l| l.split_whitespace().last()?.parse().ok()))
        .unwrap_or(0)
}
