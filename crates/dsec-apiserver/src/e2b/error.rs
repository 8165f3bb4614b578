//! The two error shapes of the E2B routes: the control plane's
//! `{"code": <HTTP status>, "message"}` (what the SDK's `handle_api_exception`
//! parses), and the Connect protocol's `{"code": "<name>", "message"}` for
//! envd's services.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dsec_api::ErrorCode;

use crate::error::ApiError;

/// A control-plane failure.
#[derive(Debug)]
pub struct RestError {
    pub status: StatusCode,
    pub message: String,
}

impl RestError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }
}

impl From<ApiError> for RestError {
    fn from(e: ApiError) -> Self {
        Self { status: e.status(), message: format!("{}: {}", e.code, e.message) }
    }
}

impl From<dsec_edge::EdgeError> for RestError {
    fn from(e: dsec_edge::EdgeError) -> Self {
        ApiError::from(e).into()
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, axum::Json(body)).into_response()
    }
}

pub type RestResult<T> = Result<T, RestError>;

/// The Connect protocol's error codes that envd's services answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    Unauthenticated,
    FailedPrecondition,
    ResourceExhausted,
    Unavailable,
    DeadlineExceeded,
    Unimplemented,
    Internal,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::Unauthenticated => "unauthenticated",
            Code::FailedPrecondition => "failed_precondition",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
        }
    }

    /// The HTTP status of a unary call failing with this code (the Connect
    /// protocol's table).
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A failed envd call.
#[derive(Debug, Clone)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }
}

impl From<ApiError> for RpcError {
    fn from(e: ApiError) -> Self {
        let code = match e.code {
            ErrorCode::NotFound
            | ErrorCode::SandboxNotFound
            | ErrorCode::FileNotFound
            | ErrorCode::SessionNotFound
            | ErrorCode::ImageNotFound => Code::NotFound,
            ErrorCode::AlreadyExists => Code::AlreadyExists,
            ErrorCode::PermissionDenied | ErrorCode::Forbidden => Code::PermissionDenied,
            ErrorCode::Unauthorized => Code::Unauthenticated,
            ErrorCode::DirectoryNotEmpty => Code::FailedPrecondition,
            ErrorCode::PayloadTooLarge | ErrorCode::NoSpace | ErrorCode::RateLimited => Code::ResourceExhausted,
            ErrorCode::Timeout => Code::DeadlineExceeded,
            ErrorCode::SandboxNotRunning
            | ErrorCode::SandboxEnded
            | ErrorCode::AgentUnavailable
            | ErrorCode::EdgeUnavailable
            | ErrorCode::NoCapacity => Code::Unavailable,
            ErrorCode::Internal => Code::Internal,
            c if c.http_status() == 400 => Code::InvalidArgument,
            _ => Code::Internal,
        };
        RpcError::new(code, e.message)
    }
}

impl From<dsec_edge::EdgeError> for RpcError {
    fn from(e: dsec_edge::EdgeError) -> Self {
        ApiError::from(e).into()
    }
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        (self.code.http_status(), axum::Json(self.json())).into_response()
    }
}

pub type RpcResult<T> = Result<T, RpcError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_errors_map_to_the_codes_the_sdk_branches_on() {
        let code = |c: ErrorCode| RpcError::from(ApiError::new(c, "x")).code;
        assert_eq!(code(ErrorCode::FileNotFound), Code::NotFound, "kill/exists branch on not_found");
        assert_eq!(code(ErrorCode::AlreadyExists), Code::AlreadyExists, "make_dir branches on already_exists");
        assert_eq!(code(ErrorCode::InvalidPath), Code::InvalidArgument);
        assert_eq!(code(ErrorCode::UserNotFound), Code::InvalidArgument);
        assert_eq!(code(ErrorCode::AgentUnavailable), Code::Unavailable);
        assert_eq!(Code::NotFound.http_status(), StatusCode::NOT_FOUND);
        let rest = RestError::from(ApiError::new(ErrorCode::SandboxNotFound, "sandbox x not found"));
        assert_eq!(rest.status, StatusCode::NOT_FOUND);
    }
}
