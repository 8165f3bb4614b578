//! Cluster membership: join tokens, edges joining, drain and departure.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use dsec_api::{self as api, ErrorCode};
use dsec_edge::model::now_ms;
use dsec_store::{ClusterStore, Membership as StoredMembership, NewToken, NodeRecord, NodeState, Store};

use crate::auth::{hash, new_token, Admin, TokenStore};
use crate::cluster_tls::ClusterTls;
use crate::convert::rfc3339;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::registry;
use crate::state::AppState;

const BACKENDS: &[&str] = &["container", "microvm", "vm"];

fn store_of(st: &AppState) -> Result<&TokenStore, ApiError> {
    st.auth.tokens().ok_or_else(|| ApiError::new(ErrorCode::NotFound, "the node registry is the apiserver's, not an edge's"))
}

/// Make a join token: edges that present it may join the cluster.
#[utoipa::path(post, path = "/v1/cluster/join-tokens", tag = "admin", request_body = api::CreateJoinTokenRequest,
    responses((status = 201, body = api::JoinTokenInfo), (status = 403, body = api::ErrorBody)))]
pub async fn create_join_token(
    State(st): State<AppState>,
    Admin(_admin): Admin,
    ApiJson(req): ApiJson<api::CreateJoinTokenRequest>,
) -> ApiResult<(StatusCode, Json<api::JoinTokenInfo>)> {
    let tokens = store_of(&st)?;
    let token = new_token();
    let now = now_ms();
    let expires_at_ms = req.ttl_s.map(|s| now.saturating_add(s.saturating_mul(1000)));
    tokens.store().add_join_token(NewToken { hash: hash(&token), created_at_ms: now, expires_at_ms }).await?;
    Ok((StatusCode::CREATED, Json(api::JoinTokenInfo { token, expires_at: expires_at_ms.map(rfc3339) })))
}

/// How long the join waits for the edge's TLS handshake.
const JOIN_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn check_join(req: &api::JoinRequest, tls: &ClusterTls) -> Result<(), ApiError> {
    dsec_edge::ids::validate_node_name(&req.name).map_err(ApiError::invalid)?;
    tls.check_url("edge", &req.url).map_err(ApiError::invalid)?;
    if req.secret.trim().is_empty() || req.secret.len() > 512 {
        return Err(ApiError::invalid("the edge's secret must be 1-512 characters"));
    }
    if let Some(b) = req.backends.iter().find(|b| !BACKENDS.contains(&b.as_str())) {
        return Err(ApiError::invalid(format!("unknown backend {b:?} (known: {})", BACKENDS.join(", "))));
    }
    if !req.backends.iter().any(|b| b == "container") {
        return Err(ApiError::invalid("every node runs the container backend"));
    }
    if !(req.capacity.cpu_cores.is_finite() && req.capacity.cpu_cores > 0.0) || req.capacity.memory_mb == 0 {
        return Err(ApiError::invalid("capacity needs cpu_cores > 0 and memory_mb > 0"));
    }
    if req.labels.len() > 64 || req.labels.iter().any(|(k, v)| k.is_empty() || k.len() > 63 || v.len() > 255) {
        return Err(ApiError::invalid("labels: at most 64, keys 1-63 characters, values up to 255"));
    }
    Ok(())
}

/// An edge joins (or, restarted, joins again). Authenticated by a join
/// token, not a user token.
#[utoipa::path(post, path = "/v1/cluster/join", tag = "admin", request_body = api::JoinRequest, security(()),
    responses((status = 200, body = api::JoinAnswer), (status = 400, body = api::ErrorBody), (status = 401, body = api::ErrorBody),
        (status = 404, body = api::ErrorBody, description = "this server takes no edges (dsec up)"), (status = 409, body = api::ErrorBody)))]
pub async fn join(
    State(st): State<AppState>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<api::JoinRequest>,
) -> ApiResult<Json<api::JoinAnswer>> {
    let tokens = store_of(&st)?;
    if !st.nodes.follows_registry() {
        return Err(ApiError::new(ErrorCode::NotFound, "this server does not take edges (dsec up is one node); run dsec apiserver"));
    }
    let bearer = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|h| h.strip_prefix("Bearer "));
    let Some(token) = bearer.map(str::trim) else {
        return Err(ApiError::new(ErrorCode::JoinRefused, "missing 'Authorization: Bearer JOIN_TOKEN' header"));
    };
    if !tokens.store().join_token_live(&hash(token), now_ms()).await? {
        tracing::warn!(node = %req.name, "join refused: unknown, revoked or expired join token");
        return Err(ApiError::new(ErrorCode::JoinRefused, "the join token is unknown, revoked or expired"));
    }
    check_join(&req, st.nodes.tls())?;
    // In a cluster with a CA, the edge must hold a certificate of it for
    // the address it registers: a join token alone does not let a host
    // take requests (and the cluster secret they carry) for a node.
    if let Err(e) = st.nodes.tls().verify_peer(&req.url, JOIN_HANDSHAKE_TIMEOUT).await {
        tracing::warn!(node = %req.name, url = %req.url, error = %e, "join refused: the edge's certificate does not check");
        return Err(ApiError::new(
            ErrorCode::JoinRefused,
            format!("the edge at {} does not present a certificate of this cluster's CA for that address: {e}", req.url),
        ));
    }
    if st.nodes.local_edges().any(|e| e.node() == req.name) {
        return Err(ApiError::new(ErrorCode::AlreadyExists, format!("node {} is this server's own", req.name)));
    }
    if let Some(r) = st.nodes.remote_named(&req.name) {
        if !r.membership().joined {
            return Err(ApiError::new(ErrorCode::AlreadyExists, format!("node {} is already configured with --edge", req.name)));
        }
    }
    let now = now_ms();
    let record = NodeRecord {
        name: req.name.clone(),
        url: req.url.trim_end_matches('/').to_string(),
        labels: req.labels.clone(),
        backends: req.backends.clone(),
        pool: req.pool.clone(),
        state: NodeState::Active,
        last_seen_ms: Some(now),
        registered_at_ms: now,
    };
    let membership = StoredMembership {
        secret: req.secret.clone(),
        cpu_millis: (req.capacity.cpu_cores * 1000.0).round() as u64,
        memory_mb: req.capacity.memory_mb,
        max_sandboxes: req.capacity.max_sandboxes,
    };
    let rejoined = tokens.store().join_node(&record, &membership).await?;
    tracing::info!(node = %req.name, url = %req.url, backends = ?req.backends, rejoined, "edge joined");
    // This replica knows at once (and probes it); the others on their
    // next registry read.
    registry::sync_once(&st.nodes, tokens.store()).await?;
    Ok(Json(api::JoinAnswer { node: req.name, rejoined }))
}

async fn set_state(st: &AppState, node: &str, state: NodeState) -> ApiResult<StatusCode> {
    let tokens = store_of(st)?;
    if !tokens.store().set_node_state(node, state).await? {
        return Err(ApiError::new(ErrorCode::NodeNotFound, format!("node {node} is not in the node registry")));
    }
    registry::sync_once(&st.nodes, tokens.store()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Stop placing new sandboxes on a node; what runs there goes on.
#[utoipa::path(post, path = "/v1/nodes/{node}/drain", tag = "admin", params(("node" = String, Path)),
    responses((status = 204), (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
pub async fn drain(State(st): State<AppState>, Admin(_admin): Admin, Path(node): Path<String>) -> ApiResult<StatusCode> {
    set_state(&st, &node, NodeState::Draining).await
}

/// Place new sandboxes on a drained node again.
#[utoipa::path(post, path = "/v1/nodes/{node}/undrain", tag = "admin", params(("node" = String, Path)),
    responses((status = 204), (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
pub async fn undrain(State(st): State<AppState>, Admin(_admin): Admin, Path(node): Path<String>) -> ApiResult<StatusCode> {
    set_state(&st, &node, NodeState::Active).await
}

/// Remove a node from the registry (it left). Its sandboxes are no longer
/// routed to; an edge that joins again under the name is a member again.
#[utoipa::path(delete, path = "/v1/nodes/{node}", tag = "admin", params(("node" = String, Path)),
    responses((status = 204), (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
pub async fn remove(State(st): State<AppState>, Admin(_admin): Admin, Path(node): Path<String>) -> ApiResult<StatusCode> {
    let tokens = store_of(&st)?;
    if !tokens.store().remove_node(&node).await? {
        return Err(ApiError::new(ErrorCode::NodeNotFound, format!("node {node} is not in the node registry")));
    }
    registry::sync_once(&st.nodes, tokens.store()).await?;
    Ok(StatusCode::NO_CONTENT)
}
