//! The edge's side of per-sandbox egress (the mechanism is `dsec-net`):
//! which requests get a network, changing a running sandbox's rules, and
//! turning denials into audit events in the sandbox's ring.
//!
//! A container, microVM or full VM sandbox created with any network rule
//! (even all `false`) gets a veth and an allowlist (a VM's QEMU is placed
//! under it, `backends::qemu::net`); one created without rules keeps the
//! loopback-only namespace (the fast path), and its rules cannot change.
//! On a node started without a network configuration every allow rule is
//! refused (`unsupported_network_policy`), as before.

use dsec_net::{NetError, RuleError};
use std::collections::BTreeMap;

use crate::edge::{lock, Edge};
use crate::error::EdgeError;
use crate::model::{BackendKind, Caller};
use crate::SandboxRequest;

impl From<NetError> for EdgeError {
    fn from(e: NetError) -> EdgeError {
        match e {
            NetError::Rules(r) => r.into(),
            NetError::NotNetworked(id) => EdgeError::NetworkNotEnabled(format!(
                "sandbox {id} was created without network rules (loopback only); create it with rules, even all false, to change them later"
            )),
            other => EdgeError::Net(Box::new(other)),
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
    let networked = match req.backend.unwrap_or(BackendKind::Container) {
        BackendKind::Fncall => false,
        kind => match edge.inner.backends.get(kind) {
            Ok(backend) => backend
                .network_ready()
                .map(|()| true)
                .map_err(|why| EdgeError::UnsupportedNetwork(format!("{} cannot have network rules here: {why}", plural(kind))))?,
            // A backend this node lacks: the backend check after the
            // spec's says so (rather than the spec's "no network here").
            Err(_) => true,
        },
    };
    if !networked || req.network_rules.is_empty() {
        return Ok((req, None));
    }
    egress.validate(&req.network_rules)?;
    let rules = std::mem::take(&mut req.network_rules);
    Ok((req, Some(rules)))
}

/// Sandboxes of `kind`, in a sentence.
fn plural(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Container => "containers",
        BackendKind::Microvm => "microVMs",
        BackendKind::Vm => "full VMs",
        BackendKind::Fncall => "FnCall runners",
    }
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
}
