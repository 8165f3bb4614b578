//! FnCall: `POST /v1/fncall`, `POST /v1/fncall/batch`, `GET /v1/fncall/pools`,
//! and the SandboxFusion-compatible `run_code`.
//!
//! The SandboxFusion client and verl send no credentials, so the compatible
//! endpoint is served under a path that carries a user token
//! (`/sandboxfusion/{token}/run_code`: set the client's endpoint to
//! `http://HOST:PORT/sandboxfusion/TOKEN`), and at the bare `/run_code` only
//! when the operator opens it explicitly (`--sandboxfusion-open`, for a
//! listener only trusted clients can reach).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::Json;
use dsec_api::{self as api, ErrorCode};
use dsec_edge::Caller;
use dsec_fncall::{FnCallError, FnCallService};

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult};
use crate::remote::RemoteNode;
use crate::state::AppState;

/// Largest FnCall request body (code, stdin, files, test cases).
const MAX_BODY_BYTES: usize = 128 << 20;

/// Where this apiserver's calls run: its own edge's service, or (a cluster
/// apiserver) any healthy remote edge, taken in turn.
pub enum FnCallBackend {
    Local(Arc<FnCallService>),
    Remote(AtomicUsize),
}

impl From<FnCallError> for ApiError {
    fn from(e: FnCallError) -> Self {
        let code = match &e {
            FnCallError::Invalid(_) => ErrorCode::InvalidRequest,
            FnCallError::InvalidLimits(_) => ErrorCode::InvalidLimits,
            FnCallError::UnsupportedLanguage(..) => ErrorCode::UnsupportedLanguage,
            FnCallError::QueueFull { .. } => ErrorCode::QueueFull,
            FnCallError::QueueTimeout(_) => ErrorCode::Timeout,
            FnCallError::RunnerFailed(_) | FnCallError::RunnerLost(_) | FnCallError::Start(_) => ErrorCode::RunnerFailed,
            FnCallError::ShuttingDown => ErrorCode::EdgeUnavailable,
        };
        let mut err = ApiError::new(code, e.to_string());
        match e {
            FnCallError::QueueFull { retry_after_s, .. } => err.retry_after = Some(retry_after_s),
            FnCallError::RunnerFailed(_) | FnCallError::RunnerLost(_) | FnCallError::Start(_) => err.retry_after = Some(1),
            _ => {}
        }
        err
    }
}

fn pick_remote(st: &AppState, turn: &AtomicUsize) -> ApiResult<Arc<RemoteNode>> {
    let healthy: Vec<Arc<RemoteNode>> = st.nodes.remotes().into_iter().filter(|r| r.status().healthy).collect();
    if healthy.is_empty() {
        return Err(ApiError::new(ErrorCode::EdgeUnavailable, "no node is reachable to serve the call"));
    }
    Ok(healthy[turn.fetch_add(1, Ordering::Relaxed) % healthy.len()].clone())
}

async fn body_json<T: serde::de::DeserializeOwned>(body: Body) -> ApiResult<T> {
    let bytes: Bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|e| ApiError::new(ErrorCode::PayloadTooLarge, format!("request body over {MAX_BODY_BYTES} bytes or unreadable: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
}

async fn run_one(st: &AppState, caller: &Caller, req: api::FnCallRequest) -> ApiResult<api::FnCallResponse> {
    match st.fncall.as_deref() {
        Some(FnCallBackend::Local(svc)) => Ok(svc.call(req).await?),
        Some(FnCallBackend::Remote(turn)) => pick_remote(st, turn)?.fncall(caller, &req).await,
        None => Err(not_served()),
    }
}

fn not_served() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "FnCall is not enabled on this server")
}

/// Run one call (or judge one submission) on a warm runner.
#[utoipa::path(post, path = "/v1/fncall", tag = "fncall", request_body = api::FnCallRequest,
    responses((status = 200, body = api::FnCallResponse), (status = 400, body = api::ErrorBody),
              (status = 429, body = api::ErrorBody), (status = 503, body = api::ErrorBody)))]
pub async fn call(State(st): State<AppState>, Auth(caller): Auth, req: Request) -> ApiResult<Json<api::FnCallResponse>> {
    let req: api::FnCallRequest = body_json(req.into_body()).await?;
    take_fncall_rate(&st, &caller, 1)?;
    Ok(Json(run_one(&st, &caller, req).await?))
}

/// `n` calls against the caller's project's `fncall_per_s` (and its
/// ancestors'): all of them fit, or the request is refused.
fn take_fncall_rate(st: &AppState, caller: &dsec_edge::model::Caller, n: usize) -> ApiResult<()> {
    let Some(tokens) = st.auth.tokens() else { return Ok(()) };
    Ok(tokens.ledger().take_rate(&caller.tenant, dsec_store::Limit::FncallPerS, n as u64, std::time::Instant::now())?)
}

/// Run many calls at once; one result or error per call, in order.
#[utoipa::path(post, path = "/v1/fncall/batch", tag = "fncall", request_body = api::FnCallBatchRequest,
    responses((status = 200, body = api::FnCallBatchResponse), (status = 400, body = api::ErrorBody)))]
pub async fn batch(State(st): State<AppState>, Auth(caller): Auth, req: Request) -> ApiResult<Json<api::FnCallBatchResponse>> {
    let req: api::FnCallBatchRequest = body_json(req.into_body()).await?;
    take_fncall_rate(&st, &caller, req.calls.len())?;
    let results = match st.fncall.as_deref() {
        Some(FnCallBackend::Local(svc)) => svc
            .batch(req.calls)
            .await?
            .into_iter()
            .map(|r| match r {
                Ok(resp) => api::FnCallBatchItem::Ok(Box::new(resp)),
                Err(e) => api::FnCallBatchItem::Err(ApiError::from(e).body()),
            })
            .collect(),
        Some(FnCallBackend::Remote(turn)) => return Ok(Json(pick_remote(&st, turn)?.fncall_batch(&caller, &req).await?)),
        None => return Err(not_served()),
    };
    Ok(Json(api::FnCallBatchResponse { results }))
}

/// The runner pools of this server's node(s).
#[utoipa::path(get, path = "/v1/fncall/pools", tag = "fncall", responses((status = 200, body = api::FnCallPools)))]
pub async fn pools(State(st): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<api::FnCallPools>> {
    match st.fncall.as_deref() {
        Some(FnCallBackend::Local(svc)) => Ok(Json(svc.status())),
        Some(FnCallBackend::Remote(_)) => {
            let mut pools = Vec::new();
            for r in st.nodes.remotes() {
                if let Ok(p) = r.fncall_pools(&caller).await {
                    pools.extend(p.pools);
                }
            }
            Ok(Json(api::FnCallPools { pools }))
        }
        None => Err(not_served()),
    }
}

/// SandboxFusion's `run_code`, authenticated by the token in the path.
#[utoipa::path(post, path = "/sandboxfusion/{token}/run_code", tag = "sandboxfusion", request_body = api::RunCodeRequest,
    params(("token" = String, Path, description = "a dsec user token")),
    security(()),
    responses((status = 200, body = api::RunCodeResponse), (status = 400, body = api::ErrorBody), (status = 401, body = api::ErrorBody)))]
pub async fn sandboxfusion_run_code(
    State(st): State<AppState>,
    Path(token): Path<String>,
    req: Request,
) -> ApiResult<Json<api::RunCodeResponse>> {
    let mut headers = HeaderMap::new();
    let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| ApiError::new(ErrorCode::Unauthorized, "malformed token"))?;
    headers.insert(axum::http::header::AUTHORIZATION, value);
    let caller = st.auth.authenticate(&headers).await?;
    run_code(&st, &caller, req.into_body()).await
}

/// SandboxFusion's `run_code` without credentials; served only when the
/// operator opened it (`--sandboxfusion-open`).
#[utoipa::path(post, path = "/run_code", tag = "sandboxfusion", request_body = api::RunCodeRequest,
    security(()),
    responses((status = 200, body = api::RunCodeResponse), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
pub async fn open_run_code(State(st): State<AppState>, req: Request) -> ApiResult<Json<api::RunCodeResponse>> {
    if !st.sandboxfusion_open {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            "the unauthenticated /run_code is closed on this server; use /sandboxfusion/{token}/run_code (or start it with --sandboxfusion-open)",
        ));
    }
    run_code(&st, &Caller { tenant: "sandboxfusion".into(), admin: false }, req.into_body()).await
}

async fn run_code(st: &AppState, caller: &Caller, body: Body) -> ApiResult<Json<api::RunCodeResponse>> {
    let req: api::RunCodeRequest = body_json(body).await?;
    let call = crate::sandboxfusion::to_fncall(req)?;
    match run_one(st, caller, call).await {
        Ok(resp) => Ok(Json(crate::sandboxfusion::from_fncall(resp))),
        // verl retries only 504; a saturated node answers that, so a burst
        // is retried rather than scored as a failure.
        Err(e) if matches!(e.code, ErrorCode::QueueFull | ErrorCode::Timeout | ErrorCode::EdgeUnavailable) => {
            Err(ApiError { code: ErrorCode::Timeout, message: e.message, retry_after: Some(1) })
        }
        // Infrastructure faults are SandboxFusion's `SandboxError` (its
        // client retries those).
        Err(e) if e.code == ErrorCode::RunnerFailed => Ok(Json(api::RunCodeResponse {
            status: "SandboxError".into(),
            message: e.message,
            compile_result: None,
            run_result: None,
            executor_pod_name: None,
            files: Default::default(),
        })),
        Err(e) => Err(e),
    }
}
