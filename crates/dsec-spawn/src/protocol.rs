//! The spawn helper's protocol.
//!
//! A process started by clone copies its parent's file descriptor table,
//! and the edge holds a few descriptors per sandbox: with thousands of
//! sandboxes every creation would copy (and then close) thousands of them.
//! So the edge starts one small helper early (`dsec-agent spawner`, tiny fd
//! table) and asks it to start each agent. One SOCK_SEQPACKET datagram per
//! request and per answer; descriptors travel as SCM_RIGHTS:
//!
//! - request: `ns_flags: u32` (little endian) + the agent's channel end,
//!   and optionally a network namespace for the agent to join;
//! - answer: `pid: i32`, `errno: i32` + the agent's pidfd when errno is 0.
//!
//! The helper clones with CLONE_PARENT, so every agent is the edge's child
//! (the edge reaps it through its pidfd), exactly as if the edge had cloned
//! it itself.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

pub const REQUEST_BYTES: usize = 4;
pub const ANSWER_BYTES: usize = 8;

pub fn encode_request(ns_flags: u32) -> [u8; REQUEST_BYTES] {
    ns_flags.to_le_bytes()
}

pub fn decode_request(b: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(..REQUEST_BYTES)?.try_into().ok()?))
}

pub fn encode_answer(pid: i32, errno: i32) -> [u8; ANSWER_BYTES] {
    let mut out = [0u8; ANSWER_BYTES];
    out[..4].copy_from_slice(&pid.to_le_bytes());
    out[4..].copy_from_slice(&errno.to_le_bytes());
    out
}

pub fn decode_answer(b: &[u8]) -> Option<(i32, i32)> {
    let pid = i32::from_le_bytes(b.get(..4)?.try_into().ok()?);
    let errno = i32::from_le_bytes(b.get(4..8)?.try_into().ok()?);
    Some((pid, errno))
}

/// Sends one datagram, with `fd` attached if given.
pub fn send(sock: BorrowedFd<'_>, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
    match fd {
        Some(f) => send_fds(sock, bytes, &[f]),
        None => send_fds(sock, bytes, &[]),
    }
}

/// Sends one datagram with up to two descriptors attached.
pub fn send_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !anc.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("too many descriptors for one datagram"));
    }
    let n = sendmsg(sock, &[IoSlice::new(bytes)], &mut anc, SendFlags::NOSIGNAL)?;
    if n != bytes.len() {
        return Err(std::io::Error::other("short datagram"));
    }
    Ok(())
}

/// Receives one datagram into `buf`; returns its length (0 when the peer
/// is gone) and the descriptor it carried, if any (close-on-exec).
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<(usize, Option<OwnedFd>)> {
    let (n, fds) = recv_fds(sock, buf)?;
    Ok((n, fds.into_iter().next()))
}

/// Like [`recv`], with every descriptor the datagram carried (at most two).
pub fn recv_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let msg = recvmsg(sock, &mut [IoSliceMut::new(buf)], &mut anc, RecvFlags::CMSG_CLOEXEC)?;
    let mut out = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            // Keep two; any extra descriptor closes on drop.
            out.extend(fds.take(2 - out.len().min(2)));
        }
    }
    Ok((msg.bytes, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn datagrams_carry_bytes_and_a_descriptor() {
        let (a, b) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let file = std::fs::File::open("/proc/self/status").unwrap();
        send(a.as_fd(), &encode_request(0x2000_0000), Some(file.as_fd())).unwrap();
        let mut buf = [0u8; 16];
        let (n, fd) = recv(b.as_fd(), &mut buf).unwrap();
        assert_eq!(decode_request(&buf[..n]), Some(0x2000_0000));
        assert!(fd.is_some());
        send(b.as_fd(), &encode_answer(42, 0), None).unwrap();
        let (n, fd) = recv(a.as_fd(), &mut buf).unwrap();
        assert_eq!(decode_answer(&buf[..n]), Some((42, 0)));
        assert!(fd.is_none());
        let other = std::fs::File::open("/proc/self/stat").unwrap();
        send_fds(a.as_fd(), &encode_request(1), &[file.as_fd(), other.as_fd()]).unwrap();
        let (_, fds) = recv_fds(b.as_fd(), &mut buf).unwrap();
        assert_eq!(fds.len(), 2, "the channel and a network namespace travel together");
        drop(b);
        assert_eq!(recv(a.as_fd(), &mut buf).unwrap().0, 0, "a closed peer reads as 0 bytes");
    }
}
