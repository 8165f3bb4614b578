//! Job-wide pause and resume: every sandbox of a job, on every node, in one
//! call.

use std::time::Instant;

use axum::extract::{Path, Query, State};
use axum::Json;
use dsec_api::{self as api, ErrorCode};
use dsec_edge::JobAction;

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Pause every live sandbox of a job (in parallel, on every node).
/// Sandboxes already paused count as `unchanged`; a job whose live
/// sandboxes were all paused already answers 409 `job_already_paused`
/// (nothing done: a retried pause can take it as success), unless
/// `idempotent=true` asks for the counts anyway; a job with no sandbox
/// visible to the token answers 404 `job_not_found`.
#[utoipa::path(post, path = "/v1/jobs/{job}/pause", tag = "jobs",
    params(("job" = String, Path), JobParams),
    responses((status = 200, body = api::JobActionResult), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn pause(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(job): Path<String>,
    Query(params): Query<JobParams>,
) -> ApiResult<Json<api::JobActionResult>> {
    act(&st, &caller, job, JobAction::Pause, params.idempotent.unwrap_or(false)).await
}

/// Query of `POST /v1/jobs/{job}/pause`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct JobParams {
    /// Answer 200 with the counts even if every sandbox was paused already.
    pub idempotent: Option<bool>,
}

/// Resume every paused sandbox of a job (in parallel, on every node).
/// Stopped sandboxes are skipped and counted in `ended`.
#[utoipa::path(post, path = "/v1/jobs/{job}/resume", tag = "jobs",
    params(("job" = String, Path)),
    responses((status = 200, body = api::JobActionResult), (status = 404, body = api::ErrorBody)))]
pub async fn resume(State(st): State<AppState>, Auth(caller): Auth, Path(job): Path<String>) -> ApiResult<Json<api::JobActionResult>> {
    act(&st, &caller, job, JobAction::Resume, true).await
}

async fn act(
    st: &AppState,
    caller: &dsec_edge::Caller,
    job: String,
    action: JobAction,
    idempotent: bool,
) -> ApiResult<Json<api::JobActionResult>> {
    if job.is_empty() {
        return Err(ApiError::invalid("the job name must not be empty"));
    }
    let t0 = Instant::now();
    let mut r = st.nodes.job_action(caller, &job, action).await;
    if r.matched == 0 && r.failed.is_empty() {
        return Err(ApiError::new(ErrorCode::JobNotFound, format!("no sandbox of job {job:?} is visible to this token")));
    }
    if !idempotent && action == JobAction::Pause && r.changed == 0 && r.unchanged > 0 && r.failed.is_empty() {
        return Err(ApiError::new(
            ErrorCode::JobAlreadyPaused,
            format!("every live sandbox of job {job:?} ({}) is already paused", r.unchanged),
        ));
    }
    r.duration_ms = t0.elapsed().as_secs_f64() * 1000.0;
    Ok(Json(r))
}
