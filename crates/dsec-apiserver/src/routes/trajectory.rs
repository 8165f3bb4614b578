//! A sandbox's trajectory log (provenance) and its replay.

use axum::extract::{Path, State};
use axum::Json;
use dsec_api as api;

use crate::auth::Auth;
use crate::convert;
use crate::error::ApiResult;
use crate::extract::QueryPairs;
use crate::state::AppState;

/// Every operation that changed the sandbox, in order, with its result and
/// the files it changed. Readable by the sandbox's owner only.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/trajectory", tag = "trajectory",
    params(("id" = String, Path)),
    responses((status = 200, body = api::Trajectory), (status = 404, body = api::ErrorBody)))]
pub async fn get(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>) -> ApiResult<Json<api::Trajectory>> {
    let steps = st.nodes.owner(&id)?.trajectory(&caller, &id).await?;
    Ok(Json(api::Trajectory { sandbox_id: id, steps: steps.into_iter().map(convert::trajectory_step_out).collect() }))
}

/// Re-run the sandbox's log in a fresh sandbox of the same image, layers
/// and run arguments, and report where the results diverge. The replay
/// sandbox is removed afterwards unless `keep=true`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/replay", tag = "trajectory",
    params(("id" = String, Path), ("keep" = Option<bool>, Query)),
    responses((status = 200, body = api::ReplayReport), (status = 404, body = api::ErrorBody)))]
pub async fn replay(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    q: QueryPairs,
) -> ApiResult<Json<api::ReplayReport>> {
    let keep = q.bool("keep", false)?;
    let r = st.nodes.owner(&id)?.replay(&caller, &id, keep).await?;
    Ok(Json(api::ReplayReport {
        source_id: r.source,
        replay_id: r.replay_id,
        kept: r.kept,
        steps: r.steps,
        replayed: r.replayed,
        identical: r.divergences.is_empty(),
        divergences: r
            .divergences
            .into_iter()
            .map(|d| api::Divergence {
                seq: d.seq,
                step_id: d.step_id,
                kind: d.kind,
                field: d.field,
                recorded: d.recorded,
                replayed: d.replayed,
            })
            .collect(),
    }))
}
