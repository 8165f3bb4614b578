//! A sandbox's audit events (refused attempts), read from its agent.

use axum::extract::{Path, State};
use axum::Json;
use dsec_agent_proto::{Op, Reply};
use dsec_api as api;

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult};
use crate::extract::QueryPairs;
use crate::state::AppState;

/// Refused attempts of the sandbox's processes (blocked system calls),
/// oldest first, after sequence number `after` (default 0).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/audit", tag = "sandboxes",
    params(("id" = String, Path), ("after" = Option<u64>, Query)),
    responses((status = 200, body = api::AuditEvents), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn list(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>, q: QueryPairs) -> ApiResult<Json<api::AuditEvents>> {
    let after = match q.get("after") {
        None => 0,
        Some(s) => s.parse::<u64>().map_err(|_| ApiError::invalid(format!("after={s:?} must be a non-negative integer")))?,
    };
    match st.nodes.owner(&id)?.call(&caller, &id, Op::AuditEvents { after }).await? {
        Reply::Audit(log) => Ok(Json(api::AuditEvents {
            sandbox_id: id,
            events: log
                .events
                .into_iter()
                .map(|e| api::AuditEvent { seq: e.seq, time_ms: e.time_ms, kind: e.kind, pid: e.pid, detail: e.detail })
                .collect(),
            total: log.total,
            dropped: log.dropped,
        })),
        other => Err(ApiError::new(api::ErrorCode::Internal, format!("unexpected agent reply {other:?}"))),
    }
}
