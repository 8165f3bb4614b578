//! Who an envd call is for: the sandbox named in `E2b-Sandbox-Id`, proven
//! by its `X-Access-Token`, acting as the sandbox's own tenant; and
//! `GET /health`.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use dsec_edge::{Caller, Edge};

use super::error::{Code, RpcError, RpcResult};
use super::view;
use super::{E2bState, Owner};
use crate::convert;

pub const SANDBOX_HEADER: &str = "e2b-sandbox-id";
pub const TOKEN_HEADER: &str = "x-access-token";

/// An envd call's sandbox, on a local edge.
pub struct Target<'a> {
    pub edge: &'a Edge,
    pub id: String,
    /// The sandbox's tenant: what every edge call is made as.
    pub caller: Caller,
}

/// Why an envd call has no sandbox.
pub enum Refusal {
    /// No such sandbox, or it ended: what envd's proxy answers with 502.
    Gone(String),
    Denied(RpcError),
}

impl From<Refusal> for RpcError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Gone(m) => RpcError::new(Code::Unavailable, m),
            Refusal::Denied(e) => e,
        }
    }
}

/// The sandbox a call names, if its token is right.
pub fn target<'a>(st: &'a E2bState, headers: &HeaderMap) -> Result<Target<'a>, Refusal> {
    let id = headers
        .get(SANDBOX_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Refusal::Denied(RpcError::invalid("missing header E2b-Sandbox-Id")))?
        .to_string();
    let gone = || Refusal::Gone(format!("sandbox {id} not found"));
    let edge = match st.owner(&id) {
        Owner::Local(e) => e,
        Owner::Remote(node) => return Err(Refusal::Denied(RpcError::new(Code::Unimplemented, super::remote_message(&id, &node)))),
        Owner::Unknown => return Err(gone()),
    };
    // Looked up as the node itself: the token, not a tenant's key, is the
    // credential here.
    let node = Caller { tenant: String::new(), admin: true };
    let rec = edge.get(&node, &id).map_err(|_| gone())?;
    let s = convert::sandbox_out(rec.clone());
    if view::state(s.state).is_none() {
        return Err(gone());
    }
    let given = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
    let want = rec.spec.labels.get(view::TOKEN_LABEL).map(String::as_str).unwrap_or("");
    if want.is_empty() || !same(given.as_bytes(), want.as_bytes()) {
        return Err(Refusal::Denied(RpcError::new(Code::Unauthenticated, "missing or wrong X-Access-Token for this sandbox")));
    }
    Ok(Target { edge, id, caller: Caller { tenant: rec.tenant, admin: false } })
}

/// Constant-time comparison of two secrets.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The user envd runs a call as: `Authorization: Basic base64(user:)`;
/// `None` (no header): the sandbox's default user.
pub fn user(headers: &HeaderMap) -> RpcResult<Option<String>> {
    let Some(v) = headers.get(axum::http::header::AUTHORIZATION) else { return Ok(None) };
    let v = v.to_str().map_err(|_| RpcError::invalid("Authorization must be visible ASCII"))?;
    let Some(b64) = v.strip_prefix("Basic ") else { return Ok(None) };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| RpcError::invalid("Authorization: Basic must hold base64"))?;
    let s = String::from_utf8(raw).map_err(|_| RpcError::invalid("the user name must be UTF-8"))?;
    let name = s.split_once(':').map_or(s.as_str(), |(u, _)| u);
    Ok((!name.is_empty()).then(|| name.to_string()))
}

/// `GET /health`: 204 while the sandbox lives, 502 once it is gone (what
/// the SDK's `is_running` reads).
pub async fn health(State(st): State<E2bState>, headers: HeaderMap) -> axum::response::Response {
    use axum::response::IntoResponse;
    match target(&st, &headers) {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(Refusal::Gone(m)) => (StatusCode::BAD_GATEWAY, axum::Json(serde_json::json!({"code": 502, "message": m}))).into_response(),
        Err(Refusal::Denied(e)) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_comes_from_basic_auth() {
        let mut h = HeaderMap::new();
        assert_eq!(user(&h).unwrap(), None);
        h.insert("authorization", "Basic cm9vdDo=".parse().unwrap());
        assert_eq!(user(&h).unwrap().as_deref(), Some("root"));
        h.insert("authorization", "Basic !!".parse().unwrap());
        assert!(user(&h).is_err());
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"ab", b"abc"));
    }
}
