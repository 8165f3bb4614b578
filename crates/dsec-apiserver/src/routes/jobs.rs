//! Job-wide pause and resume: every sandbox of a job, on every node, in one
//! call.

use std::time::Instant;

use axum::extract::{Path, State};
use axum::Json;
use dsec_api::{self as api, ErrorCode};
use dsec_edge::JobAction;

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Pause every live sandbox of a job (in parallel, on every node).
/// Idempotent: pausing a paused job answers 200 with `changed: 0`; a job
/// with no sandbox visible to the token answers 404 `job_not_found`.
#[utoipa::path(post, path = "/v1/jobs/{job}/pause", tag = "jobs",
    params(("job" = String, Path)),
    responses((status = 200, body = api::JobActionResult), (status = 404, body = api::ErrorBody)))]
pub async fn pause(State(st): State<AppState>, Auth(caller): Auth, Path(job): Path<String>) -> ApiResult<Json<api::JobActionResult>> {
    act(&st, &caller, job, JobAction::Pause).await
}

/// Resume every paused sandbox of a job (in parallel, on every node).
/// Stopped sandboxes are skipped and counted in `ended`.
#[utoipa::path(post, path = "/v1/jobs/{job}/resume", tag = "jobs",
    params(("job" = String, Path)),
    responses((status = 200, body = api::JobActionResult), (status = 404, body = api::ErrorBody)))]
pub async fn resume(State(st): State<AppState>, Auth(caller): Auth, Path(job): Path<String>) -> ApiResult<Json<api::JobActionResult>> {
    act(&st, &caller, job, JobAction::Resume).await
}

async fn act(st: &AppState, caller: &dsec_edge::Caller, job: String, action: JobAction) -> ApiResult<Json<api::JobActionResult>> {
    if job.is_empty() {
        return Err(ApiError::invalid("the job name must not be empty"));
    }
    let t0 = Instant::now();
    let mut r = st.nodes.job_action(caller, &job, action).await;
    if r.matched == 0 && r.failed.is_empty() {
        return Err(ApiError::new(ErrorCode::JobNotFound, format!("no sandbox of job {job:?} is visible to this token")));
    }
    r.duration_ms = t0.elapsed().as_secs_f64() * 1000.0;
    Ok(Json(r))
}
