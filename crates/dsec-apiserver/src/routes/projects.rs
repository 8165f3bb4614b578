//! `/v1/projects`: create, list, show (with usage against each limit),
//! set the quota of, and delete projects. The rules are in `iam`.

use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use dsec_api::{self as api, ErrorCode};
use dsec_edge::model::now_ms;
use dsec_store::projects::check_path;
use dsec_store::{Limit, Principal, Quota, Store};

use crate::auth::TokenStore;
use crate::convert::rfc3339;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::iam::{quota_in, quota_out, store_error, Holder};
use crate::state::AppState;

fn tokens(st: &AppState) -> ApiResult<&TokenStore> {
    st.auth.tokens().ok_or_else(|| ApiError::new(ErrorCode::NotFound, "projects are managed by the apiserver, not by an edge"))
}

fn unknown(path: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("no project {path:?}"))
}

fn info(p: Principal, quota: Option<Quota>) -> api::ProjectInfo {
    api::ProjectInfo {
        name: p.name,
        parent: p.parent,
        created_at: rfc3339(p.created_at_ms),
        overcommitted: quota.is_some_and(|q| q.overcommit),
        quota: quota.as_ref().map(quota_out),
        usage: vec![],
    }
}

/// A limit in the unit the API shows it in (cores for CPU).
fn shown(l: Limit, v: f64) -> f64 {
    if l == Limit::CpuMillis {
        v / 1000.0
    } else {
        v
    }
}

/// Create a project (`name` is its path; its parent must exist), with a
/// quota at most its parent's free share unless `overcommit`.
#[utoipa::path(post, path = "/v1/projects", tag = "projects", request_body = api::CreateProjectRequest,
    responses((status = 201, body = api::ProjectInfo), (status = "4XX", body = api::ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    holder: Holder,
    ApiJson(req): ApiJson<api::CreateProjectRequest>,
) -> ApiResult<(StatusCode, Json<api::ProjectInfo>)> {
    let tokens = tokens(&st)?;
    check_path(&req.name).map_err(|e| ApiError::invalid(e.to_string()))?;
    holder.administers(&req.name)?;
    let quota = req.quota.as_ref().map(quota_in).transpose()?;
    let project = Principal::project(&req.name, now_ms());
    tokens.store().create_principal(&project, None).await.map_err(store_error)?;
    if let Some(q) = quota {
        if let Err(e) = tokens.store().set_quota(&project.name, Some(q)).await {
            // No project is left behind without the quota it was asked with.
            if let Err(d) = tokens.store().delete_principal(&project.name, now_ms()).await {
                tracing::warn!(project = %project.name, error = %d, "could not remove a project whose quota was refused");
            }
            return Err(store_error(e));
        }
        tokens.ledger().set_limits(&project.name, Some(q));
    }
    Ok((StatusCode::CREATED, Json(info(project, quota))))
}

/// The projects the token reaches (its own and those below it).
#[utoipa::path(get, path = "/v1/projects", tag = "projects", responses((status = 200, body = api::ProjectList)))]
pub async fn list(State(st): State<AppState>, holder: Holder) -> ApiResult<Json<api::ProjectList>> {
    let tokens = tokens(&st)?;
    let quotas: std::collections::HashMap<String, Quota> = tokens.store().quotas().await?.into_iter().collect();
    let projects = tokens
        .store()
        .principals()
        .await?
        .into_iter()
        .filter(|p| holder.reaches(&p.name))
        .map(|p| {
            let q = quotas.get(&p.name).copied();
            info(p, q)
        })
        .collect();
    Ok(Json(api::ProjectList { projects }))
}

/// A project with its use of each limit (itself and everything below it)
/// and what its sub-projects were given.
#[utoipa::path(get, path = "/v1/projects/{path}", tag = "projects", params(("path" = String, Path)),
    responses((status = 200, body = api::ProjectInfo), (status = 404, body = api::ErrorBody)))]
pub async fn show(State(st): State<AppState>, holder: Holder, Path(path): Path<String>) -> ApiResult<Json<api::ProjectInfo>> {
    let tokens = tokens(&st)?;
    if !holder.reaches(&path) {
        return Err(unknown(&path));
    }
    let Some(p) = tokens.store().principal(&path).await? else { return Err(unknown(&path)) };
    let quotas = tokens.store().quotas().await?;
    let own = quotas.iter().find(|(n, _)| *n == path).map(|(_, q)| *q);
    let children: Vec<&Quota> =
        quotas.iter().filter(|(n, _)| n.rsplit_once('/').is_some_and(|(parent, _)| parent == path)).map(|(_, q)| q).collect();
    let used = tokens.ledger().usage(&path, Instant::now());
    let mut overcommitted = own.is_some_and(|q| q.overcommit);
    let usage = used
        .into_iter()
        .map(|(l, used)| {
            let allocated: u64 = children.iter().filter_map(|q| q.get(l)).fold(0, u64::saturating_add);
            let limit = own.and_then(|q| q.get(l));
            overcommitted |= limit.is_some_and(|max| allocated > max);
            api::LimitUsage {
                name: l.name().to_string(),
                limit: limit.map(|v| shown(l, v as f64)),
                used: shown(l, used),
                allocated: shown(l, allocated as f64),
            }
        })
        .collect();
    let mut out = info(p, own);
    out.usage = usage;
    out.overcommitted = overcommitted;
    Ok(Json(out))
}

/// Set (or, with `null`, remove) a project's quota.
#[utoipa::path(patch, path = "/v1/projects/{path}", tag = "projects", params(("path" = String, Path)), request_body = api::UpdateProjectRequest,
    responses((status = 200, body = api::ProjectInfo), (status = "4XX", body = api::ErrorBody)))]
pub async fn update(
    State(st): State<AppState>,
    holder: Holder,
    Path(path): Path<String>,
    ApiJson(req): ApiJson<api::UpdateProjectRequest>,
) -> ApiResult<Json<api::ProjectInfo>> {
    let tokens = tokens(&st)?;
    if !holder.reaches(&path) {
        return Err(unknown(&path));
    }
    holder.administers(&path)?;
    let quota = req.quota.as_ref().map(quota_in).transpose()?;
    let Some(p) = tokens.store().principal(&path).await? else { return Err(unknown(&path)) };
    tokens.store().set_quota(&path, quota).await.map_err(store_error)?;
    tokens.ledger().set_limits(&path, quota);
    Ok(Json(info(p, quota)))
}

/// Delete a project that has no sub-projects and no live sandboxes; its
/// tokens, and every token they issued, stop working.
#[utoipa::path(delete, path = "/v1/projects/{path}", tag = "projects", params(("path" = String, Path)),
    responses((status = 204), (status = "4XX", body = api::ErrorBody)))]
pub async fn delete(State(st): State<AppState>, holder: Holder, Path(path): Path<String>) -> ApiResult<StatusCode> {
    let tokens = tokens(&st)?;
    if !holder.reaches(&path) {
        return Err(unknown(&path));
    }
    holder.administers(&path)?;
    if path == crate::auth::ADMIN_TENANT {
        return Err(ApiError::new(ErrorCode::Forbidden, "the platform's admin project cannot be deleted"));
    }
    let live = tokens.ledger().holds(&path).sandboxes;
    if live > 0 {
        return Err(ApiError::new(ErrorCode::ProjectNotEmpty, format!("project {path:?} has {live} live sandboxes: delete them first")));
    }
    if !tokens.store().delete_principal(&path, now_ms()).await.map_err(store_error)? {
        return Err(unknown(&path));
    }
    tokens.ledger().set_limits(&path, None);
    Ok(StatusCode::NO_CONTENT)
}
