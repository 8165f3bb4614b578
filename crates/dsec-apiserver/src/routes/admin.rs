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

#[utoipa::path(get, path = "/healthz", tag = "meta", responses((status = 200, body = api::Health)))]
pub async fn healthz(State(st): State<AppState>) -> Json<api::Health> {
    Json(api::Health { status: "ok".into(), version: env!("CARGO_PKG_VERSION").into(), nodes: st.nodes.status() })
}

/// Create a tenant; the answer carries its token, shown only this once.
#[utoipa::path(post, path = "/v1/tenants", tag = "admin", request_body = api::CreateTenantRequest,
    responses((status = 201, body = api::TenantInfo), (status = 403, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn create_tenant(
    State(st): State<AppState>,
    Admin(_admin): Admin,
    ApiJson(req): ApiJson<api::CreateTenantRequest>,
) -> ApiResult<(StatusCode, Json<api::TenantInfo>)> {
    match st.tokens.create(&req.name) {
        Ok((t, token)) => Ok((
            StatusCode::CREATED,
            Json(api::TenantInfo { name: t.name, admin: t.admin, token: Some(token), created_at: rfc3339(t.created_at_ms) }),
        )),
        Err(e @ AuthError::Exists(_)) => Err(ApiError::new(ErrorCode::AlreadyExists, e.to_string())),
        Err(e @ AuthError::BadName(_)) => Err(ApiError::invalid(e.to_string())),
        Err(e) => Err(ApiError::new(ErrorCode::Internal, e.to_string())),
    }
}

#[utoipa::path(get, path = "/v1/tenants", tag = "admin", responses((status = 200, body = api::TenantList)))]
pub async fn list_tenants(State(st): State<AppState>, Admin(_admin): Admin) -> Json<api::TenantList> {
    let tenants = st
        .tokens
        .list()
        .into_iter()
        .map(|t| api::TenantInfo { name: t.name, admin: t.admin, token: None, created_at: rfc3339(t.created_at_ms) })
        .collect();
    Json(api::TenantList { tenants })
}

#[utoipa::path(get, path = "/v1/images", tag = "images", responses((status = 200, body = api::ImageList)))]
pub async fn list_images(State(st): State<AppState>, Auth(_caller): Auth) -> ApiResult<Json<api::ImageList>> {
    let Some(images) = &st.images else { return Ok(Json(api::ImageList { images: vec![] })) };
    let images = images.list().map_err(|e| ApiError::new(ErrorCode::Internal, e))?;
    Ok(Json(api::ImageList { images }))
}

#[utoipa::path(delete, path = "/v1/images/{name}", tag = "images", params(("name" = String, Path)),
    responses((status = 204), (status = 404, body = api::ErrorBody)))]
pub async fn delete_image(State(st): State<AppState>, Admin(_admin): Admin, Path(name): Path<String>) -> ApiResult<StatusCode> {
    let Some(images) = &st.images else { return Err(ApiError::new(ErrorCode::ImageNotFound, format!("image {name} not found"))) };
    match images.remove(&name) {
        Ok(true) => Ok(StatusCode::NO_CONTENT),
        Ok(false) => Err(ApiError::new(ErrorCode::ImageNotFound, format!("image {name} not found"))),
        Err(e) => Err(ApiError::invalid(e)),
    }
}
