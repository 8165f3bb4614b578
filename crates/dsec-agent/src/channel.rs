//! One connection to the edge: framed reads and a buffered writer over a
//! raw fd (a socketpair end for containers; a virtio-serial port in VMs, so
//! nothing here assumes a socket).
//!
//! Outgoing frames are encoded straight into one output buffer that a writer
//! task drains. Its size is bounded by the protocol: Data per request is
//! limited by the edge's credit, and everything else is one frame per
//! request.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::rc::Rc;

use dsec_agent_proto::codec::CodecError;
use dsec_agent_proto::{FromAgent, ReqId, ToAgent, MAX_FRAME_BYTES};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use crate::request::ReqCtx;

/// Buffers above this size are released once drained, so one burst does not
/// pin memory in an idle agent.
const KEEP_BUF: usize = 64 << 10;

pub struct Conn {
    fd: AsyncFd<OwnedFd>,
    out: RefCell<Vec<u8>>,
    out_start: Cell<usize>,
    out_ready: Notify,
    flushed: Notify,
    closed: Cell<bool>,
    /// Requests of this connection. Ids are the edge's, unique per
    /// connection, so a re-attached edge gets a fresh map.
    pub requests: RefCell<HashMap<ReqId, Rc<ReqCtx>>>,
}

impl Conn {
    /// Takes a connected fd (switched to non-blocking here).
    pub fn new(fd: OwnedFd) -> io::Result<Rc<Conn>> {
        set_nonblocking(&fd)?;
        Ok(Rc::new(Conn {
            fd: crate::aio::watch(fd)?,
            out: RefCell::new(Vec::new()),
            out_start: Cell::new(0),
            out_ready: Notify::new(),
            flushed: Notify::new(),
            closed: Cell::new(false),
            requests: RefCell::new(HashMap::new()),
        }))
    }

    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// Marks the connection dead; later sends are dropped.
    pub fn close(&self) {
        self.closed.set(true);
        self.out_ready.notify_one();
        self.flushed.notify_waiters();
    }

    /// Queues one message. Messages to a dead connection vanish: their
    /// request's edge is gone.
    pub fn send(&self, msg: &FromAgent) -> Result<(), CodecError> {
        if self.closed.get() {
            return Ok(());
        }
        let mut out = self.out.borrow_mut();
        let at = out.len();
        out.extend_from_slice(&[0u8; 4]);
        let buf = std::mem::take(&mut *out);
        match postcard::to_extend(msg, buf) {
            Ok(buf) => *out = buf,
            Err(e) => {
                // to_extend consumed the buffer; frames queued before this one
                // are lost with it, so the connection cannot go on.
                drop(out);
                self.close();
                return Err(CodecError::Encode(e));
            }
        }
        let body = out.len() - at - 4;
        if body > MAX_FRAME_BYTES {
            out.truncate(at);
            return Err(CodecError::FrameTooLarge(body));
        }
        out[at..at + 4].copy_from_slice(&(body as u32).to_le_bytes());
        drop(out);
        self.out_ready.notify_one();
        Ok(())
    }

    fn pending(&self) -> usize {
        self.out.borrow().len() - self.out_start.get()
    }

    /// Resolves when everything queued so far has been written (or the
    /// connection died).
    pub async fn flush(&self) {
        loop {
            let flushed = self.flushed.notified();
            tokio::pin!(flushed);
            // Registered before the check, so a wake-up in between is kept.
            flushed.as_mut().enable();
            if self.pending() == 0 || self.closed.get() {
                return;
            }
            flushed.await;
        }
    }

    /// Drains the output buffer into the fd until the connection closes.
    pub async fn writer(self: Rc<Self>) {
        loop {
            if self.closed.get() {
                return;
            }
            if self.pending() == 0 {
                self.flushed.notify_waiters();
                self.out_ready.notified().await;
                continue;
            }
            let Ok(mut guard) = self.fd.writable().await else {
                self.close();
                return;
            };
            let res = guard.try_io(|fd| {
                let out = self.out.borrow();
                rustix::io::write(fd.get_ref(), &out[self.out_start.get()..]).map_err(io::Error::from)
            });
            match res {
                Ok(Ok(n)) => {
                    let start = self.out_start.get() + n;
                    let mut out = self.out.borrow_mut();
                    if start >= out.len() {
                        out.clear();
                        if out.capacity() > KEEP_BUF {
                            *out = Vec::new();
                        }
                        self.out_start.set(0);
                    } else {
                        self.out_start.set(start);
                    }
                }
                Ok(Err(e)) => {
                    if e.kind() != io::ErrorKind::Interrupted {
                        self.close();
                        return;
                    }
                }
                Err(_would_block) => {}
            }
        }
    }
}

/// Incoming bytes of one connection, split into frames.
#[derive(Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

/// What the reader found. (A transient return value, never stored, so the
/// size difference between the variants does not matter.)
#[allow(clippy::large_enum_variant)]
pub enum Incoming {
    Frame(ToAgent),
    /// A complete frame that did not decode: skipped, the stream stays in
    /// sync thanks to the length prefix.
    Garbage(CodecError),
}

impl FrameReader {
    /// The next frame; `Ok(None)` at end of stream. A bad length prefix is
    /// an error (the stream cannot be resynchronised).
    pub async fn next(&mut self, conn: &Conn) -> Result<Option<Incoming>, CodecError> {
        loop {
            let avail = self.end - self.start;
            if avail >= 4 {
                let mut h = [0u8; 4];
                h.copy_from_slice(&self.buf[self.start..self.start + 4]);
                let len = u32::from_le_bytes(h) as usize;
                if len > MAX_FRAME_BYTES {
                    return Err(CodecError::FrameTooLarge(len));
                }
                if avail >= 4 + len {
                    let body = &self.buf[self.start + 4..self.start + 4 + len];
                    let msg = postcard::from_bytes::<ToAgent>(body);
                    self.start += 4 + len;
                    if self.start == self.end {
                        self.start = 0;
                        self.end = 0;
                        if self.buf.len() > KEEP_BUF {
                            self.buf = Vec::new();
                        }
                    }
                    return Ok(Some(match msg {
                        Ok(m) => Incoming::Frame(m),
                        Err(e) => Incoming::Garbage(CodecError::Decode(e)),
                    }));
                }
                self.make_room(4 + len);
            } else {
                self.make_room(4);
            }
            let mut guard = conn.fd.readable().await?;
            let res = guard.try_io(|fd| rustix::io::read(fd.get_ref(), &mut self.buf[self.end..]).map_err(io::Error::from));
            match res {
                Ok(Ok(0)) => {
                    return if self.end == self.start { Ok(None) } else { Err(CodecError::Closed) };
                }
                Ok(Ok(n)) => self.end += n,
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(_would_block) => {}
            }
        }
    }

    /// Ensures the buffer can hold a frame of `need` bytes from `start`.
    fn make_room(&mut self, need: usize) {
        if self.start > 0 && self.start + need > self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() || need > self.buf.len() {
            // Read ahead a little beyond the frame in hand, starting small so
            // an idle agent holds 4 KiB, not a frame's worth.
            let want = need.max(self.buf.len() * 2).clamp(4096, MAX_FRAME_BYTES + 4);
            let want = want.max(self.end + 1);
            self.buf.resize(want, 0);
        }
    }
}

pub fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)?;
    Ok(())
}
