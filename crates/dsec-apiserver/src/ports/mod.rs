//! A sandbox's TCP ports reached from outside: any HTTP request (or
//! WebSocket session) under `/v1/sandboxes/{id}/ports/{port}/...`, or to
//! the host `PORT-ID.DOMAIN` when the API serves a sandbox domain, goes to
//! `port` on the sandbox's own loopback. Authorized by the bearer token or
//! by a signed URL (`POST /v1/sandboxes/{id}/expose`); or a plain TCP port
//! of the node (`POST /v1/sandboxes/{id}/forwards`, `tcp`). Details:
//! docs/api.md, "Ports".

pub mod forward;
pub mod host;
pub mod signed;
pub mod tcp;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use dsec_api as api;
use dsec_api::ErrorCode;
use dsec_edge::Caller;

use crate::auth::{Auth, ADMIN_HEADER, TENANT_HEADER};
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::nodes::NodeRef;
use crate::state::AppState;

/// How long a signed URL lives unless asked otherwise.
const DEFAULT_TTL_S: u64 = 3600;

/// The proxy's path for `port` of sandbox `id`.
pub fn path_of(id: &str, port: u16) -> String {
    format!("/v1/sandboxes/{id}/ports/{port}")
}

/// `(id, port, rest)` of a path under `/v1/sandboxes/{id}/ports/{port}`;
/// `rest` is what the sandbox's server sees (at least `/`).
pub fn parse_path(path: &str) -> Option<(&str, &str, &str)> {
    let rest = path.strip_prefix("/v1/sandboxes/")?;
    let (id, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("ports/")?;
    let (port, rest) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    Some((id, port, rest))
}

fn port_number(s: &str) -> Result<u16, ApiError> {
    match s.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(ApiError::invalid(format!("{s:?} is not a TCP port (1-65535)"))),
    }
}

/// Any request (any method; a WebSocket upgrade too) to `port` inside the
/// sandbox, as `/{path}` with its query: the answer is the sandbox
/// server's, streamed. Authorized by the bearer token (not passed on) or
/// by the signed query of `POST /v1/sandboxes/{id}/expose`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports/{port}/{path}", tag = "ports",
    params(("id" = String, Path), ("port" = u16, Path), ("path" = String, Path, description = "the path the sandbox's server sees")),
    responses((status = 200, description = "whatever the sandbox's server answers"),
        (status = 502, description = "nothing listens on the port (`port_closed`)", body = api::ErrorBody),
        (status = "4XX", body = api::ErrorBody)))]
pub async fn proxy(State(st): State<AppState>, req: Request<Body>) -> Response {
    let path = req.uri().path().to_string();
    let Some((id, port, rest)) = parse_path(&path) else {
        return ApiError::new(ErrorCode::NotFound, "no such route").into_response();
    };
    let port = match port_number(port) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    serve(&st, id, port, rest, req).await.unwrap_or_else(IntoResponse::into_response)
}

/// Sends `req` to `port` of sandbox `id` as a request for `sandbox_path`
/// (the request's own query kept, the signature's parameters removed).
pub async fn serve(st: &AppState, id: &str, port: u16, sandbox_path: &str, req: Request<Body>) -> ApiResult<Response> {
    let (caller, signed) = caller(st, id, port, req.headers(), req.uri().query()).await?;
    serve_as(st, &caller, signed, id, port, sandbox_path, req).await
}

/// Any request to the port a signed path token names (`base_url` of
/// `POST /v1/sandboxes/{id}/expose`), as `/{path}` with its query; no
/// other credentials needed until the token expires.
#[utoipa::path(get, path = "/v1/port-urls/{token}/{path}", tag = "ports", security(()),
    params(("token" = String, Path), ("path" = String, Path, description = "the path the sandbox's server sees")),
    responses((status = 200, description = "whatever the sandbox's server answers"),
        (status = 502, description = "nothing listens on the port (`port_closed`)", body = api::ErrorBody),
        (status = "4XX", body = api::ErrorBody)))]
///
/// The handler of `/v1/port-urls/{token}/{path}`: the token (a signed URL
/// in the path, for clients that append their own paths to a base URL)
/// names the sandbox and port and authorizes the request.
pub async fn proxy_by_token(State(st): State<AppState>, req: Request<Body>) -> Response {
    let path = req.uri().path().to_string();
    let Some(rest) = path.strip_prefix("/v1/port-urls/") else {
        return ApiError::new(ErrorCode::NotFound, "no such route").into_response();
    };
    let (token, sandbox_path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let verified = match st.auth.tokens() {
        Some(t) => t.url_signer().verify_token(token, now_s()),
        None => Err(ApiError::invalid("this server does not check port URLs: ask the apiserver")),
    };
    match verified {
        Ok((id, port, caller)) => {
            serve_as(&st, &caller, true, &id, port, sandbox_path, req).await.unwrap_or_else(IntoResponse::into_response)
        }
        Err(e) => e.into_response(),
    }
}

async fn serve_as(
    st: &AppState,
    caller: &Caller,
    signed: bool,
    id: &str,
    port: u16,
    sandbox_path: &str,
    mut req: Request<Body>,
) -> ApiResult<Response> {
    let query = req.uri().query().map(str::to_string);
    let headers = req.headers_mut();
    // The platform's credentials never reach the sandbox; a request that a
    // signed URL authorized keeps its own Authorization header.
    if !signed {
        headers.remove(header::AUTHORIZATION);
    }
    headers.remove(TENANT_HEADER);
    headers.remove(ADMIN_HEADER);
    let query = query.as_deref().and_then(signed::strip);
    let target = |path: &str| -> Result<Uri, ApiError> {
        let pq = match &query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        };
        pq.parse().map_err(|e| ApiError::invalid(format!("bad path {pq:?}: {e}")))
    };
    match st.nodes.node_of(id)? {
        NodeRef::Local(edge) => {
            *req.uri_mut() = target(sandbox_path)?;
            let conn = edge.connect_port(caller, id, port).await?;
            forward::exchange(conn, req).await
        }
        NodeRef::Remote(remote) => {
            *req.uri_mut() = target(&format!("{}{sandbox_path}", path_of(id, port)))?;
            remote.forward(caller, req).await
        }
    }
}

/// Who a port request comes from, and whether a signed URL says so (else
/// the bearer token).
async fn caller(st: &AppState, id: &str, port: u16, headers: &HeaderMap, query: Option<&str>) -> Result<(Caller, bool), ApiError> {
    if let (Some(q), Some(tokens)) = (query, st.auth.tokens()) {
        if let Some(c) = tokens.url_signer().verify(id, port, q, now_s())? {
            return Ok((c, true));
        }
    }
    Ok((st.auth.authenticate(headers).await?, false))
}

fn now_s() -> u64 {
    dsec_edge::model::now_ms() / 1000
}

/// A URL for one port of a sandbox, signed so that it works without a
/// token until it expires.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/expose", tag = "ports",
    params(("id" = String, Path)), request_body = api::ExposeRequest,
    responses((status = 200, body = api::ExposedPort), (status = "4XX", body = api::ErrorBody)))]
pub async fn expose(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<api::ExposeRequest>,
) -> ApiResult<Json<api::ExposedPort>> {
    let port = port_number(&req.port.to_string())?;
    let ttl = req.ttl_s.unwrap_or(DEFAULT_TTL_S);
    if ttl == 0 || ttl > signed::MAX_TTL_S {
        return Err(ApiError::invalid(format!("ttl_s must be 1-{} seconds", signed::MAX_TTL_S)));
    }
    // A sandbox of this node must exist and be the caller's; a remote
    // node's edge checks at the first request (the URL names the tenant).
    if let NodeRef::Local(edge) = st.nodes.node_of(&id)? {
        edge.get(&caller, &id)?;
    }
    let Some(tokens) = st.auth.tokens() else {
        return Err(ApiError::invalid("this server does not sign port URLs: ask the apiserver"));
    };
    let expires_at = now_s() + ttl;
    let path = path_of(&id, port);
    let query = tokens.url_signer().query(&id, port, &caller.tenant, expires_at);
    let authority = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    let scheme = headers.get("x-forwarded-proto").and_then(|h| h.to_str().ok()).unwrap_or("http");
    let url = format!("{scheme}://{authority}{path}/?{query}");
    let token = tokens.url_signer().path_token(&id, port, &caller.tenant, expires_at);
    let base_url = format!("{scheme}://{authority}/v1/port-urls/{token}");
    let host = st.sandbox_domain.as_deref().map(|d| host::name_of(&id, port, d));
    Ok(Json(api::ExposedPort { port, path, url, base_url, expires_at, host }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_sandbox_port_and_what_the_server_sees() {
        assert_eq!(parse_path("/v1/sandboxes/n1.abc/ports/8000"), Some(("n1.abc", "8000", "/")));
        assert_eq!(parse_path("/v1/sandboxes/n1.abc/ports/8000/"), Some(("n1.abc", "8000", "/")));
        assert_eq!(parse_path("/v1/sandboxes/n1.abc/ports/80/a/b%20c"), Some(("n1.abc", "80", "/a/b%20c")));
        assert_eq!(parse_path("/v1/sandboxes/n1.abc/files"), None);
        assert!(port_number("0").is_err() && port_number("65536").is_err() && port_number("x").is_err());
        assert_eq!(port_number("65535").unwrap(), 65535);
    }
}
