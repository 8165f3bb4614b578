//! Pause, resume and lease extension of one sandbox.

use axum::extract::{Path, Query, State};
use axum::Json;
use dsec_api as api;
use dsec_edge::{Lease, PauseMode};

use crate::auth::Auth;
use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::state::AppState;

/// Pause a sandbox: a microVM is suspended to disk (memory and device
/// state saved, its QEMU ended), a container frozen with its memory pushed
/// out of RAM (`mode` chooses). Idempotent (`changed: false` if already
/// paused). A paused sandbox does not count against the node's running
/// quota; any request to it resumes it.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "lifecycle",
    params(("id" = String, Path), PauseParams),
    responses((status = 200, body = api::PauseResult), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn pause(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    Query(params): Query<PauseParams>,
) -> ApiResult<Json<api::PauseResult>> {
    let mode: PauseMode = params.mode.as_deref().unwrap_or("auto").parse().map_err(ApiError::invalid)?;
    let o = st.nodes.owner(&id)?.pause_with(&caller, &id, mode).await?;
    Ok(Json(api::PauseResult {
        sandbox: convert::sandbox_out(o.record),
        changed: o.changed,
        memory_before_bytes: o.memory.before_bytes,
        memory_after_bytes: o.memory.after_bytes,
        memory_freed_bytes: o.memory.freed_bytes(),
        duration_ms: o.duration_ms,
        suspended: o.suspended,
        disk_bytes: o.disk_bytes,
    }))
}

/// Query of `POST /v1/sandboxes/{id}/pause`.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PauseParams {
    /// `auto` (default: microVMs suspend to disk, containers freeze),
    /// `freeze` (keep the process, frozen, memory pushed out) or `suspend`
    /// (save memory and device state to disk and end the process).
    pub mode: Option<String>,
}

/// Resume a paused sandbox. Idempotent (`changed: false` if running); a
/// stopped sandbox answers 409 `sandbox_ended`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "lifecycle",
    params(("id" = String, Path)),
    responses((status = 200, body = api::ResumeResult), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody), (status = 503, body = api::ErrorBody)))]
pub async fn resume(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>) -> ApiResult<Json<api::ResumeResult>> {
    let o = st.nodes.owner(&id)?.resume(&caller, &id).await?;
    Ok(Json(api::ResumeResult { sandbox: convert::sandbox_out(o.record), changed: o.changed, duration_ms: o.duration_ms }))
}

/// Change a sandbox's lease: its idle TTL, and/or a hard end this many
/// seconds from now.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/timeout", tag = "lifecycle",
    params(("id" = String, Path)), request_body = api::SetTimeoutRequest,
    responses((status = 200, body = api::Sandbox), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn set_timeout(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<api::SetTimeoutRequest>,
) -> ApiResult<Json<api::Sandbox>> {
    let lease = Lease { idle_ttl_s: req.ttl_running_stop, lifetime_s: req.lifetime_s };
    let rec = st.nodes.owner(&id)?.set_lease(&caller, &id, lease)?;
    Ok(Json(convert::sandbox_out(rec)))
}
