//! Files and directory archives. Content is streamed in both directions:
//! neither the apiserver nor the edge holds a whole file in memory.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use dsec_api as api;
use dsec_edge::agent::{Call, CallEvent};
use dsec_edge::agent::{Reply, WriteFileSpec, MAX_CHUNK_BYTES};
use dsec_edge::trajectory::journal::MAX_KEPT_CONTENT;
use dsec_edge::{ActivityGuard, AgentRequest, EdgeError, StepOp, UploadStart};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use crate::auth::Auth;
use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, QueryPairs, StepId};
use crate::state::AppState;

fn unexpected(reply: Reply) -> ApiError {
    ApiError::new(api::ErrorCode::Internal, format!("unexpected agent reply {reply:?}"))
}

/// Streams a read-type call (file or tar) as the response body. Waits for
/// the first event so a missing file is a clean 404, not a broken stream.
pub(crate) async fn stream_out(mut call: Call, guard: ActivityGuard, content_type: &'static str) -> ApiResult<Response> {
    let first = match call.recv().await.map_err(EdgeError::from)? {
        Some(CallEvent::Reply(Err(e))) => return Err(EdgeError::Agent(e).into()),
        Some(CallEvent::Reply(Ok(_))) | None => None,
        Some(CallEvent::Data { data, .. }) => Some(Bytes::from(data)),
    };
    let done = first.is_none();
    let stream = futures_util::stream::unfold((call, guard, first, done), |(mut call, guard, first, done)| async move {
        if let Some(chunk) = first {
            return Some((Ok::<Bytes, std::io::Error>(chunk), (call, guard, None, done)));
        }
        if done {
            return None;
        }
        match call.recv().await {
            Ok(Some(CallEvent::Data { data, .. })) => Some((Ok(Bytes::from(data)), (call, guard, None, false))),
            Ok(Some(CallEvent::Reply(Ok(_)))) | Ok(None) => None,
            Ok(Some(CallEvent::Reply(Err(e)))) => Some((Err(std::io::Error::other(e.message)), (call, guard, None, true))),
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), (call, guard, None, true))),
        }
    });
    Ok(([(header::CONTENT_TYPE, content_type)], Body::from_stream(stream)).into_response())
}

/// What an upload's content was: its digest and size for the trajectory
/// log, and the bytes themselves while they are few enough to keep for
/// replay (`journal::MAX_KEPT_CONTENT`).
struct Content {
    hasher: Sha256,
    bytes: u64,
    kept: Option<Vec<u8>>,
}

impl Content {
    fn new() -> Self {
        Content { hasher: Sha256::new(), bytes: 0, kept: Some(Vec::new()) }
    }

    fn add(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
        self.bytes += chunk.len() as u64;
        if let Some(k) = &mut self.kept {
            if k.len() + chunk.len() > MAX_KEPT_CONTENT {
                self.kept = None;
            } else {
                k.extend_from_slice(chunk);
            }
        }
    }

    fn digest(&self) -> String {
        hex::encode(self.hasher.clone().finalize())
    }
}

/// Reads a whole upload only to learn its digest (a re-issued step).
async fn hash_body(body: Body) -> ApiResult<Content> {
    let mut content = Content::new();
    content.kept = None;
    let mut data = body.into_data_stream();
    while let Some(chunk) = data.next().await {
        content.add(&chunk.map_err(|e| ApiError::invalid(format!("reading the upload: {e}")))?);
    }
    Ok(content)
}

/// Feeds a request body into a write-type call and waits for its reply. The
/// agent may answer early (a bad path, too much data); we stop sending then.
async fn stream_in(call: Call, body: Body, content: &mut Content) -> Result<Reply, EdgeError> {
    let (tx, mut rx) = call.into_split();
    let send = async move {
        let mut data = body.into_data_stream();
        while let Some(chunk) = data.next().await {
            let chunk = chunk.map_err(|e| EdgeError::Invalid(format!("reading the upload: {e}")))?;
            content.add(&chunk);
            for piece in chunk.chunks(MAX_CHUNK_BYTES) {
                if tx.send_data(piece).await.is_err() {
                    return Ok::<(), EdgeError>(());
                }
            }
        }
        let _ = tx.send_eof();
        Ok(())
    };
    rx.reply_while(send).await?.map_err(EdgeError::Agent)
}

/// Runs an upload through the trajectory log: a re-issued step id gets its
/// recorded answer (the body is read only to compare its digest), a new one
/// streams to the agent while the content is hashed.
pub(crate) async fn upload(
    st: &AppState,
    caller: &dsec_edge::Caller,
    id: &str,
    step: Option<&str>,
    op: StepOp,
    body: Body,
) -> ApiResult<Reply> {
    let edge = st.nodes.owner(id)?;
    let with_content = |op: &StepOp, c: &Content| match op.clone() {
        StepOp::WriteFile { spec, .. } => StepOp::WriteFile { spec, digest: c.digest(), bytes: c.bytes },
        StepOp::ExtractArchive { path, max_bytes, .. } => StepOp::ExtractArchive { path, max_bytes, digest: c.digest(), bytes: c.bytes },
        other => other,
    };
    match edge.begin_upload(caller, id, step, &op).await? {
        UploadStart::Recorded(rec) => {
            let content = hash_body(body).await?;
            Ok(edge.settle_recorded(rec, &with_content(&op, &content)).await?)
        }
        UploadStart::Fresh { ticket, call, activity } => {
            let mut content = Content::new();
            let result = stream_in(call, body, &mut content).await;
            drop(activity);
            edge.finish_upload(ticket, &with_content(&op, &content), content.kept.as_deref(), &result).await;
            Ok(result?)
        }
    }
}

fn check_length(req_headers: &axum::http::HeaderMap, max: u64) -> ApiResult<()> {
    let len = req_headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    match len {
        Some(n) if n > max => {
            Err(ApiError::new(api::ErrorCode::PayloadTooLarge, format!("upload of {n} bytes exceeds the limit of {max}")))
        }
        _ => Ok(()),
    }
}

/// Download a file's content.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), ("path" = String, Query)),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>), (status = "4XX", body = api::ErrorBody)))]
pub async fn read(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>, q: QueryPairs) -> ApiResult<Response> {
    let path = q.required("path")?.to_string();
    let op = AgentRequest::ReadFile { path, offset: q.number("offset")?.unwrap_or(0), limit: q.number("limit")? };
    let (call, guard) = st.nodes.owner(&id)?.open(&caller, &id, op).await?;
    stream_out(call, guard, "application/octet-stream").await
}

/// Upload a file (raw body); it appears atomically.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), ("x-dsec-step-id" = Option<String>, Header), ("path" = String, Query), ("mode" = Option<u32>, Query), ("parents" = Option<bool>, Query), ("owner" = Option<String>, Query)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = api::WriteResult), (status = "4XX", body = api::ErrorBody)))]
pub async fn write(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    StepId(step): StepId,
    q: QueryPairs,
    req: Request,
) -> ApiResult<Json<api::WriteResult>> {
    let max = st.limits.max_upload_bytes;
    check_length(req.headers(), max)?;
    let path = q.required("path")?.to_string();
    let spec = WriteFileSpec {
        path: path.clone(),
        mode: q.number::<u32>("mode")?.unwrap_or(0o644),
        append: q.bool("append", false)?,
        create_parents: q.bool("parents", true)?,
        max_bytes: max,
        owner: q.get("owner").map(str::to_string),
    };
    let op = StepOp::WriteFile { spec, digest: String::new(), bytes: 0 };
    match upload(&st, &caller, &id, step.as_deref(), op, req.into_body()).await? {
        Reply::Written { bytes } => Ok(Json(api::WriteResult { path, bytes })),
        other => Err(unexpected(other)),
    }
}

/// Remove a file or directory (`recursive=true` for a non-empty one).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), ("x-dsec-step-id" = Option<String>, Header), ("path" = String, Query), ("recursive" = Option<bool>, Query)),
    responses((status = 204), (status = "4XX", body = api::ErrorBody)))]
pub async fn remove(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    StepId(step): StepId,
    q: QueryPairs,
) -> ApiResult<StatusCode> {
    let op = StepOp::Remove { path: q.required("path")?.to_string(), recursive: q.bool("recursive", false)? };
    st.nodes.owner(&id)?.run_step(&caller, &id, step.as_deref(), op).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(("id" = String, Path), ("path" = String, Query)),
    responses((status = 200, body = api::FileInfo), (status = "4XX", body = api::ErrorBody)))]
pub async fn stat(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>, q: QueryPairs) -> ApiResult<Json<api::FileInfo>> {
    let path = q.required("path")?.to_string();
    match st.nodes.owner(&id)?.call(&caller, &id, AgentRequest::Stat { path: path.clone() }).await? {
        Reply::Stat(s) => {
            let mut info = convert::file_info(None, s);
            info.path = path;
            Ok(Json(info))
        }
        other => Err(unexpected(other)),
    }
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path), ("path" = String, Query)),
    responses((status = 200, body = api::DirListing), (status = "4XX", body = api::ErrorBody)))]
pub async fn list(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    q: QueryPairs,
) -> ApiResult<Json<api::DirListing>> {
    let path = q.required("path")?.to_string();
    match st.nodes.owner(&id)?.call(&caller, &id, AgentRequest::ListDir { path: path.clone() }).await? {
        Reply::Dir(entries) => {
            let entries = entries.into_iter().map(|e| convert::file_info(Some(&path), e)).collect();
            Ok(Json(api::DirListing { path, entries }))
        }
        other => Err(unexpected(other)),
    }
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path), ("x-dsec-step-id" = Option<String>, Header)), request_body = api::MkdirRequest,
    responses((status = 204), (status = "4XX", body = api::ErrorBody)))]
pub async fn mkdir(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    StepId(step): StepId,
    ApiJson(req): ApiJson<api::MkdirRequest>,
) -> ApiResult<StatusCode> {
    let op = StepOp::Mkdir { path: req.path, parents: req.parents, mode: req.mode.unwrap_or(0o755) };
    st.nodes.owner(&id)?.run_step(&caller, &id, step.as_deref(), op).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Download a directory (or file) as a tar stream.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/archive", tag = "files",
    params(("id" = String, Path), ("path" = String, Query)),
    responses((status = 200, content_type = "application/x-tar", body = Vec<u8>), (status = "4XX", body = api::ErrorBody)))]
pub async fn archive_get(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>, q: QueryPairs) -> ApiResult<Response> {
    let op = AgentRequest::TarCreate { path: q.required("path")?.to_string() };
    let (call, guard) = st.nodes.owner(&id)?.open(&caller, &id, op).await?;
    stream_out(call, guard, "application/x-tar").await
}

/// Upload a tar stream and extract it into a directory.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/archive", tag = "files",
    params(("id" = String, Path), ("x-dsec-step-id" = Option<String>, Header), ("path" = String, Query)),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 200, body = api::WriteResult), (status = "4XX", body = api::ErrorBody)))]
pub async fn archive_put(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    StepId(step): StepId,
    q: QueryPairs,
    req: Request,
) -> ApiResult<Json<api::WriteResult>> {
    let max = st.limits.max_upload_bytes;
    check_length(req.headers(), max)?;
    let path = q.required("path")?.to_string();
    let op = StepOp::ExtractArchive { path: path.clone(), max_bytes: max, digest: String::new(), bytes: 0 };
    match upload(&st, &caller, &id, step.as_deref(), op, req.into_body()).await? {
        Reply::Written { bytes } => Ok(Json(api::WriteResult { path, bytes })),
        Reply::Done => Ok(Json(api::WriteResult { path, bytes: 0 })),
        other => Err(unexpected(other)),
    }
}
