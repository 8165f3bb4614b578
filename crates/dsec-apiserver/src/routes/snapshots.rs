//! MicroVM disk snapshots: take one, list them, delete one. Sandboxes
//! start from one with `snapshot` in their creation request.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use dsec_api as api;

use crate::auth::Auth;
use crate::convert;
use crate::error::ApiResult;
use crate::extract::{ApiJson, IdempotencyKey};
use crate::state::AppState;

/// Snapshot a microVM's writable disk as `name` (running: its guest syncs
/// and its vCPUs stop for the copy; suspended: as it lies, without
/// resuming it). The snapshot holds only what this sandbox wrote and
/// chains onto the snapshot it started from. With `memory`, a microVM is
/// suspended first and its RAM and device state are kept as well: its
/// sandboxes continue its processes. With an `Idempotency-Key`
/// header, a retry returns the first snapshot (`created: false`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshot", tag = "images",
    params(("id" = String, Path), ("idempotency-key" = Option<String>, Header)), request_body = api::SnapshotRequest,
    responses((status = 200, body = api::Snapshot), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn take(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    IdempotencyKey(key): IdempotencyKey,
    ApiJson(req): ApiJson<api::SnapshotRequest>,
) -> ApiResult<Json<api::Snapshot>> {
    let o = st.nodes.owner(&id)?.snapshot_with(&caller, &id, &req.name, key.as_deref(), req.memory).await?;
    Ok(Json(convert::snapshot_out(o.snapshot, o.created, o.frozen_ms)))
}

/// The snapshots this token sees (on this server's local nodes).
#[utoipa::path(get, path = "/v1/snapshots", tag = "images",
    responses((status = 200, body = api::SnapshotList)))]
pub async fn list(State(st): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<api::SnapshotList>> {
    let snapshots = st.nodes.local_edges().flat_map(|e| e.snapshots(&caller)).map(|m| convert::snapshot_out(m, true, 0.0)).collect();
    Ok(Json(api::SnapshotList { snapshots }))
}

/// Delete one of the caller's snapshots. Refused with 409
/// `snapshot_in_use` while a snapshot chains onto it or a sandbox started
/// from it is not yet stopped (its layer backs their disks).
#[utoipa::path(delete, path = "/v1/snapshots/{name}", tag = "images", params(("name" = String, Path)),
    responses((status = 204), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn delete(State(st): State<AppState>, Auth(caller): Auth, Path(name): Path<String>) -> ApiResult<StatusCode> {
    let mut last = None;
    for edge in st.nodes.local_edges() {
        match edge.delete_snapshot(&caller, &name) {
            Ok(_) => return Ok(StatusCode::NO_CONTENT),
            Err(e @ dsec_edge::EdgeError::SnapshotNotFound(_)) => last = Some(e),
            Err(e) => return Err(e.into()),
        }
    }
    Err(last.unwrap_or(dsec_edge::EdgeError::SnapshotNotFound(name)).into())
}
