//! A sandbox's audit events (refused attempts), read from its agent, and
//! its network rules, whose refusals become such events.

use axum::extract::{Path, State};
use axum::Json;
use dsec_api as api;
use dsec_edge::agent::Reply;
use dsec_edge::AgentRequest;

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult};
use crate::extract::QueryPairs;
use crate::state::AppState;

/// Refused attempts of the sandbox's processes (blocked system calls),
/// oldest first, after sequence number `after` (default 0).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/audit", tag = "sandboxes",
    params(("id" = String, Path), ("after" = Option<u64>, Query)),
    responses((status = 200, body = api::AuditEvents), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn list(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    q: QueryPairs,
) -> ApiResult<Json<api::AuditEvents>> {
    let after = match q.get("after") {
        None => 0,
        Some(s) => s.parse::<u64>().map_err(|_| ApiError::invalid(format!("after={s:?} must be a non-negative integer")))?,
    };
    match st.nodes.owner(&id)?.call(&caller, &id, AgentRequest::AuditEvents { after }).await? {
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

/// Replace a running sandbox's network rules (it must have been created
/// with rules, even all false). New connections follow them at once.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "sandboxes",
    params(("id" = String, Path)), request_body = api::NetworkRules,
    responses((status = 200, body = api::NetworkRules), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn set_network(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    crate::extract::ApiJson(req): crate::extract::ApiJson<api::NetworkRules>,
) -> ApiResult<Json<api::NetworkRules>> {
    let rules = st.nodes.owner(&id)?.set_network_rules(&caller, &id, req.network_rules)?;
    Ok(Json(api::NetworkRules { network_rules: rules }))
}
