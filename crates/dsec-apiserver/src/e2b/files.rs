//! envd's `GET /files` (a file's content) and `POST /files` (uploads:
//! `multipart/form-data` with one part per file, or one file as
//! `application/octet-stream`, optionally gzip-encoded), on the native
//! file routes' streaming read and logged upload.

use std::io::Read;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use dsec_edge::agent::{Reply, WriteFileSpec};
use dsec_edge::{AgentRequest, StepOp};
use serde_json::json;

use super::envd::{self, Refusal, Target};
use super::error::{RestError, RestResult, RpcError};
use super::filesystem::absolute;
use super::E2bState;
use crate::error::ApiError;
use crate::extract::QueryPairs;
use crate::routes::files::{stream_out, upload as logged_upload};

fn refused(r: Refusal) -> RestError {
    match r {
        Refusal::Gone(m) => RestError::new(StatusCode::BAD_GATEWAY, m),
        Refusal::Denied(e) => rpc(e),
    }
}

fn rpc(e: RpcError) -> RestError {
    RestError::new(e.code.http_status(), e.message)
}

/// The user of a file call: `username` in the query, else the
/// `Authorization` header, else the sandbox's default.
fn user(q: &QueryPairs, headers: &HeaderMap) -> RestResult<Option<String>> {
    match q.get("username").filter(|u| !u.is_empty()) {
        Some(u) => Ok(Some(u.to_string())),
        None => envd::user(headers).map_err(rpc),
    }
}

pub async fn download(State(st): State<E2bState>, headers: HeaderMap, q: QueryPairs) -> RestResult<Response> {
    let t = envd::target(&st, &headers).map_err(refused)?;
    let user = user(&q, &headers)?;
    let path = absolute(q.get("path").unwrap_or(""), user.as_deref()).map_err(rpc)?;
    let (call, guard) = t.edge.open(&t.caller, &t.id, AgentRequest::ReadFile { path, offset: 0, limit: None }).await?;
    Ok(stream_out(call, guard, "application/octet-stream").await?)
}

pub async fn upload(State(st): State<E2bState>, headers: HeaderMap, q: QueryPairs, req: Request) -> RestResult<Response> {
    let t = envd::target(&st, &headers).map_err(refused)?;
    let user = user(&q, &headers)?;
    let max = st.app.limits.max_upload_bytes;
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let mut written = Vec::new();
    if content_type.starts_with("multipart/form-data") {
        let boundary =
            multer::parse_boundary(&content_type).map_err(|e| RestError::new(StatusCode::BAD_REQUEST, format!("multipart: {e}")))?;
        let mut parts = multer::Multipart::new(req.into_body().into_data_stream(), boundary);
        while let Some(field) = parts.next_field().await.map_err(|e| RestError::new(StatusCode::BAD_REQUEST, format!("multipart: {e}")))? {
            // The part's file name is its path; one file may take `path`.
            let name = field.file_name().map(str::to_string);
            let target = match (q.get("path"), name) {
                (Some(p), _) if !p.is_empty() => p.to_string(),
                (_, Some(n)) if !n.is_empty() => n,
                _ => return Err(RestError::new(StatusCode::BAD_REQUEST, "each part needs a file name (its path)")),
            };
            let path = absolute(&target, user.as_deref()).map_err(rpc)?;
            let data = field.bytes().await.map_err(|e| RestError::new(StatusCode::BAD_REQUEST, format!("multipart: {e}")))?;
            written.push(write(&st, &t, &path, user.clone(), max, Body::from(data)).await?);
        }
    } else {
        let path = absolute(q.get("path").unwrap_or(""), user.as_deref()).map_err(rpc)?;
        let gzip = headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
        let body = if gzip { Body::from(gunzip(req.into_body(), max).await?) } else { req.into_body() };
        written.push(write(&st, &t, &path, user, max, body).await?);
    }
    Ok(Json(written).into_response())
}

/// A gzip-encoded upload, decoded (bounded by the upload limit).
async fn gunzip(body: Body, max: u64) -> RestResult<Bytes> {
    let raw = axum::body::to_bytes(body, usize::try_from(max).unwrap_or(usize::MAX))
        .await
        .map_err(|e| RestError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("reading the upload: {e}")))?;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&raw[..])
        .take(max + 1)
        .read_to_end(&mut out)
        .map_err(|e| RestError::new(StatusCode::BAD_REQUEST, format!("the upload is not valid gzip: {e}")))?;
    if out.len() as u64 > max {
        return Err(RestError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the upload is larger than {max} bytes")));
    }
    Ok(out.into())
}

/// One file written (parents made, owned by the caller's user), as envd's
/// `EntryInfo` of the upload answer.
async fn write(st: &E2bState, t: &Target<'_>, path: &str, user: Option<String>, max: u64, body: Body) -> RestResult<serde_json::Value> {
    let spec = WriteFileSpec { path: path.to_string(), mode: 0o644, append: false, create_parents: true, max_bytes: max, owner: user };
    let op = StepOp::WriteFile { spec, digest: String::new(), bytes: 0 };
    match logged_upload(&st.app, &t.caller, &t.id, None, op, body).await? {
        Reply::Written { .. } => {}
        other => return Err(ApiError::new(dsec_api::ErrorCode::Internal, format!("unexpected agent reply {other:?}")).into()),
    }
    let name = path.rsplit('/').next().unwrap_or(path);
    Ok(json!({"name": name, "type": "file", "path": path}))
}
