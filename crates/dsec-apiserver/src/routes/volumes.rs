//! Named volumes: create one, list them (with the sandboxes mounting
//! each), remove one. Sandboxes mount them with `volumes` in their
//! creation request. They live on the node's disk of this server's local
//! node (`dsec up`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use dsec_api as api;
use dsec_edge::disk::service::VolumeUse;
use dsec_edge::{Edge, EdgeError};

use crate::auth::Auth;
use crate::convert;
use crate::error::ApiResult;
use crate::extract::ApiJson;
use crate::state::AppState;

fn volume_out(u: VolumeUse) -> api::Volume {
    api::Volume {
        name: u.volume.name,
        size_mb: u.volume.size_mb,
        used_bytes: u.volume.used_bytes,
        created_at: convert::rfc3339(u.volume.created_ms),
        sandboxes: u.sandboxes,
    }
}

fn local_edge(st: &AppState) -> Result<&Edge, EdgeError> {
    st.nodes.local_edges().next().ok_or_else(|| {
        EdgeError::VolumesUnavailable("named volumes live on the node of `dsec up`; this apiserver has no local node".into())
    })
}

/// Make a named volume of the caller's, bounded to `size_mb` (default
/// 1024): a directory on the node's disk that any number of the caller's
/// container sandboxes mount, read-write or read-only, and that outlives
/// them until removed.
#[utoipa::path(post, path = "/v1/volumes", tag = "volumes", request_body = api::CreateVolumeRequest,
    responses((status = 201, body = api::Volume), (status = 400, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    Auth(caller): Auth,
    ApiJson(req): ApiJson<api::CreateVolumeRequest>,
) -> ApiResult<(StatusCode, Json<api::Volume>)> {
    let made = local_edge(&st)?.create_volume(&caller, &req.name, req.size_mb).await?;
    Ok((StatusCode::CREATED, Json(volume_out(made))))
}

/// The caller's named volumes, with their size, use and the sandboxes
/// (not yet stopped) that mount each.
#[utoipa::path(get, path = "/v1/volumes", tag = "volumes",
    responses((status = 200, body = api::VolumeList)))]
pub async fn list(State(st): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<api::VolumeList>> {
    let mut volumes = Vec::new();
    for edge in st.nodes.local_edges() {
        volumes.extend(edge.volumes(&caller).await?.into_iter().map(volume_out));
    }
    Ok(Json(api::VolumeList { volumes }))
}

/// Remove one of the caller's volumes and its files. Refused with 409
/// `volume_in_use` while a sandbox that is not yet stopped mounts it.
#[utoipa::path(delete, path = "/v1/volumes/{name}", tag = "volumes", params(("name" = String, Path)),
    responses((status = 204), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn delete(State(st): State<AppState>, Auth(caller): Auth, Path(name): Path<String>) -> ApiResult<StatusCode> {
    local_edge(&st)?.delete_volume(&caller, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
