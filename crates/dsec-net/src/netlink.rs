//! Batched rtnetlink: build several requests into one buffer, send them in
//! one `sendmsg`, and collect one acknowledgement per request.
//!
//! Spawning `ip` costs milliseconds per command; one batched exchange for a
//! whole veth setup costs well under one. The messages are few and fixed
//! (links, addresses, routes), so they are built by hand here from the
//! kernel's uapi layouts (linux/rtnetlink.h, linux/if_link.h) instead of
//! pulling in a generic netlink stack.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_NEWROUTE: u16 = 24;

const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const NLA_F_NESTED: u16 = 0x8000;

const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;

const IFF_UP: u32 = 0x1;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RTN_UNICAST: u8 = 1;

/// One request being built: header, fixed part, attributes.
struct Msg {
    buf: Vec<u8>,
    /// Start offsets of open nested attributes.
    nests: Vec<usize>,
}

impl Msg {
    fn new(kind: u16, flags: u16) -> Msg {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set at the end
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // seq, set by the batch
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        Msg { buf, nests: Vec::new() }
    }

    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }

    fn pad(&mut self) {
        while self.buf.len() & 3 != 0 {
            self.buf.push(0);
        }
    }

    /// struct ifinfomsg.
    fn ifinfo(&mut self, index: i32, flags: u32, change: u32) -> &mut Self {
        self.bytes(&[libc::AF_UNSPEC as u8, 0]).bytes(&0u16.to_ne_bytes());
        self.bytes(&index.to_ne_bytes()).bytes(&flags.to_ne_bytes()).bytes(&change.to_ne_bytes())
    }

    fn attr(&mut self, kind: u16, payload: &[u8]) -> &mut Self {
        let len = (4 + payload.len()) as u16;
        self.bytes(&len.to_ne_bytes()).bytes(&kind.to_ne_bytes()).bytes(payload);
        self.pad();
        self
    }

    fn attr_str(&mut self, kind: u16, s: &str) -> &mut Self {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(kind, &v)
    }

    fn begin(&mut self, kind: u16) -> &mut Self {
        self.nests.push(self.buf.len());
        self.bytes(&0u16.to_ne_bytes()).bytes(&(kind | NLA_F_NESTED).to_ne_bytes())
    }

    fn end(&mut self) -> &mut Self {
        let start = self.nests.pop().expect("end() matches a begin()");
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    fn finish(mut self, seq: u32) -> Vec<u8> {
        self.pad();
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

/// Requests sent together, answered together.
#[derive(Default)]
pub struct Batch {
    msgs: Vec<(Msg, &'static str)>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    pub fn len(&self) -> usize {
        self.msgs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// A veth pair: `name` (index `index`, 0 = any) in the socket's
    /// namespace, its peer `peer` in the namespace of `peer_netns`.
    pub fn add_veth(&mut self, name: &str, index: i32, peer: &str, peer_netns: RawFd) -> &mut Self {
        let mut m = Msg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
        m.ifinfo(index, 0, 0).attr_str(IFLA_IFNAME, name);
        m.begin(IFLA_LINKINFO).attr_str(IFLA_INFO_KIND, "veth");
        m.begin(IFLA_INFO_DATA).begin(VETH_INFO_PEER);
        m.ifinfo(0, 0, 0).attr_str(IFLA_IFNAME, peer).attr(IFLA_NET_NS_FD, &(peer_netns as u32).to_ne_bytes());
        m.end().end().end();
        self.msgs.push((m, "create veth"));
        self
    }

    pub fn del_link(&mut self, name: &str) -> &mut Self {
        let mut m = Msg::new(RTM_DELLINK, 0);
        m.ifinfo(0, 0, 0).attr_str(IFLA_IFNAME, name);
        self.msgs.push((m, "delete link"));
        self
    }

    /// Sets the link up, by index.
    pub fn link_up(&mut self, index: i32) -> &mut Self {
        let mut m = Msg::new(RTM_NEWLINK, 0);
        m.ifinfo(index, IFF_UP, IFF_UP);
        self.msgs.push((m, "set link up"));
        self
    }

    /// `addr/prefix` on the link `index`.
    pub fn add_addr(&mut self, index: i32, addr: Ipv4Addr, prefix: u8) -> &mut Self {
        self.addr(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, index, addr, prefix, "add address")
    }

    pub fn del_addr(&mut self, index: i32, addr: Ipv4Addr, prefix: u8) -> &mut Self {
        self.addr(RTM_DELADDR, 0, index, addr, prefix, "delete address")
    }

    fn addr(&mut self, kind: u16, flags: u16, index: i32, addr: Ipv4Addr, prefix: u8, what: &'static str) -> &mut Self {
        let mut m = Msg::new(kind, flags);
        // struct ifaddrmsg
        m.bytes(&[libc::AF_INET as u8, prefix, 0, RT_SCOPE_UNIVERSE]).bytes(&(index as u32).to_ne_bytes());
        m.attr(IFA_LOCAL, &addr.octets()).attr(IFA_ADDRESS, &addr.octets());
        self.msgs.push((m, what));
        self
    }

    /// The default route via `gateway` out of link `index`.
    pub fn add_default_route(&mut self, gateway: Ipv4Addr, index: i32) -> &mut Self {
        let mut m = Msg::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL);
        // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
        m.bytes(&[libc::AF_INET as u8, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST]);
        m.bytes(&0u32.to_ne_bytes());
        m.attr(RTA_GATEWAY, &gateway.octets()).attr(RTA_OIF, &(index as u32).to_ne_bytes());
        self.msgs.push((m, "add default route"));
        self
    }
}

/// An rtnetlink socket of the network namespace the calling thread was in
/// when it was opened.
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

impl Netlink {
    pub fn open() -> io::Result<Netlink> {
        // SAFETY: plain socket(2); the result is checked and owned below.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(Netlink { fd: unsafe { OwnedFd::from_raw_fd(fd) }, seq: 0 })
    }

    /// Sends every request of `batch` in one datagram and waits for all the
    /// acknowledgements. The first refusal is the error (later requests may
    /// have been applied: callers undo by deleting what they created).
    pub fn exchange(&mut self, batch: Batch) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let first = self.seq.wrapping_add(1);
        let mut buf = Vec::new();
        let mut what = Vec::new();
        for (m, w) in batch.msgs {
            self.seq = self.seq.wrapping_add(1);
            buf.extend_from_slice(&m.finish(self.seq));
            what.push(w);
        }
        // SAFETY: sending our own buffer to the kernel (address 0).
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: the pointers are valid for the given lengths.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                0,
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut pending = what.len();
        let mut first_err: Option<io::Error> = None;
        let mut rbuf = vec![0u8; 16384];
        while pending > 0 {
            // SAFETY: reading into our own buffer.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), rbuf.as_mut_ptr().cast(), rbuf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut off = 0usize;
            let n = n as usize;
            while off + 16 <= n {
                let len = u32::from_ne_bytes(rbuf[off..off + 4].try_into().expect("4 bytes")) as usize;
                let kind = u16::from_ne_bytes(rbuf[off + 4..off + 6].try_into().expect("2 bytes"));
                let seq = u32::from_ne_bytes(rbuf[off + 8..off + 12].try_into().expect("4 bytes"));
                if len < 16 || off + len > n {
                    break;
                }
                if kind == NLMSG_ERROR && off + 20 <= n {
                    let errno = -i32::from_ne_bytes(rbuf[off + 16..off + 20].try_into().expect("4 bytes"));
                    let idx = seq.wrapping_sub(first) as usize;
                    if idx < what.len() {
                        pending -= 1;
                        if errno != 0 && first_err.is_none() {
                            let e = io::Error::from_raw_os_error(errno);
                            first_err = Some(io::Error::new(e.kind(), format!("{}: {e}", what[idx])));
                        }
                    }
                }
                off += (len + 3) & !3;
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The index of link `name` in the calling thread's network namespace.
pub fn link_index(name: &str) -> io::Result<i32> {
    let c = std::ffi::CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_attributes_carry_their_length() {
        let mut b = Batch::new();
        b.add_veth("a", 2, "b", 7);
        let (m, _) = b.msgs.pop().unwrap();
        let bytes = m.finish(1);
        assert_eq!(u32::from_ne_bytes(bytes[0..4].try_into().unwrap()) as usize, bytes.len());
        assert_eq!(bytes.len() % 4, 0);
        // ifinfomsg index 2 right after the 16-byte header.
        assert_eq!(i32::from_ne_bytes(bytes[20..24].try_into().unwrap()), 2);
        // The first attribute is the name "a\0" (length 6, padded to 8).
        assert_eq!(u16::from_ne_bytes(bytes[32..34].try_into().unwrap()), 6);
        assert_eq!(u16::from_ne_bytes(bytes[34..36].try_into().unwrap()), IFLA_IFNAME);
        // The link info nest spans to the end of the message.
        assert_eq!(u16::from_ne_bytes(bytes[42..44].try_into().unwrap()), IFLA_LINKINFO | NLA_F_NESTED);
        assert_eq!(u16::from_ne_bytes(bytes[40..42].try_into().unwrap()) as usize, bytes.len() - 40);
    }
}
