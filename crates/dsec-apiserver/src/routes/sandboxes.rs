//! Sandbox lifecycle, exec and sessions.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use dsec_api as api;
use dsec_edge::agent::{Reply, SessionSpec};
use dsec_edge::ListFilter;

use crate::auth::Auth;
use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, IdempotencyKey, QueryPairs, StepId};
use crate::state::AppState;
use dsec_edge::StepOp;

/// Create a sandbox and wait until it runs. With an `Idempotency-Key`
/// header, a retry (same tenant, key and body) returns the same sandbox.
/// With `first_exec`, the command's result comes in the same answer.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes",
    params(("idempotency-key" = Option<String>, Header)),
    request_body = api::CreateSandboxRequest,
    responses((status = 201, body = api::CreatedSandbox), (status = "4XX", body = api::ErrorBody), (status = "5XX", body = api::ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    Auth(caller): Auth,
    IdempotencyKey(key): IdempotencyKey,
    ApiJson(req): ApiJson<api::CreateSandboxRequest>,
) -> ApiResult<(StatusCode, Json<api::CreatedSandbox>)> {
    // The first command is checked before anything is created. A remote
    // node runs it in its own create route; a sandbox of this process's
    // edge gets it here, like any exec.
    let first = match &req.first_exec {
        Some(_) if key.is_some() => {
            return Err(ApiError::invalid("first_exec cannot be combined with an Idempotency-Key: a retry would run the command again"))
        }
        Some(exec) => Some((convert::exec_spec(exec, false)?, exec.encoding.unwrap_or_default())),
        None => None,
    };
    let mut created = crate::quota::create(&st, &caller, req, key.as_deref()).await?;
    if let (Some((spec, encoding)), None) = (first, &created.first_exec) {
        created.first_exec = Some(run_first_exec(&st, &caller, &created.sandbox.id, spec, encoding).await?);
    }
    Ok((StatusCode::CREATED, Json(created)))
}

/// Runs a creation's first command. If it cannot run, the sandbox is
/// deleted: the caller gets the error and no sandbox id to clean up.
async fn run_first_exec(
    st: &AppState,
    caller: &dsec_edge::model::Caller,
    id: &str,
    spec: dsec_edge::agent::ExecSpec,
    encoding: api::OutputEncoding,
) -> ApiResult<api::ExecResponse> {
    let reply = match st.nodes.owner(id) {
        Ok(node) => node.run_step(caller, id, None, StepOp::Exec { spec }).await.map_err(ApiError::from),
        Err(e) => Err(e),
    };
    let error = match reply {
        Ok(Reply::Exited(result)) => return Ok(convert::exec_response(result, encoding)),
        Ok(other) => ApiError::new(api::ErrorCode::Internal, format!("unexpected agent reply {other:?}")),
        Err(e) => e,
    };
    if let Ok(node) = st.nodes.owner(id) {
        if let Err(e) = node.delete(caller, id).await {
            tracing::warn!(sandbox = %id, error = %e, "could not delete a sandbox whose first command failed");
        }
    }
    Err(error)
}

/// List sandboxes, filtered by `state`, `job`, `project` (it and the
/// projects below it) and repeatable `label=k=v`.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes",
    params(("state" = Option<String>, Query), ("job" = Option<String>, Query), ("project" = Option<String>, Query), ("label" = Option<Vec<String>>, Query, description = "k=v; repeat for several")),
    responses((status = 200, body = api::SandboxList), (status = 400, body = api::ErrorBody)))]
pub async fn list(State(st): State<AppState>, Auth(caller): Auth, q: QueryPairs) -> ApiResult<Json<api::SandboxList>> {
    let mut filter =
        ListFilter { state: q.get("state").map(convert::state_in).transpose()?, job: q.get("job").map(str::to_string), labels: vec![] };
    for l in q.all("label") {
        let (k, v) = l.split_once('=').ok_or_else(|| ApiError::invalid(format!("label filter {l:?} must be key=value")))?;
        filter.labels.push((k.to_string(), v.to_string()));
    }
    let (mut sandboxes, unreachable_nodes) = st.nodes.list(&caller, &filter, &q.raw()).await;
    if let Some(project) = q.get("project") {
        sandboxes.retain(|s| dsec_store::projects::is_within(&s.project, project));
    }
    Ok(Json(api::SandboxList { sandboxes, unreachable_nodes }))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path)), responses((status = 200, body = api::Sandbox), (status = 404, body = api::ErrorBody)))]
pub async fn get(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>) -> ApiResult<Json<api::Sandbox>> {
    let rec = st.nodes.owner(&id)?.get(&caller, &id)?;
    Ok(Json(convert::sandbox_out(rec)))
}

/// Change what can change while a sandbox lives: its CPU QoS class
/// (applied to its running tasks too).
#[utoipa::path(patch, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path)), request_body = api::UpdateSandboxRequest,
    responses((status = 200, body = api::Sandbox), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn update(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    crate::extract::ApiJson(req): crate::extract::ApiJson<api::UpdateSandboxRequest>,
) -> ApiResult<Json<api::Sandbox>> {
    let edge = st.nodes.owner(&id)?;
    let rec = match req.qos_class {
        Some(class) => edge.set_qos(&caller, &id, convert::qos_in(class)).await?,
        None => edge.get(&caller, &id)?,
    };
    Ok(Json(convert::sandbox_out(rec)))
}

/// Stop a sandbox; its record stays (state `stopped`) for inspection.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/stop", tag = "sandboxes",
    params(("id" = String, Path)), responses((status = 200, body = api::Sandbox), (status = 404, body = api::ErrorBody)))]
pub async fn stop(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>) -> ApiResult<Json<api::Sandbox>> {
    let rec = st.nodes.owner(&id)?.stop(&caller, &id, "stopped by request").await?;
    Ok(Json(convert::sandbox_out(rec)))
}

/// Stop a sandbox if needed and forget it.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path)), responses((status = 204), (status = 404, body = api::ErrorBody)))]
pub async fn delete(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>) -> ApiResult<StatusCode> {
    st.nodes.owner(&id)?.delete(&caller, &id).await?;
    if let Some(tokens) = st.auth.tokens() {
        tokens.ledger().ended(&id, std::time::Instant::now());
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Run a command to completion and return its output. With an
/// `x-dsec-step-id` already in the trajectory log, the recorded result.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "exec",
    params(("id" = String, Path), ("x-dsec-step-id" = Option<String>, Header)), request_body = api::ExecRequest,
    responses((status = 200, body = api::ExecResponse), (status = "4XX", body = api::ErrorBody), (status = "5XX", body = api::ErrorBody)))]
pub async fn exec(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    StepId(step): StepId,
    ApiJson(req): ApiJson<api::ExecRequest>,
) -> ApiResult<Json<api::ExecResponse>> {
    let spec = convert::exec_spec(&req, false)?;
    match st.nodes.owner(&id)?.run_step(&caller, &id, step.as_deref(), StepOp::Exec { spec }).await? {
        Reply::Exited(result) => Ok(Json(convert::exec_response(result, req.encoding.unwrap_or_default()))),
        other => Err(ApiError::new(api::ErrorCode::Internal, format!("unexpected agent reply {other:?}"))),
    }
}

/// Open a persistent shell session (cwd and exported variables carry over).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/sessions", tag = "exec",
    params(("id" = String, Path)), request_body = api::CreateSessionRequest,
    responses((status = 201, body = api::SessionInfo), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn create_session(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    StepId(step): StepId,
    body: axum::body::Bytes,
) -> ApiResult<impl IntoResponse> {
    // The body is optional: an empty one means defaults.
    let req: api::CreateSessionRequest = if body.iter().all(u8::is_ascii_whitespace) {
        Default::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("invalid session request: {e}")))?
    };
    let spec = SessionSpec { env: req.env.into_iter().collect(), cwd: req.cwd, user: req.user };
    match st.nodes.owner(&id)?.run_step(&caller, &id, step.as_deref(), StepOp::OpenSession { spec }).await? {
        Reply::Session { session_id } => Ok((StatusCode::CREATED, Json(api::SessionInfo { session_id }))),
        other => Err(ApiError::new(api::ErrorCode::Internal, format!("unexpected agent reply {other:?}"))),
    }
}

/// End a session, killing every process it started.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/sessions/{sid}", tag = "exec",
    params(("id" = String, Path), ("sid" = String, Path)), responses((status = 204), (status = 404, body = api::ErrorBody)))]
pub async fn delete_session(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path((id, sid)): Path<(String, String)>,
    StepId(step): StepId,
) -> ApiResult<StatusCode> {
    st.nodes.owner(&id)?.run_step(&caller, &id, step.as_deref(), StepOp::CloseSession { session_id: sid }).await?;
    Ok(StatusCode::NO_CONTENT)
}
