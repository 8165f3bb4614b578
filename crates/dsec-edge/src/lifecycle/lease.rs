//! Lease extension: a running (or paused) sandbox's idle TTL and hard
//! lifetime can be changed while it lives, e.g. to keep it for grading
//! after the rollout's own deadline.

use crate::edge::{lock, Edge};
use crate::error::EdgeError;
use crate::model::{now_ms, Caller, SandboxRecord};

/// A change of lifetimes; `None` leaves that one as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lease {
    /// New idle TTL in seconds (0 = no idle timeout).
    pub idle_ttl_s: Option<u64>,
    /// The sandbox ends this many seconds from now, whatever its activity.
    pub lifetime_s: Option<u64>,
}

impl Edge {
    pub fn set_lease(&self, caller: &Caller, id: &str, lease: Lease) -> Result<SandboxRecord, EdgeError> {
        let entry = self.entry(caller, id)?;
        let cap = self.inner.config.policy.max_lifetime_cap_s;
        let rec = {
            let mut r = lock(&entry.record);
            if r.state.is_terminal() {
                return Err(EdgeError::Ended { id: id.to_string(), state: r.state.as_str() });
            }
            // The hard lifetime is stored from creation, so the node's cap
            // bounds a sandbox's whole life, extensions included.
            let lifetime = match lease.lifetime_s {
                Some(0) => return Err(EdgeError::InvalidLimits("lifetime_s must be at least 1 second".into())),
                Some(s) => Some(now_ms().saturating_sub(r.created_at_ms).div_ceil(1000) + s),
                None => None,
            };
            if let Some(total) = lifetime {
                if total > cap {
                    return Err(EdgeError::InvalidLimits(format!(
                        "the sandbox would live {total} s in all; this node allows at most {cap} s"
                    )));
                }
                r.spec.max_lifetime_s = total;
            }
            if let Some(ttl) = lease.idle_ttl_s {
                r.spec.idle_ttl_s = ttl;
            }
            r.clone()
        };
        // Extending is activity too.
        drop(entry.begin());
        self.save(&rec);
        Ok(entry.record())
    }
}
