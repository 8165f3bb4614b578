//! The edge's side of the channel: one [`AgentClient`] per agent,
//! multiplexing any number of concurrent requests over it.
//!
//! Per connection there is one reader task, which routes each frame to its
//! request's unbounded queue (never waiting on a slow consumer: the credit
//! window bounds what the agent may have in flight per request), and one
//! writer task, which batches queued frames into few writes. An idle
//! connection costs two parked tasks and an empty map, so an edge can hold
//! thousands.
//!
//! The handshake picks the version and features of the connection
//! ([`crate::negotiation`]); a request that needs a feature the agent lacks
//! is refused here, as [`ClientError::Unsupported`], before it is sent.
//!
//! ```no_run
//! # async fn demo(stream: tokio::net::UnixStream) -> Result<(), dsec_agent_proto::client::ClientError> {
//! use dsec_agent_proto::{client::AgentClient, Op, Reply};
//! let (client, hello) = AgentClient::answer(stream).await?;
//! assert!(matches!(client.call(Op::Ping).await?, Reply::Pong));
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};

use crate::codec::{encode, read_frame_async, write_frame_async, CodecError};
use crate::negotiation::{Mismatch, Speaks};
use crate::{
    AgentError, AgentHello, AgentState, AuditTally, EdgeHello, Feature, FromAgent, Negotiated, Op, Reply, ReqId, Stream, ToAgent,
    INITIAL_WINDOW, MAX_CHUNK_BYTES, PROTOCOL_VERSION,
};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the agent channel is closed")]
    Closed,
    #[error("agent error: {0}")]
    Agent(#[from] AgentError),
    #[error("channel codec: {0}")]
    Codec(CodecError),
    #[error("agent protocol violation: {0}")]
    Protocol(String),
    /// The agent and the edge share no protocol version.
    #[error("{}", incompatible(.agent, .mismatch))]
    Incompatible { agent: String, mismatch: Mismatch },
    /// The request needs a feature the agent lacks (nothing was sent).
    #[error("{agent} speaks protocol {version}, which lacks {feature} ({}); rebuild the image with a newer agent", .feature.info().gates)]
    Unsupported { agent: String, version: u32, feature: Feature },
}

fn incompatible(agent: &str, mismatch: &Mismatch) -> String {
    let advice = if mismatch.peer_is_older() { "rebuild the image with a newer agent" } else { "upgrade the edge" };
    format!("{}: {advice}", mismatch.describe_as(agent, "the edge"))
}

/// How an agent is named in errors.
fn agent_label(sandbox: Option<&str>) -> String {
    match sandbox {
        Some(id) => format!("the agent in sandbox {id}"),
        None => "the sandbox's agent".to_string(),
    }
}

/// The sandbox a request names, if it names one (the setups of a fresh
/// agent, which greeted without one).
fn sandbox_of(op: &Op) -> Option<&str> {
    match op {
        Op::SetupContainer(c) => Some(&c.sandbox_id),
        Op::SetupVm(c) => Some(&c.sandbox_id),
        Op::Reidentify(v) => Some(&v.sandbox_id),
        _ => None,
    }
}

/// When the edge says Hello.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Greeting {
    /// At once, with its own version.
    First,
    /// After the agent's, with the version it picked.
    Answer,
}

impl From<CodecError> for ClientError {
    fn from(e: CodecError) -> Self {
        match e {
            CodecError::Closed => ClientError::Closed,
            e => ClientError::Codec(e),
        }
    }
}

/// One event of a request, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum CallEvent {
    Data {
        stream: Stream,
        data: Vec<u8>,
    },
    /// The request's single final answer; nothing follows it.
    Reply(Result<Reply, AgentError>),
}

/// Credit is returned in batches of this many consumed bytes (a quarter of
/// the window, so the agent never stalls while we still have room).
const CREDIT_BATCH: u64 = INITIAL_WINDOW as u64 / 4;

/// The writer coalesces queued frames up to this size per write.
const WRITE_BATCH: usize = 256 << 10;

/// How much Data we may still send for one request.
struct SendWindow {
    avail: Mutex<u64>,
    /// The request has its reply: no more input is wanted.
    finished: AtomicBool,
    changed: Notify,
}

struct Route {
    events: mpsc::UnboundedSender<CallEvent>,
    window: Arc<SendWindow>,
}

/// Receives the growth of an agent's audit counts: `(kind, new events)`.
pub type AuditSink = Arc<dyn Fn(&str, u64) + Send + Sync>;

/// The agent's audit tallies and what of them was handed to the sink.
#[derive(Default)]
struct AuditCounts {
    sink: Option<AuditSink>,
    latest: AuditTally,
    counted: HashMap<String, u64>,
}

impl AuditCounts {
    /// Hands the sink what it has not seen yet. Tallies only grow within one
    /// agent's life, so a smaller number (never expected) adds nothing.
    fn deliver(&mut self) {
        let Some(sink) = &self.sink else { return };
        for (kind, total) in &self.latest.by_kind {
            let seen = self.counted.entry(kind.clone()).or_insert(0);
            if *total > *seen {
                sink(kind, *total - *seen);
                *seen = *total;
            }
        }
    }
}

/// What the reader task shares with the handles.
struct Shared {
    calls: Mutex<HashMap<ReqId, Route>>,
    closed: AtomicBool,
    closed_notify: Notify,
    audit: Mutex<AuditCounts>,
}

impl Shared {
    fn calls(&self) -> MutexGuard<'_, HashMap<ReqId, Route>> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (single inserts and removes), so poisoning is ignored.
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn close(&self) {
        let mut calls = self.calls();
        self.closed.store(true, Ordering::SeqCst);
        for (_, route) in calls.drain() {
            route.window.finished.store(true, Ordering::SeqCst);
            route.window.changed.notify_waiters();
            // Dropping the sender ends the call's event stream.
        }
        drop(calls);
        self.closed_notify.notify_waiters();
    }
}

struct Inner {
    /// Encoded frames for the writer task. Kept out of `Shared` so that
    /// when every handle is gone, the writer sees the queue close and shuts
    /// the channel down (the agent sees EOF).
    tx: mpsc::UnboundedSender<Vec<u8>>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    negotiated: Negotiated,
    /// The sandbox the agent greeted as (None: a fresh agent).
    sandbox: Option<String>,
}

/// A connection to one agent. Cheap to clone; usable from any task.
#[derive(Clone)]
pub struct AgentClient {
    inner: Arc<Inner>,
}

impl AgentClient {
    /// Says Hello at once, with the edge's own version, then reads the
    /// agent's; starts the reader and writer tasks on the current tokio
    /// runtime. For an agent that may be waiting for the edge to speak: a
    /// VM's, re-attached or restored (its port's host side may have come
    /// back while the VM was stopped). An agent from before negotiation
    /// then works only if it speaks exactly the edge's version.
    pub async fn connect<S>(stream: S) -> Result<(AgentClient, AgentHello), ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        Self::handshake(stream, Greeting::First).await
    }

    /// Reads the agent's Hello first, then answers with the version picked;
    /// otherwise as [`AgentClient::connect`]. For an agent that greets as
    /// soon as it has a channel: a fresh one, and a container's on its
    /// re-attach channel. An agent from before negotiation then works at
    /// any version the edge speaks. Costs no round trip: the edge waits for
    /// the agent's Hello before its first request either way.
    pub async fn answer<S>(stream: S) -> Result<(AgentClient, AgentHello), ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        Self::handshake(stream, Greeting::Answer).await
    }

    async fn handshake<S>(stream: S, greeting: Greeting) -> Result<(AgentClient, AgentHello), ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (mut rd, mut wr) = tokio::io::split(stream);
        if greeting == Greeting::First {
            write_frame_async(&mut wr, &ToAgent::Hello(EdgeHello::ours(PROTOCOL_VERSION))).await?;
        }
        let hello = match read_frame_async::<_, FromAgent>(&mut rd).await? {
            Some(FromAgent::Hello(h)) => h,
            Some(other) => return Err(ClientError::Protocol(format!("expected Hello, got {other:?}"))),
            None => return Err(ClientError::Closed),
        };
        let said = (greeting == Greeting::First).then_some(PROTOCOL_VERSION);
        let sandbox = match &hello.state {
            AgentState::Ready { sandbox_id } => Some(sandbox_id.clone()),
            AgentState::Fresh => None,
        };
        let negotiated = match Speaks::ours().agree(&hello.speaks(), said) {
            Ok(n) => n,
            Err(mismatch) => {
                if greeting == Greeting::Answer {
                    // So that the agent, too, says why.
                    let _ = write_frame_async(&mut wr, &ToAgent::Hello(EdgeHello::ours(PROTOCOL_VERSION))).await;
                }
                return Err(ClientError::Incompatible { agent: agent_label(sandbox.as_deref()), mismatch });
            }
        };
        if greeting == Greeting::Answer {
            write_frame_async(&mut wr, &ToAgent::Hello(EdgeHello::ours(negotiated.version))).await?;
        }
        let shared = Arc::new(Shared {
            calls: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            closed_notify: Notify::new(),
            audit: Mutex::new(AuditCounts::default()),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(reader(rd, shared.clone()));
        tokio::spawn(writer(wr, rx, shared.clone()));
        let inner = Arc::new(Inner { tx, shared, next_id: AtomicU64::new(1), negotiated, sandbox });
        Ok((AgentClient { inner }, hello))
    }

    /// The version and features of this connection.
    pub fn negotiated(&self) -> Negotiated {
        self.inner.negotiated
    }

    /// A request without Data in either direction: waits for its Reply
    /// (an agent error becomes `ClientError::Agent`).
    pub async fn call(&self, op: Op) -> Result<Reply, ClientError> {
        let mut call = self.open(op).await?;
        loop {
            match call.recv().await? {
                Some(CallEvent::Reply(r)) => return r.map_err(ClientError::Agent),
                // Output of a request the caller did not want streamed
                // (cannot happen with the ops `call` is meant for): dropped.
                Some(CallEvent::Data { .. }) => {}
                None => return Err(ClientError::Closed),
            }
        }
    }

    /// Starts a request with streams; see [`Call`]. Refused without
    /// sending anything if it needs a feature the agent lacks.
    pub async fn open(&self, op: Op) -> Result<Call, ClientError> {
        if let Some(feature) = op.requires().filter(|f| !self.inner.negotiated.features.has(*f)) {
            let sandbox = sandbox_of(&op).or(self.inner.sandbox.as_deref());
            return Err(ClientError::Unsupported { agent: agent_label(sandbox), version: self.inner.negotiated.version, feature });
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = encode(&ToAgent::Request { id, op })?;
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let window =
            Arc::new(SendWindow { avail: Mutex::new(u64::from(INITIAL_WINDOW)), finished: AtomicBool::new(false), changed: Notify::new() });
        {
            let mut calls = self.inner.shared.calls();
            // Checked under the lock the reader takes to close, so a call is
            // never registered after the map was drained.
            if self.inner.shared.closed.load(Ordering::SeqCst) {
                return Err(ClientError::Closed);
            }
            calls.insert(id, Route { events: ev_tx, window: window.clone() });
        }
        if self.inner.tx.send(frame).is_err() {
            self.inner.shared.calls().remove(&id);
            return Err(ClientError::Closed);
        }
        let sender = CallSender { id, tx: self.inner.tx.clone(), window };
        let receiver =
            CallReceiver { id, rx: ev_rx, tx: self.inner.tx.clone(), shared: self.inner.shared.clone(), done: false, unacked: 0 };
        Ok(Call { sender, receiver })
    }

    pub fn is_closed(&self) -> bool {
        self.inner.shared.closed.load(Ordering::SeqCst)
    }

    /// From now on, the agent's audit events (counts that arrived before
    /// included) are reported to `sink` as they grow.
    pub fn on_audit(&self, sink: AuditSink) {
        let mut audit = self.inner.shared.audit.lock().unwrap_or_else(|p| p.into_inner());
        audit.sink = Some(sink);
        audit.deliver();
    }

    /// Resolves when the channel is gone (the agent died or closed it).
    pub async fn closed(&self) {
        let shared = &self.inner.shared;
        loop {
            let notified = shared.closed_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if shared.closed.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}

async fn reader<R: AsyncRead + Unpin>(mut rd: R, shared: Arc<Shared>) {
    loop {
        let msg = match read_frame_async::<_, FromAgent>(&mut rd).await {
            Ok(Some(m)) => m,
            // One undecodable frame: skip it, the length prefix keeps the
            // stream in sync.
            Err(CodecError::Decode(_)) => continue,
            Ok(None) | Err(_) => break,
        };
        match msg {
            FromAgent::Data { id, stream, data } => {
                if let Some(route) = shared.calls().get(&id) {
                    let _ = route.events.send(CallEvent::Data { stream, data });
                }
            }
            FromAgent::Credit { id, bytes } => {
                if let Some(route) = shared.calls().get(&id) {
                    let w = &route.window;
                    *w.avail.lock().unwrap_or_else(|p| p.into_inner()) += u64::from(bytes);
                    w.changed.notify_waiters();
                }
            }
            FromAgent::Reply { id, result } => {
                let route = shared.calls().remove(&id);
                if let Some(route) = route {
                    route.window.finished.store(true, Ordering::SeqCst);
                    route.window.changed.notify_waiters();
                    let _ = route.events.send(CallEvent::Reply(result));
                }
            }
            FromAgent::Audited(tally) => {
                let mut audit = shared.audit.lock().unwrap_or_else(|p| p.into_inner());
                audit.latest = tally;
                audit.deliver();
            }
            // A second Hello means nothing to us.
            FromAgent::Hello(_) => {}
        }
    }
    shared.close();
}

async fn writer<W: AsyncWrite + Unpin>(mut wr: W, mut rx: mpsc::UnboundedReceiver<Vec<u8>>, shared: Arc<Shared>) {
    while let Some(mut batch) = rx.recv().await {
        while batch.len() < WRITE_BATCH {
            match rx.try_recv() {
                Ok(f) => batch.extend_from_slice(&f),
                Err(_) => break,
            }
        }
        if wr.write_all(&batch).await.is_err() || wr.flush().await.is_err() {
            shared.close();
            return;
        }
    }
    // Every handle is gone: half-close so the agent sees end of stream.
    let _ = wr.shutdown().await;
}

/// A running request: send input with the sender half, read output and the
/// reply with the receiver half. The halves can be split with
/// [`Call::into_split`] (a WebSocket relay needs both directions at once).
/// Dropping the receiver before the reply cancels the request.
pub struct Call {
    sender: CallSender,
    receiver: CallReceiver,
}

/// Output a request produced, gathered by [`Call::collect`].
#[derive(Debug, Default)]
pub struct CallOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub pty: Vec<u8>,
    pub content: Vec<u8>,
}

impl Call {
    pub fn id(&self) -> ReqId {
        self.sender.id
    }

    pub fn into_split(self) -> (CallSender, CallReceiver) {
        (self.sender, self.receiver)
    }

    pub fn sender(&self) -> &CallSender {
        &self.sender
    }

    /// Next event; `Ok(None)` after the reply was handed out.
    pub async fn recv(&mut self) -> Result<Option<CallEvent>, ClientError> {
        self.receiver.recv().await
    }

    pub async fn send_data(&self, data: &[u8]) -> Result<(), ClientError> {
        self.sender.send_data(data).await
    }

    pub fn send_eof(&self) -> Result<(), ClientError> {
        self.sender.send_eof()
    }

    pub fn signal(&self, signal: i32) -> Result<(), ClientError> {
        self.sender.signal(signal)
    }

    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), ClientError> {
        self.sender.resize(rows, cols)
    }

    pub fn cancel(&self) -> Result<(), ClientError> {
        self.sender.cancel()
    }

    /// Reads everything up to the reply (output kept in memory: for
    /// requests whose output is known to be small).
    pub async fn collect(mut self) -> Result<(CallOutput, Result<Reply, AgentError>), ClientError> {
        let mut out = CallOutput::default();
        loop {
            match self.recv().await? {
                Some(CallEvent::Data { stream, data }) => match stream {
                    Stream::Stdout => out.stdout.extend(data),
                    Stream::Stderr => out.stderr.extend(data),
                    Stream::Pty => out.pty.extend(data),
                    Stream::Content => out.content.extend(data),
                },
                Some(CallEvent::Reply(r)) => return Ok((out, r)),
                None => return Err(ClientError::Closed),
            }
        }
    }
}

/// The input side of a request.
pub struct CallSender {
    id: ReqId,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    window: Arc<SendWindow>,
}

impl CallSender {
    pub fn id(&self) -> ReqId {
        self.id
    }

    fn send(&self, msg: &ToAgent) -> Result<(), ClientError> {
        let frame = encode(msg)?;
        self.tx.send(frame).map_err(|_| ClientError::Closed)
    }

    /// Sends input as Data frames, waiting for the agent's credit as
    /// needed. Fails with `Closed` if the request ended (it replied, say
    /// `TooLarge`) or the channel died before everything was sent.
    pub async fn send_data(&self, mut data: &[u8]) -> Result<(), ClientError> {
        while !data.is_empty() {
            let notified = self.window.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.window.finished.load(Ordering::SeqCst) {
                return Err(ClientError::Closed);
            }
            let n = {
                let mut avail = self.window.avail.lock().unwrap_or_else(|p| p.into_inner());
                let n = (*avail).min(data.len() as u64).min(MAX_CHUNK_BYTES as u64) as usize;
                *avail -= n as u64;
                n
            };
            if n == 0 {
                notified.await;
                continue;
            }
            self.send(&ToAgent::Data { id: self.id, data: data[..n].to_vec() })?;
            data = &data[n..];
        }
        Ok(())
    }

    /// No more input (closes stdin / ends an upload).
    pub fn send_eof(&self) -> Result<(), ClientError> {
        self.send(&ToAgent::Eof { id: self.id })
    }

    pub fn signal(&self, signal: i32) -> Result<(), ClientError> {
        self.send(&ToAgent::Signal { id: self.id, signal })
    }

    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), ClientError> {
        self.send(&ToAgent::Resize { id: self.id, rows, cols })
    }

    /// Asks the agent to stop the request; its reply still follows.
    pub fn cancel(&self) -> Result<(), ClientError> {
        self.send(&ToAgent::Cancel { id: self.id })
    }
}

/// The output side of a request.
pub struct CallReceiver {
    id: ReqId,
    rx: mpsc::UnboundedReceiver<CallEvent>,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    shared: Arc<Shared>,
    done: bool,
    /// Data handed out but not yet credited back.
    unacked: u64,
}

impl CallReceiver {
    pub fn id(&self) -> ReqId {
        self.id
    }

    /// Drives `send` (which feeds the call's input) until the reply comes.
    /// The agent may answer before all input is sent (a bad path, too much
    /// data): `send` is then dropped. An error of `send` ends the wait.
    pub async fn reply_while<E, F>(&mut self, send: F) -> Result<Result<Reply, AgentError>, E>
    where
        E: From<ClientError>,
        F: std::future::Future<Output = Result<(), E>>,
    {
        let recv = self.reply();
        tokio::pin!(send, recv);
        let mut sent = false;
        loop {
            tokio::select! {
                r = &mut recv => return r.map_err(E::from),
                s = &mut send, if !sent => { s?; sent = true; }
            }
        }
    }

    /// Waits for the reply of a call whose output does not matter (an
    /// upload), dropping any data; `Err(Closed)` if none comes.
    pub async fn reply(&mut self) -> Result<Result<Reply, AgentError>, ClientError> {
        loop {
            match self.recv().await? {
                Some(CallEvent::Reply(r)) => return Ok(r),
                Some(CallEvent::Data { .. }) => {}
                None => return Err(ClientError::Closed),
            }
        }
    }

    /// Next event; `Ok(None)` after the reply; `Err(Closed)` if the channel
    /// died first. Credit goes back to the agent as data is handed out.
    pub async fn recv(&mut self) -> Result<Option<CallEvent>, ClientError> {
        if self.done {
            return Ok(None);
        }
        match self.rx.recv().await {
            Some(CallEvent::Data { stream, data }) => {
                self.unacked += data.len() as u64;
                if self.unacked >= CREDIT_BATCH {
                    let bytes = self.unacked.min(u64::from(u32::MAX)) as u32;
                    self.unacked -= u64::from(bytes);
                    if let Ok(frame) = encode(&ToAgent::Credit { id: self.id, bytes }) {
                        let _ = self.tx.send(frame);
                    }
                }
                Ok(Some(CallEvent::Data { stream, data }))
            }
            Some(reply @ CallEvent::Reply(_)) => {
                self.done = true;
                Ok(Some(reply))
            }
            None => {
                self.done = true;
                Err(ClientError::Closed)
            }
        }
    }
}

impl Drop for CallReceiver {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Nobody will read the rest: stop routing it, and tell the agent.
        self.shared.calls().remove(&self.id);
        if let Ok(frame) = encode(&ToAgent::Cancel { id: self.id }) {
            let _ = self.tx.send(frame);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::write_frame_async;
    use crate::{ErrorKind, MIN_PROTOCOL_VERSION};
    use tokio::net::UnixStream;

    /// A scripted fake agent on the other end of a socketpair.
    async fn fake_agent(s: UnixStream) -> (UnixStream, EdgeHello) {
        fake_agent_saying(s, AgentHello::ours("test", AgentState::Fresh)).await
    }

    async fn fake_agent_saying(mut s: UnixStream, hello: AgentHello) -> (UnixStream, EdgeHello) {
        write_frame_async(&mut s, &FromAgent::Hello(hello)).await.unwrap();
        let Some(ToAgent::Hello(h)) = read_frame_async::<_, ToAgent>(&mut s).await.unwrap() else { panic!("no hello") };
        (s, h)
    }

    #[tokio::test]
    async fn handshake_call_and_agent_error() {
        let (a, b) = UnixStream::pair().unwrap();
        let agent = tokio::spawn(async move {
            let (mut s, h) = fake_agent(b).await;
            assert_eq!(h.protocol_version, PROTOCOL_VERSION);
            for _ in 0..2 {
                let Some(ToAgent::Request { id, op }) = read_frame_async::<_, ToAgent>(&mut s).await.unwrap() else { panic!() };
                let result = match op {
                    Op::Ping => Ok(Reply::Pong),
                    _ => Err(AgentError::new(ErrorKind::NotFound, "nope")),
                };
                write_frame_async(&mut s, &FromAgent::Reply { id, result }).await.unwrap();
            }
            s
        });
        let (client, hello) = AgentClient::connect(a).await.unwrap();
        assert_eq!(hello.agent_version, "test");
        assert_eq!(client.call(Op::Ping).await.unwrap(), Reply::Pong);
        let err = client.call(Op::Stat { path: "/x".into() }).await.unwrap_err();
        assert!(matches!(err, ClientError::Agent(ref e) if e.kind == ErrorKind::NotFound), "{err}");
        drop(agent.await.unwrap());
        tokio::time::timeout(std::time::Duration::from_secs(5), client.closed()).await.unwrap();
        assert!(client.is_closed());
        assert!(matches!(client.call(Op::Ping).await, Err(ClientError::Closed)));
    }

    /// Tallies that came before the sink are delivered when it is set; later
    /// ones are delivered as growth only.
    #[tokio::test]
    async fn audit_tallies_reach_the_sink_as_growth() {
        let (a, b) = UnixStream::pair().unwrap();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let agent = tokio::spawn(async move {
            let (mut s, _) = fake_agent(b).await;
            let tally = |n: u64, m: u64| FromAgent::Audited(AuditTally { by_kind: vec![("syscall".into(), n), ("network".into(), m)] });
            write_frame_async(&mut s, &tally(2, 0)).await.unwrap();
            go_rx.await.unwrap();
            write_frame_async(&mut s, &tally(5, 1)).await.unwrap();
            // Answer a ping so the test knows everything before it was read.
            let Some(ToAgent::Request { id, .. }) = read_frame_async::<_, ToAgent>(&mut s).await.unwrap() else { panic!() };
            write_frame_async(&mut s, &FromAgent::Reply { id, result: Ok(Reply::Pong) }).await.unwrap();
            s
        });
        let (client, _) = AgentClient::connect(a).await.unwrap();
        // Let the first tally arrive before anyone listens.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let seen = Arc::new(Mutex::new(Vec::<(String, u64)>::new()));
        let s2 = seen.clone();
        client.on_audit(Arc::new(move |k: &str, n: u64| s2.lock().unwrap().push((k.to_string(), n))));
        go_tx.send(()).unwrap();
        assert_eq!(client.call(Op::Ping).await.unwrap(), Reply::Pong);
        let got = seen.lock().unwrap().clone();
        assert_eq!(got, vec![("syscall".into(), 2), ("syscall".into(), 3), ("network".into(), 1)]);
        drop(agent.await.unwrap());
    }

    fn hello(version: u32, offer: Option<crate::Offer>) -> AgentHello {
        AgentHello { protocol_version: version, agent_version: "x".into(), state: AgentState::Ready { sandbox_id: "sb-1".into() }, offer }
    }

    /// The refusal of an agent the edge cannot talk to, in either order.
    async fn refusal(agent_hello: AgentHello, greeting: Greeting) -> String {
        let (a, b) = UnixStream::pair().unwrap();
        tokio::spawn(async move {
            let _ = fake_agent_saying(b, agent_hello).await;
        });
        match AgentClient::handshake(a, greeting).await {
            Err(e @ ClientError::Incompatible { .. }) => e.to_string(),
            Err(e) => panic!("not a refusal: {e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[tokio::test]
    async fn an_agent_older_than_the_minimum_is_refused_naming_both_ranges() {
        let old = crate::Offer { min_version: MIN_PROTOCOL_VERSION - 2, features: vec![] };
        let msg = refusal(hello(MIN_PROTOCOL_VERSION - 1, Some(old)), Greeting::Answer).await;
        let want = format!(
            "the agent in sandbox sb-1 speaks protocols {} to {}, the edge protocols {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}: rebuild the image with a newer agent",
            MIN_PROTOCOL_VERSION - 2,
            MIN_PROTOCOL_VERSION - 1
        );
        assert_eq!(msg, want);
        let msg = refusal(hello(PROTOCOL_VERSION + 1, None), Greeting::First).await;
        assert!(msg.contains("it predates version negotiation") && msg.ends_with("upgrade the edge"), "{msg}");
    }

    /// A greeting edge has already named its own version, which an agent
    /// from before negotiation refuses unless it is its own.
    #[tokio::test]
    async fn a_strict_older_agent_needs_the_edge_to_answer() {
        let msg = refusal(hello(MIN_PROTOCOL_VERSION, None), Greeting::First).await;
        assert!(msg.contains(&format!("only protocol {MIN_PROTOCOL_VERSION}")), "{msg}");
    }

    /// An agent newer than the edge is answered with the edge's version.
    #[tokio::test]
    async fn a_newer_agent_gets_the_edges_version() {
        let (a, b) = UnixStream::pair().unwrap();
        let newer = hello(
            PROTOCOL_VERSION + 3,
            Some(crate::Offer { min_version: MIN_PROTOCOL_VERSION, features: vec!["vm_nic".into(), "later".into()] }),
        );
        let agent = tokio::spawn(fake_agent_saying(b, newer));
        let (client, _) = AgentClient::answer(a).await.unwrap();
        let (_, edge_hello) = agent.await.unwrap();
        assert_eq!(edge_hello, EdgeHello::ours(PROTOCOL_VERSION));
        assert_eq!(client.negotiated(), Negotiated { version: PROTOCOL_VERSION, features: crate::Features::from_names(["vm_nic"]) });
    }

    /// An agent that does not announce port forwarding is never sent a
    /// `ConnectPort` (it would drop the frame and never answer).
    #[tokio::test]
    async fn a_port_connect_needs_the_agents_feature() {
        let (a, b) = UnixStream::pair().unwrap();
        let without = hello(PROTOCOL_VERSION, Some(crate::Offer { min_version: MIN_PROTOCOL_VERSION, features: vec!["vm_nic".into()] }));
        let _agent = tokio::spawn(fake_agent_saying(b, without));
        let (client, _) = AgentClient::answer(a).await.unwrap();
        let err = client.open(Op::ConnectPort { port: 8000 }).await.err().expect("refused before it is sent");
        assert!(matches!(err, ClientError::Unsupported { feature: Feature::PortForward, .. }), "{err}");
    }

    fn vm_setup(nic: Option<crate::VmNic>) -> Op {
        Op::SetupVm(crate::negotiation::tests::vm_setup(nic))
    }

    /// An agent of protocol 4 from before negotiation (it says only its
    /// version): the edge answers with 4, refuses a setup with a NIC with
    /// the error that says why, and sends it everything else.
    #[tokio::test]
    async fn an_older_agent_serves_what_it_can_and_a_gated_op_is_refused() {
        for offer in [None, Some(crate::Offer { min_version: 4, features: vec![] })] {
            let (a, b) = UnixStream::pair().unwrap();
            let fresh = AgentHello { protocol_version: 4, agent_version: "old".into(), state: AgentState::Fresh, offer };
            let agent = tokio::spawn(async move {
                let (mut s, h) = fake_agent_saying(b, fresh).await;
                let mut ops = vec![];
                while let Ok(Some(ToAgent::Request { id, op })) = read_frame_async::<_, ToAgent>(&mut s).await {
                    ops.push(op);
                    write_frame_async(&mut s, &FromAgent::Reply { id, result: Ok(Reply::Ready) }).await.unwrap();
                }
                (h, ops)
            });
            let (client, _) = AgentClient::answer(a).await.unwrap();
            assert_eq!(client.negotiated(), Negotiated { version: 4, features: crate::Features::default() });
            let nic =
                crate::VmNic { mac: "52:54:00:00:00:01".into(), address: [10, 0, 2, 15].into(), prefix: 24, gateway: [10, 0, 2, 2].into() };
            let err = client.call(vm_setup(Some(nic))).await.unwrap_err();
            assert!(matches!(err, ClientError::Unsupported { feature: Feature::VmNic, version: 4, .. }), "{err}");
            assert_eq!(
                err.to_string(),
                "the agent in sandbox sb speaks protocol 4, which lacks vm_nic (the setup of a networked full VM's NIC (VmSetup::nic)); rebuild the image with a newer agent"
            );
            assert_eq!(client.call(vm_setup(None)).await.unwrap(), Reply::Ready);
            assert_eq!(client.call(Op::Ping).await.unwrap(), Reply::Ready);
            drop(client);
            let (edge_hello, ops) = agent.await.unwrap();
            assert_eq!(edge_hello.protocol_version, 4, "the edge answers with the agent's version");
            assert_eq!(ops, vec![vm_setup(None), Op::Ping], "the refused setup never reached the agent");
        }
    }

    /// Credit flows both ways: send_data stops at the window until the
    /// agent grants more, and recv grants credit back for consumed data.
    #[tokio::test]
    async fn credit_both_ways_and_cancel_on_drop() {
        let (a, b) = UnixStream::pair().unwrap();
        let (seen_tx, mut seen_rx) = mpsc::unbounded_channel::<ToAgent>();
        let agent = tokio::spawn(async move {
            let (s, _) = fake_agent(b).await;
            let (mut rd, mut wr) = tokio::io::split(s);
            let Some(ToAgent::Request { id, .. }) = read_frame_async::<_, ToAgent>(&mut rd).await.unwrap() else { panic!() };
            // Send a full window of output.
            for _ in 0..(INITIAL_WINDOW as usize / MAX_CHUNK_BYTES) {
                write_frame_async(&mut wr, &FromAgent::Data { id, stream: Stream::Stdout, data: vec![7; MAX_CHUNK_BYTES] }).await.unwrap();
            }
            let mut got = 0usize;
            while let Ok(Some(m)) = read_frame_async::<_, ToAgent>(&mut rd).await {
                if let ToAgent::Data { data, .. } = &m {
                    got += data.len();
                    if got == INITIAL_WINDOW as usize {
                        write_frame_async(&mut wr, &FromAgent::Credit { id, bytes: 1000 }).await.unwrap();
                    }
                }
                let _ = seen_tx.send(m);
            }
        });
        let (client, _) = AgentClient::connect(a).await.unwrap();
        let mut call = client
            .open(Op::Exec(crate::ExecSpec {
                command: crate::Command::Shell("cat".into()),
                env: vec![],
                cwd: None,
                user: None,
                stdin: crate::Stdin::Stream,
                stream_output: true,
                timeout_ms: None,
                kill_grace_ms: 0,
                max_output_bytes: u64::MAX,
                session: None,
            }))
            .await
            .unwrap();
        // Sending more than the window blocks until the credit arrives.
        let big = vec![1u8; INITIAL_WINDOW as usize + 500];
        tokio::time::timeout(std::time::Duration::from_secs(5), call.send_data(&big)).await.unwrap().unwrap();
        let too_much = vec![1u8; 1000];
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(200), call.send_data(&too_much)).await.is_err(),
            "window not respected"
        );
        // Consuming output grants credit in batches.
        for _ in 0..2 {
            assert!(matches!(call.recv().await.unwrap(), Some(CallEvent::Data { .. })));
        }
        let id = call.id();
        drop(call);
        let mut credits = 0;
        let mut cancelled = false;
        while let Ok(Some(m)) = tokio::time::timeout(std::time::Duration::from_secs(2), seen_rx.recv()).await {
            match m {
                ToAgent::Credit { id: i, bytes } if i == id => credits += bytes,
                ToAgent::Cancel { id: i } if i == id => {
                    cancelled = true;
                    break;
                }
                _ => {}
            }
        }
        assert_eq!(credits as usize, 2 * MAX_CHUNK_BYTES);
        assert!(cancelled, "dropping an unfinished call must cancel it");
        drop(client);
        agent.await.unwrap();
    }

    fn rss_kib() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    /// Set in the child process that runs the idle-connection measurement.
    const MEASURE_ENV: &str = "DSEC_PROTO_MEASURE_IDLE_CONNECTIONS";

    /// What an idle connection costs the edge. The agent side here is just a
    /// socket with a Hello already written into it, so only the client is
    /// measured. Resident memory is per process and the other tests of this
    /// binary run concurrently, so the measurement runs alone in a child:
    /// this test binary again, filtered to this one test, with MEASURE_ENV set.
    #[test]
    fn idle_connection_memory() {
        if std::env::var_os(MEASURE_ENV).is_some() {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(measure_idle_connections());
            return;
        }
        let name = format!("{}::idle_connection_memory", module_path!().split_once("::").unwrap().1);
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name.as_str(), "--exact", "--test-threads=1", "--nocapture"])
            .env(MEASURE_ENV, "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the measurement did not finish within 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "measurement failed: {stdout}\n{stderr}");
        assert!(stdout.contains("1 passed"), "the measurement did not run: {stdout}\n{stderr}");
        let line = stderr.lines().find(|l| l.starts_with("idle AgentClient:")).unwrap_or_else(|| panic!("no result: {stderr}"));
        eprintln!("{line}");
    }

    async fn measure_idle_connections() {
        const N: usize = 2000;
        let hello = crate::codec::encode(&FromAgent::Hello(AgentHello::ours("test", AgentState::Fresh))).unwrap();
        let mut keep = Vec::with_capacity(N);
        // Warm up allocator and runtime before measuring.
        for _ in 0..50 {
            let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
            std::io::Write::write_all(&mut b, &hello).unwrap();
            a.set_nonblocking(true).unwrap();
            let (c, _) = AgentClient::connect(UnixStream::from_std(a).unwrap()).await.unwrap();
            keep.push((c, b));
        }
        let before = rss_kib();
        for _ in 0..N {
            let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
            std::io::Write::write_all(&mut b, &hello).unwrap();
            a.set_nonblocking(true).unwrap();
            let (c, _) = AgentClient::connect(UnixStream::from_std(a).unwrap()).await.unwrap();
            keep.push((c, b));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let per = (rss_kib() - before) as f64 / N as f64;
        eprintln!("idle AgentClient: {per:.2} KiB per connection ({N} connections)");
        assert!(per < 16.0);
        // They all still work.
        assert!(keep.iter().all(|(c, _)| !c.is_closed()));
    }
}
