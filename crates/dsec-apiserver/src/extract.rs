//! Request extractors that fail with our JSON errors instead of axum's
//! plain-text rejections.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use dsec_api::ErrorCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// `Json<T>` with clear 400 / 415 errors (unknown fields, bad types, bad
/// syntax, wrong content type).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(JsonRejection::MissingJsonContentType(_)) => {
                Err(ApiError::new(ErrorCode::UnsupportedMediaType, "expected a JSON body with Content-Type: application/json"))
            }
            Err(JsonRejection::BytesRejection(e)) => {
                Err(ApiError::new(ErrorCode::PayloadTooLarge, format!("could not read the request body: {e}")))
            }
            Err(e) => Err(ApiError::invalid(e.body_text())),
        }
    }
}

/// The query string as ordered (key, value) pairs; keys may repeat
/// (`?label=a=1&label=b=2`).
pub struct QueryPairs(pub Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for QueryPairs {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let q = parts.uri.query().unwrap_or("");
        Ok(QueryPairs(form_urlencoded::parse(q.as_bytes()).into_owned().collect()))
    }
}

impl QueryPairs {
    /// The pairs encoded again, to forward the query to another node.
    pub fn raw(&self) -> String {
        form_urlencoded::Serializer::new(String::new()).extend_pairs(self.0.iter()).finish()
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0.iter().filter(move |(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn required(&self, key: &str) -> Result<&str, ApiError> {
        self.get(key).ok_or_else(|| ApiError::invalid(format!("missing query parameter {key:?}")))
    }

    pub fn bool(&self, key: &str, default: bool) -> Result<bool, ApiError> {
        match self.get(key) {
            None => Ok(default),
            Some("true" | "1" | "yes") => Ok(true),
            Some("false" | "0" | "no") => Ok(false),
            Some(v) => Err(ApiError::invalid(format!("query parameter {key} must be true or false, not {v:?}"))),
        }
    }

    pub fn number<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>, ApiError> {
        self.get(key)
            .map(|v| v.parse::<T>().map_err(|_| ApiError::invalid(format!("query parameter {key} must be a number, not {v:?}"))))
            .transpose()
    }
}

/// A header of at most 256 visible ASCII characters, if present.
fn token_header(parts: &Parts, name: &str) -> Result<Option<String>, ApiError> {
    let Some(v) = parts.headers.get(name) else { return Ok(None) };
    let s = v.to_str().map_err(|_| ApiError::invalid(format!("header {name} must be visible ASCII")))?;
    if s.is_empty() || s.len() > 256 || !s.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(ApiError::invalid(format!("header {name} must have 1 to 256 visible ASCII characters")));
    }
    Ok(Some(s.to_string()))
}

/// The client's step id (`x-dsec-step-id`), for the trajectory log.
pub struct StepId(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for StepId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        token_header(parts, dsec_api::STEP_ID_HEADER).map(StepId)
    }
}

/// A creation's `Idempotency-Key`.
pub struct IdempotencyKey(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        token_header(parts, dsec_api::IDEMPOTENCY_KEY_HEADER).map(IdempotencyKey)
    }
}

/// Percent-encodes one path segment (a job name may contain anything).
pub fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
