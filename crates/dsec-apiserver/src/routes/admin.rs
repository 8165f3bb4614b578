//! Health, tenants and images.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use dsec_api::{self as api, ErrorCode};

use crate::auth::{Admin, Auth, AuthError};
use crate::convert::rfc3339;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::state::AppState;

#[utoipa::path(get, path = "/healthz", tag = "meta", security(()), responses((status = 200, body = api::Health)))]
pub async fn healthz(State(st): State<AppState>) -> Json<api::Health> {
    Json(api::Health { status: "ok".into(), version: env!("CARGO_PKG_VERSION").into(), nodes: st.nodes.status() })
}

/// The nodes behind this API, as the watcher last saw them.
#[utoipa::path(get, path = "/v1/nodes", tag = "admin", responses((status = 200, body = Vec<api::NodeStatus>), (status = 403, body = api::ErrorBody)))]
pub async fn nodes(State(st): State<AppState>, Admin(_admin): Admin) -> Json<Vec<api::NodeStatus>> {
    Json(st.nodes.status())
}

/// Create a tenant; the answer carries its token, shown only this once.
#[utoipa::path(post, path = "/v1/tenants", tag = "admin", request_body = api::CreateTenantRequest,
    responses((status = 201, body = api::TenantInfo), (status = 403, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn create_tenant(
    State(st): State<AppState>,
    Admin(_admin): Admin,
    ApiJson(req): ApiJson<api::CreateTenantRequest>,
) -> ApiResult<(StatusCode, Json<api::TenantInfo>)> {
    let Some(tokens) = st.auth.tokens() else { return Err(not_here()) };
    match tokens.create(&req.name).await {
        Ok((t, token)) => Ok((
            StatusCode::CREATED,
            Json(api::TenantInfo { name: t.name, admin: t.admin, token: Some(token), created_at: rfc3339(t.created_at_ms) }),
        )),
        Err(e @ AuthError::Exists(_)) => Err(ApiError::new(ErrorCode::AlreadyExists, e.to_string())),
        Err(e @ AuthError::BadName(_)) => Err(ApiError::invalid(e.to_string())),
        Err(AuthError::Store(e)) => Err(e.into()),
        Err(e) => Err(ApiError::new(ErrorCode::Internal, e.to_string())),
    }
}

#[utoipa::path(get, path = "/v1/tenants", tag = "admin", responses((status = 200, body = api::TenantList), (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
pub async fn list_tenants(State(st): State<AppState>, Admin(_admin): Admin) -> ApiResult<Json<api::TenantList>> {
    let Some(tokens) = st.auth.tokens() else { return Err(not_here()) };
    let tenants = tokens
        .list()
        .await?
        .into_iter()
        .map(|t| api::TenantInfo { name: t.name, admin: t.admin, token: None, created_at: rfc3339(t.created_at_ms) })
        .collect();
    Ok(Json(api::TenantList { tenants }))
}

/// An edge in a cluster has no tenants: the apiserver owns them.
fn not_here() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "tenants are managed by the apiserver, not by an edge")
}

#[utoipa::path(get, path = "/v1/images", tag = "images", responses((status = 200, body = api::ImageList)))]
pub async fn list_images(State(st): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<api::ImageList>> {
    let Some(images) = &st.images else {
        // An apiserver in front of edges: the edges hold the images.
        return match st.nodes.remotes().into_iter().find(|r| r.status().healthy) {
            Some(r) => Ok(Json(r.images(&caller).await?)),
            None => Ok(Json(api::ImageList { images: vec![] })),
        };
    };
    let images = images.list().map_err(|e| ApiError::new(ErrorCode::Internal, e))?;
    Ok(Json(api::ImageList { images }))
}

#[utoipa::path(delete, path = "/v1/images/{name}", tag = "images", params(("name" = String, Path)),
    responses((status = 204), (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
pub async fn delete_image(State(st): State<AppState>, Admin(_admin): Admin, Path(name): Path<String>) -> ApiResult<StatusCode> {
    let Some(images) = &st.images else { return Err(ApiError::new(ErrorCode::ImageNotFound, format!("image {name} not found"))) };
    match images.remove(&name) {
        Ok(true) => Ok(StatusCode::NO_CONTENT),
        Ok(false) => Err(ApiError::new(ErrorCode::ImageNotFound, format!("image {name} not found"))),
        Err(e) => Err(ApiError::invalid(e)),
    }
}
