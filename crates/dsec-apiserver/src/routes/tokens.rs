//! `/v1/tokens`: issue (the secret is in that answer only), list (never
//! the secret) and revoke scoped tokens. The rules are in `iam`.

use std::collections::{HashMap, HashSet};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use dsec_api::{self as api, ErrorCode};
use dsec_edge::model::now_ms;
use dsec_store::projects::token_id;
use dsec_store::{NewToken, Role, Store, TokenHash, TokenInfo};

use crate::auth::{hash, new_token, TokenStore};
use crate::convert::rfc3339;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::iam::{store_error, Holder};
use crate::state::AppState;

/// The longest lifetime asked for explicitly: ten years.
const MAX_TTL_S: i64 = 10 * 365 * 86_400;

fn tokens(st: &AppState) -> ApiResult<&TokenStore> {
    st.auth.tokens().ok_or_else(|| ApiError::new(ErrorCode::NotFound, "tokens are managed by the apiserver, not by an edge"))
}

fn out(t: &TokenInfo, secret: Option<String>) -> api::TokenInfo {
    api::TokenInfo {
        id: token_id(&t.hash),
        project: t.principal.clone(),
        role: t.role.as_str().to_string(),
        created_at: rfc3339(t.created_at_ms),
        expires_at: t.expires_at_ms.map(rfc3339),
        revoked_at: t.revoked_at_ms.map(rfc3339),
        issuer: t.issuer.as_ref().map(token_id),
        token: secret,
    }
}

/// The tokens `holder` may see and revoke: with an admin token, every
/// token of its project and those below; otherwise itself and what it
/// issued (and so on down).
fn visible(holder: &Holder, all: Vec<TokenInfo>) -> Vec<TokenInfo> {
    if holder.role().administers() {
        return all.into_iter().filter(|t| holder.reaches(&t.principal)).collect();
    }
    let mut children: HashMap<TokenHash, Vec<TokenHash>> = HashMap::new();
    for t in &all {
        if let Some(i) = t.issuer {
            children.entry(i).or_default().push(t.hash);
        }
    }
    let mut keep: HashSet<TokenHash> = HashSet::new();
    let mut frontier = vec![holder.hash];
    while let Some(h) = frontier.pop() {
        if keep.insert(h) {
            frontier.extend(children.get(&h).into_iter().flatten().copied());
        }
    }
    all.into_iter().filter(|t| keep.contains(&t.hash)).collect()
}

/// Issue a token for a project the caller reaches, of a role it may grant
/// (default: its own), expiring no later than the caller's own token.
#[utoipa::path(post, path = "/v1/tokens", tag = "projects", request_body = api::CreateTokenRequest,
    responses((status = 201, body = api::TokenInfo), (status = "4XX", body = api::ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    holder: Holder,
    ApiJson(req): ApiJson<api::CreateTokenRequest>,
) -> ApiResult<(StatusCode, Json<api::TokenInfo>)> {
    let tokens = tokens(&st)?;
    let role = match req.role.as_deref() {
        None => holder.role(),
        Some(r) => Role::parse(r).ok_or_else(|| ApiError::invalid(format!("unknown role {r:?}: expected admin, builder or solver")))?,
    };
    if !holder.reaches(&req.project) {
        return Err(ApiError::new(ErrorCode::NotFound, format!("no project {:?}", req.project)));
    }
    if !holder.role().may_grant(role) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("a {} token cannot grant the role {}: only what it holds", holder.role().as_str(), role.as_str()),
        ));
    }
    let now = now_ms();
    let expires_at_ms = match req.ttl_s {
        Some(t) if !(1..=MAX_TTL_S).contains(&t) => {
            return Err(ApiError::invalid(format!("ttl_s must be 1 to {MAX_TTL_S} seconds (got {t}); leave it out for no expiry")))
        }
        Some(t) => Some(now.saturating_add((t as u64).saturating_mul(1000))),
        None => None,
    };
    let expires_at_ms = match (expires_at_ms, holder.grant.expires_at_ms) {
        (Some(want), Some(own)) if want > own => {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("the token would outlive the one issuing it (which expires at {})", rfc3339(own)),
            ))
        }
        // A token of an expiring issuer expires with it at the latest.
        (None, own) => own,
        (want, _) => want,
    };
    let secret = new_token();
    let t = NewToken { hash: hash(&secret), created_at_ms: now, expires_at_ms };
    tokens.store().issue_token(&req.project, t, role, Some(holder.hash)).await.map_err(store_error)?;
    let info = TokenInfo {
        hash: t.hash,
        principal: req.project,
        role,
        created_at_ms: now,
        expires_at_ms,
        revoked_at_ms: None,
        issuer: Some(holder.hash),
    };
    Ok((StatusCode::CREATED, Json(out(&info, Some(secret)))))
}

/// The tokens the caller may see (never their secrets).
#[utoipa::path(get, path = "/v1/tokens", tag = "projects", responses((status = 200, body = api::TokenList)))]
pub async fn list(State(st): State<AppState>, holder: Holder) -> ApiResult<Json<api::TokenList>> {
    let all = tokens(&st)?.store().tokens().await?;
    Ok(Json(api::TokenList { tokens: visible(&holder, all).iter().map(|t| out(t, None)).collect() }))
}

/// Revoke a token and every token it issued; at once, on every replica.
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "projects", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = api::ErrorBody)))]
pub async fn revoke(State(st): State<AppState>, holder: Holder, Path(id): Path<String>) -> ApiResult<StatusCode> {
    let tokens = tokens(&st)?;
    let all = tokens.store().tokens().await?;
    let Some(t) = visible(&holder, all).into_iter().find(|t| token_id(&t.hash) == id) else {
        return Err(ApiError::new(ErrorCode::NotFound, format!("no token {id:?}")));
    };
    tokens.store().revoke_token(&t.hash, now_ms()).await?;
    Ok(StatusCode::NO_CONTENT)
}
