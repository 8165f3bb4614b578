//! A creation under its project's quotas: reserve (project and every
//! ancestor, atomically), create, then commit the sandbox's real limits,
//! or give the reservation back if the creation failed. No sandbox is
//! left half-counted and none exists over a limit.

use std::time::Instant;

use dsec_api as api;
use dsec_edge::model::Caller;

use super::Held;
use crate::error::ApiError;
use crate::state::AppState;

/// The defaults a node applies to a request that leaves a limit out
/// (reserved first; the commit takes the node's actual figures).
const DEFAULT_CPU: f64 = 1.0;
const DEFAULT_MEMORY_MB: u64 = 512;
pub(super) const DEFAULT_DISK_MB: u64 = 1024;

/// One sandbox with the limits asked for, the node's defaults for the
/// ones left out.
pub(super) fn asked(cpu_cores: Option<f64>, memory_mb: Option<u64>, disk_mb: Option<u64>) -> Held {
    Held::sandbox(cpu_cores.unwrap_or(DEFAULT_CPU), memory_mb.unwrap_or(DEFAULT_MEMORY_MB), disk_mb.unwrap_or(DEFAULT_DISK_MB))
}

fn demand(req: &api::CreateSandboxRequest) -> Held {
    asked(req.cpu_cores_limit, req.memory_limit_mb, req.disk_limit_mb)
}

/// Creates a sandbox for `caller`'s project within its quotas. An edge
/// serving apiservers has no ledger (the apiserver in front checked).
pub async fn create(
    st: &AppState,
    caller: &Caller,
    req: api::CreateSandboxRequest,
    key: Option<&str>,
) -> Result<api::CreatedSandbox, ApiError> {
    let Some(tokens) = st.auth.tokens() else { return st.nodes.create(caller, req, key, None).await };
    let ledger = tokens.ledger();
    let reservation = ledger.reserve(&caller.tenant, demand(&req), Instant::now())?;
    let created = match st.nodes.create(caller, req, key, Some(tokens.store())).await {
        Ok(c) => c,
        Err(e) => {
            ledger.release(reservation);
            return Err(e);
        }
    };
    let l = &created.sandbox.limits;
    let actual = Held::sandbox(l.cpu_cores_limit, l.memory_limit_mb, l.disk_limit_mb);
    if let Err(e) = ledger.commit(reservation, &created.sandbox.id, actual, Instant::now()) {
        // The node gave it more than reserved (an image's own disk size),
        // and that does not fit: the caller gets the error, no sandbox.
        delete_quietly(st, caller, &created.sandbox.id).await;
        return Err(e.into());
    }
    Ok(created)
}

async fn delete_quietly(st: &AppState, caller: &Caller, id: &str) {
    let result = match st.nodes.node_of(id) {
        Ok(crate::nodes::NodeRef::Local(edge)) => edge.delete(caller, id).await.map_err(ApiError::from),
        Ok(crate::nodes::NodeRef::Remote(r)) => r.stop(caller, id).await.map(drop),
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        tracing::warn!(sandbox = %id, error = %e.message, "could not delete a sandbox over its project's quota");
    }
}
