//! `POST /v1/sandboxes/{id}/forwards`: a port of a sandbox published as a
//! plain `HOST:PORT` of its node (the edge's `forward_port`). A sandbox of
//! another node never reaches this handler: the proxy layer sends the
//! request to its edge, which answers with its own address.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::Json;
use dsec_api as api;
use dsec_edge::SourcePrefix;

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::state::AppState;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/forwards", tag = "ports",
    params(("id" = String, Path)), request_body = api::CreateForwardRequest,
    responses((status = 201, body = api::TcpForward), (status = "4XX", body = api::ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<api::CreateForwardRequest>,
) -> ApiResult<(StatusCode, Json<api::TcpForward>)> {
    let allow: Vec<SourcePrefix> = req
        .allow_from
        .iter()
        .map(|s| s.parse().map_err(|e: String| ApiError::invalid(format!("allow_from: {e}"))))
        .collect::<Result<_, _>>()?;
    let edge = st.nodes.owner(&id)?;
    let fwd = edge.forward_port(&caller, &id, req.port, req.ttl_s, allow).await?;
    // A forward on a wildcard address is reached at the host the caller
    // reached this API by.
    let host = if fwd.address.ip().is_unspecified() {
        let authority = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
        super::host::without_port(authority).to_string()
    } else {
        fwd.address.ip().to_string()
    };
    let address = if host.contains(':') { format!("[{host}]:{}", fwd.address.port()) } else { format!("{host}:{}", fwd.address.port()) };
    Ok((
        StatusCode::CREATED,
        Json(api::TcpForward {
            port: req.port,
            address,
            host,
            node_port: fwd.address.port(),
            expires_at: fwd.expires_at_ms / 1000,
            allow_from: req.allow_from,
        }),
    ))
}
