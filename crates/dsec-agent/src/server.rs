//! The connection loop: read frames, route them to requests, and outlive
//! the edge in container mode (see reattach.rs).

use std::os::fd::OwnedFd;
use std::rc::Rc;

use dsec_agent_proto::negotiation::Speaks;
use dsec_agent_proto::{AgentHello, AgentState, EdgeHello, FromAgent, Negotiated, ToAgent, PROTOCOL_VERSION};

use crate::agent::{Agent, Mode};
use crate::channel::{Conn, FrameReader, Incoming};
use crate::errors::protocol;
use crate::ops;
use crate::reattach;
use crate::request::ReqCtx;
use crate::start_error::StartError;

pub fn hello(state: AgentState) -> FromAgent {
    FromAgent::Hello(AgentHello::ours(env!("CARGO_PKG_VERSION"), state))
}

/// The version both speak, given the edge's Hello (ours, which always
/// comes first, announced our own); why not, naming both ranges.
pub fn accept(h: &EdgeHello) -> Result<Negotiated, StartError> {
    Speaks::ours().agree(&h.speaks(), Some(PROTOCOL_VERSION)).map_err(|m| StartError::Versions(m.describe_as("the edge", "this agent")))
}

/// Serves `fd` (whose handshake is done) and every later channel, until
/// Shutdown, or until the edge goes away in plain mode.
pub async fn serve(agent: Rc<Agent>, fd: OwnedFd) {
    tokio::task::spawn_local({
        let reaper = agent.reaper.clone();
        async move {
            if let Err(e) = reaper.run().await {
                eprintln!("dsec-agent: the reaper failed: {e}");
            }
        }
    });
    tokio::task::spawn_local(agent.clone().trim_when_idle());
    // A VM's channel is its virtio-serial port, which outlives any one
    // edge: keep a copy to serve the next edge on.
    let port = match agent.mode {
        Mode::Vm | Mode::Guest => match fd.try_clone() {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("dsec-agent: cannot keep the port: {e}");
                return;
            }
        },
        _ => None,
    };
    let mut fd = fd;
    let mut start = Start::Greeted;
    loop {
        let conn = match Conn::new(fd) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("dsec-agent: cannot use the channel: {e}");
                return;
            }
        };
        tokio::task::spawn_local(conn.clone().writer());
        let reporter = tokio::task::spawn_local(crate::audit::report(agent.audit.clone(), conn.clone()));
        let new_edge = run_conn(&agent, &conn, start).await;
        reporter.abort();
        conn.close();
        // Requests of the lost edge run on (their processes are the
        // sandbox's), with nowhere to send output.
        let orphans: Vec<Rc<ReqCtx>> = conn.requests.borrow().values().cloned().collect();
        for ctx in orphans {
            ctx.detach();
        }
        if let Some(port) = &port {
            if new_edge {
                // A new edge said Hello on the port before we saw the old
                // one leave (it left and came while the VM was stopped):
                // answer it on a fresh connection, so nothing of the old
                // requests reaches it.
                fd = match port.try_clone() {
                    Ok(fd) => fd,
                    Err(e) => {
                        eprintln!("dsec-agent: cannot reuse the port: {e}");
                        return;
                    }
                };
                start = Start::Answer;
                continue;
            }
            // The edge's side of the port closed (the edge went away):
            // greet whoever connects to it next.
            fd = match crate::vm_init::next_channel(port).await {
                Ok(fd) => fd,
                Err(e) => {
                    eprintln!("dsec-agent: cannot reuse the port: {e}");
                    return;
                }
            };
            start = Start::Greet;
            continue;
        }
        if agent.mode != Mode::Container {
            return;
        }
        fd = match reattach::new_channel() {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("dsec-agent: cannot create a channel for re-attachment: {e}");
                return;
            }
        };
        start = Start::Greet;
        eprintln!("dsec-agent: the edge went away; waiting for it on fd {}", reattach::REATTACH_FD);
    }
}

/// Where a connection's handshake stands when it starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Done (the first edge, greeted before setup).
    Greeted,
    /// We greet, then wait for the edge's Hello.
    Greet,
    /// The edge's Hello already came: only ours is due.
    Answer,
}

/// Serves one connection until it ends. True if, in a VM, a new edge said
/// Hello in the middle of it.
async fn run_conn(agent: &Rc<Agent>, conn: &Rc<Conn>, start: Start) -> bool {
    let mut reader = FrameReader::default();
    if start == Start::Answer {
        let _ = conn.send(&hello(AgentState::Ready { sandbox_id: agent.sandbox_id.borrow().clone() }));
    }
    if start == Start::Greet {
        let _ = conn.send(&hello(AgentState::Ready { sandbox_id: agent.sandbox_id.borrow().clone() }));
        match reader.next(conn).await {
            Ok(Some(Incoming::Frame(ToAgent::Hello(h)))) => match accept(&h) {
                Ok(_) => reattach::release(),
                Err(e) => {
                    eprintln!("dsec-agent: {e}");
                    return false;
                }
            },
            Ok(None) => return false,
            Ok(Some(_)) => {
                eprintln!("dsec-agent: the edge must say Hello first");
                return false;
            }
            Err(e) => {
                eprintln!("dsec-agent: channel: {e}");
                return false;
            }
        }
    }
    loop {
        match reader.next(conn).await {
            Ok(Some(Incoming::Frame(ToAgent::Hello(h)))) if matches!(agent.mode, Mode::Vm | Mode::Guest) => match accept(&h) {
                Ok(_) => return true,
                Err(e) => eprintln!("dsec-agent: a new edge said Hello: {e}"),
            },
            Ok(Some(Incoming::Frame(msg))) => dispatch(agent, conn, msg),
            Ok(Some(Incoming::Garbage(e))) => eprintln!("dsec-agent: dropped a malformed frame: {e}"),
            Ok(None) => return false,
            Err(e) => {
                eprintln!("dsec-agent: channel: {e}");
                return false;
            }
        }
        if conn.is_closed() {
            return false;
        }
    }
}

fn dispatch(agent: &Rc<Agent>, conn: &Rc<Conn>, msg: ToAgent) {
    let find = |id| conn.requests.borrow().get(&id).cloned();
    match msg {
        ToAgent::Hello(_) => eprintln!("dsec-agent: unexpected Hello in the middle of a conversation"),
        ToAgent::Request { id, op } => {
            if conn.requests.borrow().contains_key(&id) {
                eprintln!("dsec-agent: request id {id} is already in use");
                let _ = conn.send(&FromAgent::Reply { id, result: Err(protocol(format!("request id {id} is already in use"))) });
                return;
            }
            let ctx = ReqCtx::new(id, conn.clone());
            conn.requests.borrow_mut().insert(id, ctx.clone());
            tokio::task::spawn_local(ops::run(agent.clone(), ctx, op));
        }
        // Frames for a request that has already replied are a normal race
        // (the edge sent them before seeing the reply): dropped quietly.
        ToAgent::Data { id, data } => {
            if let Some(c) = find(id) {
                c.push_data(data);
            }
        }
        ToAgent::Eof { id } => {
            if let Some(c) = find(id) {
                c.push_eof();
            }
        }
        ToAgent::Signal { id, signal } => {
            if let Some(c) = find(id) {
                if (1..=64).contains(&signal) {
                    c.push_signal(signal);
                } else {
                    eprintln!("dsec-agent: request {id}: invalid signal {signal}");
                }
            }
        }
        ToAgent::Resize { id, rows, cols } => {
            if let Some(c) = find(id) {
                c.push_resize(rows, cols);
            }
        }
        ToAgent::Credit { id, bytes } => {
            if let Some(c) = find(id) {
                c.push_credit(bytes);
            }
        }
        ToAgent::Cancel { id } => {
            if let Some(c) = find(id) {
                c.cancel();
            }
        }
    }
}
