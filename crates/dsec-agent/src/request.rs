//! Per-request state shared between the dispatcher (which feeds it what the
//! edge sends) and the task running the operation.
//!
//! Flow control, both directions (see the proto crate's docs):
//! - `window`: bytes of Data we may still send; starts at INITIAL_WINDOW and
//!   grows with the edge's `Credit`. Producers stop reading their source at
//!   zero, so a slow consumer throttles the sandboxed process itself.
//! - `budget`: bytes of Data the edge may still send us; we grant more with
//!   `Credit` as we consume. An edge that overruns it breaks the protocol.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use dsec_agent_proto::{AgentError, ErrorKind, FromAgent, Reply, ReqId, Stream, INITIAL_WINDOW, MAX_CHUNK_BYTES};
use tokio::sync::Notify;

use crate::channel::Conn;

pub struct ReqCtx {
    pub id: ReqId,
    conn: Rc<Conn>,
    window: Cell<u64>,
    budget: Cell<u64>,
    inbox: RefCell<VecDeque<Vec<u8>>>,
    eof: Cell<bool>,
    cancelled: Cell<bool>,
    violation: RefCell<Option<String>>,
    detached: Cell<bool>,
    signals: RefCell<Vec<i32>>,
    resize: Cell<Option<(u16, u16)>>,
    wake: Notify,
}

impl ReqCtx {
    pub fn new(id: ReqId, conn: Rc<Conn>) -> Rc<ReqCtx> {
        Rc::new(ReqCtx {
            id,
            conn,
            window: Cell::new(u64::from(INITIAL_WINDOW)),
            budget: Cell::new(u64::from(INITIAL_WINDOW)),
            inbox: RefCell::new(VecDeque::new()),
            eof: Cell::new(false),
            cancelled: Cell::new(false),
            violation: RefCell::new(None),
            detached: Cell::new(false),
            signals: RefCell::new(Vec::new()),
            resize: Cell::new(None),
            wake: Notify::new(),
        })
    }

    // ---- fed by the dispatcher ----

    pub fn push_data(&self, data: Vec<u8>) {
        let len = data.len() as u64;
        if self.eof.get() {
            self.violate("data after end of input");
            return;
        }
        if len > self.budget.get() {
            self.violate(&format!("{len} bytes of data exceed the {} bytes of credit granted", self.budget.get()));
            return;
        }
        self.budget.set(self.budget.get() - len);
        if !data.is_empty() {
            self.inbox.borrow_mut().push_back(data);
        }
        self.wake.notify_one();
    }

    pub fn push_eof(&self) {
        self.eof.set(true);
        self.wake.notify_one();
    }

    pub fn push_credit(&self, bytes: u32) {
        self.window.set(self.window.get().saturating_add(u64::from(bytes)));
        self.wake.notify_one();
    }

    pub fn push_signal(&self, signal: i32) {
        self.signals.borrow_mut().push(signal);
        self.wake.notify_one();
    }

    pub fn push_resize(&self, rows: u16, cols: u16) {
        self.resize.set(Some((rows, cols)));
        self.wake.notify_one();
    }

    pub fn cancel(&self) {
        self.cancelled.set(true);
        self.wake.notify_one();
    }

    /// The edge went away: output has nowhere to go (sends become no-ops, the
    /// window unlimited so producers drain rather than stall) and input ends.
    pub fn detach(&self) {
        self.detached.set(true);
        self.eof.set(true);
        self.window.set(u64::MAX / 2);
        self.wake.notify_one();
    }

    fn violate(&self, what: &str) {
        eprintln!("dsec-agent: protocol violation on request {}: {what}", self.id);
        self.violation.borrow_mut().get_or_insert_with(|| what.to_string());
        self.wake.notify_one();
    }

    // ---- used by the operation ----

    /// Resolves when anything above happened since the last call.
    pub async fn changed(&self) {
        self.wake.notified().await;
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.get()
    }

    /// A protocol error the operation should fail with, if the edge broke
    /// the rules for this request.
    pub fn violation(&self) -> Option<AgentError> {
        self.violation.borrow().as_ref().map(|m| AgentError::new(ErrorKind::Protocol, m.clone()))
    }

    /// Cancelled, detached or broken: the operation should stop.
    pub fn abort_error(&self) -> Option<AgentError> {
        if let Some(v) = self.violation() {
            return Some(v);
        }
        if self.cancelled.get() || self.detached.get() {
            return Some(crate::errors::cancelled());
        }
        None
    }

    pub fn eof(&self) -> bool {
        self.eof.get()
    }

    pub fn take_input(&self) -> Option<Vec<u8>> {
        self.inbox.borrow_mut().pop_front()
    }

    pub fn has_input(&self) -> bool {
        !self.inbox.borrow().is_empty()
    }

    /// Input fully consumed up to here: all of it taken and the edge said Eof.
    pub fn input_done(&self) -> bool {
        self.eof.get() && self.inbox.borrow().is_empty()
    }

    /// We consumed `n` bytes of input: let the edge send that much more.
    pub fn consumed(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.budget.set(self.budget.get() + n as u64);
        self.send(&FromAgent::Credit { id: self.id, bytes: n as u32 });
    }

    pub fn take_signals(&self) -> Vec<i32> {
        std::mem::take(&mut *self.signals.borrow_mut())
    }

    pub fn take_resize(&self) -> Option<(u16, u16)> {
        self.resize.take()
    }

    /// Bytes we may send now, capped at one chunk.
    pub fn sendable(&self) -> usize {
        self.window.get().min(MAX_CHUNK_BYTES as u64) as usize
    }

    /// Sends output (at most `sendable()` bytes).
    pub fn send_data(&self, stream: Stream, data: &[u8]) {
        self.window.set(self.window.get().saturating_sub(data.len() as u64));
        if self.detached.get() {
            return;
        }
        self.send(&FromAgent::Data { id: self.id, stream, data: data.to_vec() });
    }

    fn send(&self, msg: &FromAgent) {
        if let Err(e) = self.conn.send(msg) {
            eprintln!("dsec-agent: cannot send on request {}: {e}", self.id);
        }
    }

    /// The one final answer. A reply too large for a frame (say, a huge
    /// directory listing) becomes an error reply instead.
    pub fn reply(&self, result: Result<Reply, AgentError>) {
        if let Err(e) = self.conn.send(&FromAgent::Reply { id: self.id, result }) {
            let err = AgentError::new(ErrorKind::TooLarge, format!("reply does not fit in a frame: {e}"));
            self.send(&FromAgent::Reply { id: self.id, result: Err(err) });
        }
        self.conn.requests.borrow_mut().remove(&self.id);
    }

    pub fn conn(&self) -> &Rc<Conn> {
        &self.conn
    }
}
