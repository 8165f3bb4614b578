//! The edge's side of per-sandbox egress (the mechanism is `dsec-net`):
//! which requests get a network, changing a running sandbox's rules, and
//! turning denials into audit events in the sandbox's ring.
//!
//! A container sandbox created with any network rule (even all `false`)
//! gets a veth and an allowlist; one created without rules keeps the
//! loopback-only namespace (the fast path), and its rules cannot change.
//! On a node started without a network configuration every allow rule is
//! refused (`unsupported_network_policy`), as before.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use dsec_agent_proto::{AuditEvent, Op};
use dsec_net::{NetError, RuleError};

use crate::edge::{lock, Edge};
use crate::error::EdgeError;
use crate::model::{BackendKind, Caller};
use crate::SandboxRequest;

/// Events forwarded to one agent per batch; the rest of a burst is
/// summarised in one event (the agent's ring is bounded anyway).
const BATCH: usize = 64;

impl From<NetError> for EdgeError {
    fn from(e: NetError) -> EdgeError {
        match e {
            NetError::Rules(r) => r.into(),
            NetError::NotNetworked(id) => EdgeError::NetworkNotEnabled(format!(
                "sandbox {id} was created without network rules (loopback only); create it with rules, even all false, to change them later"
            )),
            other => EdgeError::Internal(other.to_string()),
        }
    }
}

impl From<RuleError> for EdgeError {
    fn from(e: RuleError) -> EdgeError {
        match e {
            RuleError::UnknownService(..) => EdgeError::UnknownNetworkService(e.to_string()),
            other => EdgeError::NetworkRule(other.to_string()),
        }
    }
}

/// Checks a creation's rules where this node enforces them, and takes them
/// out of the request (the spec check refuses allow rules on nodes without
/// egress); they go back into the spec after it.
pub(crate) fn take_rules(edge: &Edge, mut req: SandboxRequest) -> Result<(SandboxRequest, Option<BTreeMap<String, bool>>), EdgeError> {
    let Some(egress) = edge.inner.egress.as_ref() else { return Ok((req, None)) };
    let container = matches!(req.backend, None | Some(BackendKind::Container));
    if !container || req.network_rules.is_empty() {
        return Ok((req, None));
    }
    egress.validate(&req.network_rules)?;
    let rules = std::mem::take(&mut req.network_rules);
    Ok((req, Some(rules)))
}

impl Edge {
    /// Replaces a running sandbox's network rules. New connections follow
    /// them at once.
    pub fn set_network_rules(&self, caller: &Caller, id: &str, rules: BTreeMap<String, bool>) -> Result<BTreeMap<String, bool>, EdgeError> {
        let entry = self.entry(caller, id)?;
        let Some(egress) = self.inner.egress.as_ref() else {
            return Err(EdgeError::UnsupportedNetwork("outbound network is not enabled on this node; sandboxes have loopback only".into()));
        };
        {
            let r = lock(&entry.record);
            if r.state.is_terminal() {
                return Err(EdgeError::Ended { id: id.to_string(), state: r.state.as_str() });
            }
        }
        egress.set_rules(id, &rules)?;
        let rec = {
            let mut r = lock(&entry.record);
            r.spec.network_rules = rules.clone();
            r.clone()
        };
        drop(entry.begin());
        self.save(&rec);
        Ok(rules)
    }

    /// Forwards denials to each sandbox's audit ring, batched per sandbox.
    pub(crate) fn spawn_denial_forwarder(&self, mut rx: tokio::sync::mpsc::Receiver<dsec_net::Denial>) {
        let edge = self.clone();
        tokio::spawn(async move {
            loop {
                let Some(first) = rx.recv().await else { return };
                // Gather what arrived with it, briefly.
                tokio::time::sleep(Duration::from_millis(5)).await;
                let mut by_sandbox: HashMap<String, Vec<dsec_net::Denial>> = HashMap::new();
                by_sandbox.entry(first.sandbox_id.clone()).or_default().push(first);
                while let Ok(d) = rx.try_recv() {
                    by_sandbox.entry(d.sandbox_id.clone()).or_default().push(d);
                }
                for (id, denials) in by_sandbox {
                    let Some(inst) = edge.inner.registry.read().unwrap_or_else(|p| p.into_inner()).get(&id).and_then(|e| e.instance()) else {
                        continue;
                    };
                    let mut events: Vec<AuditEvent> = denials
                        .iter()
                        .take(BATCH)
                        .map(|d| AuditEvent { seq: 0, time_ms: d.time_ms, kind: "network".into(), pid: d.pid, detail: d.detail.clone() })
                        .collect();
                    if denials.len() > BATCH {
                        let last = &denials[denials.len() - 1];
                        events.push(AuditEvent {
                            seq: 0,
                            time_ms: last.time_ms,
                            kind: "network".into(),
                            pid: 0,
                            detail: format!("{} more network attempts refused in this burst", denials.len() - BATCH),
                        });
                    }
                    let inst: Arc<crate::instance::Instance> = inst;
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(Duration::from_secs(5), inst.agent.call(Op::RecordAudit { events })).await;
                    });
                }
            }
        });
    }
}
