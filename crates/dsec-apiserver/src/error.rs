//! Every failure leaves the API as `{"error": {"code", "message"}}` with the
//! status from the shared error-code table.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use dsec_api::{ErrorBody, ErrorCode};
use dsec_edge::EdgeError;

#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// Seconds for a Retry-After header.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), retry_after: None }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody::new(self.code, self.message.clone())
    }
}

impl From<EdgeError> for ApiError {
    fn from(e: EdgeError) -> Self {
        let code = e.code();
        if code == ErrorCode::Internal {
            tracing::error!(error = %e, "internal error");
        }
        let mut err = ApiError::new(code, e.to_string());
        if matches!(code, ErrorCode::NoCapacity | ErrorCode::CreationQueueFull) {
            err.retry_after = Some(1);
        }
        err
    }
}

impl From<crate::quota::QuotaExceeded> for ApiError {
    fn from(e: crate::quota::QuotaExceeded) -> Self {
        ApiError::new(ErrorCode::QuotaExceeded, e.to_string())
    }
}

impl From<dsec_store::StoreError> for ApiError {
    fn from(e: dsec_store::StoreError) -> Self {
        if e.is_unavailable() {
            tracing::warn!(error = %e, "the database is unavailable");
            let mut err = ApiError::new(ErrorCode::StoreUnavailable, e.to_string());
            err.retry_after = Some(1);
            return err;
        }
        tracing::error!(error = %e, "database error");
        ApiError::new(ErrorCode::Internal, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                resp.headers_mut().insert("retry-after", v);
            }
        }
        resp
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
