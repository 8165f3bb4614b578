//! Refused attempts the edge notices itself (denied connections, opened
//! masked paths) go into the sandbox's own audit ring, in the agent, where
//! `GET /v1/sandboxes/{id}/audit` reads every kind of event in one order.
//!
//! Forwarding is batched per sandbox, and a burst beyond [`BATCH`] events is
//! summarised in one event: the ring is bounded anyway, and a sandbox that
//! floods refused attempts must not make the edge flood its agent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dsec_agent_proto::{AuditEvent, Op};

use crate::edge::Edge;

/// Events forwarded to one agent per batch.
const BATCH: usize = 64;

/// One refused attempt (the egress crate's type serves every source).
pub(crate) use dsec_net::Denial as Refused;

impl Edge {
    /// Forwards what arrives on `rx` to each sandbox's audit ring as events
    /// of `kind`; `plural` names them in the summary of a burst.
    pub(crate) fn spawn_audit_forwarder(&self, mut rx: tokio::sync::mpsc::Receiver<Refused>, kind: &'static str, plural: &'static str) {
        let edge = self.clone();
        tokio::spawn(async move {
            loop {
                let Some(first) = rx.recv().await else { return };
                // Gather what arrived with it, briefly.
                tokio::time::sleep(Duration::from_millis(5)).await;
                let mut by_sandbox: HashMap<String, Vec<Refused>> = HashMap::new();
                by_sandbox.entry(first.sandbox_id.clone()).or_default().push(first);
                while let Ok(r) = rx.try_recv() {
                    by_sandbox.entry(r.sandbox_id.clone()).or_default().push(r);
                }
                for (id, refused) in by_sandbox {
                    let Some(inst) = edge.inner.registry.read().unwrap_or_else(|p| p.into_inner()).get(&id).and_then(|e| e.instance())
                    else {
                        continue;
                    };
                    let event = |time_ms, pid, detail| AuditEvent { seq: 0, time_ms, kind: kind.into(), pid, detail };
                    let mut events: Vec<AuditEvent> =
                        refused.iter().take(BATCH).map(|r| event(r.time_ms, r.pid, r.detail.clone())).collect();
                    if refused.len() > BATCH {
                        let last = &refused[refused.len() - 1];
                        events.push(event(last.time_ms, 0, format!("{} more {plural} in this burst", refused.len() - BATCH)));
                    }
                    let inst: Arc<crate::backends::instance::Instance> = inst;
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(Duration::from_secs(5), inst.agent.call(Op::RecordAudit { events })).await;
                    });
                }
            }
        });
    }
}
