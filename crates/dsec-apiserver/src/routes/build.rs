//! Dockerfile builds: `POST /v1/images/build` takes the build context as a
//! tar archive and answers with the build's progress as it happens, one
//! JSON object per line, the last one the image (or the failure). Leaving
//! the request cancels the build and deletes its sandboxes.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use dsec_api::{self as api, ErrorCode};
use dsec_build::{BuildError, BuildEvent, BuildRequest, BuildSummary, Builder, Context};
use dsec_edge::Caller;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult};
use crate::extract::QueryPairs;
use crate::nodes::NodeRef;
use crate::state::AppState;

/// The public code of a build's failure.
pub fn error_code(e: &BuildError) -> ErrorCode {
    match e {
        BuildError::Parse(_) | BuildError::Word { .. } | BuildError::Invalid(_) | BuildError::Step { .. } => ErrorCode::InvalidRequest,
        BuildError::RunFailed { .. } => ErrorCode::BuildFailed,
        BuildError::Edge { source, .. } => source.code(),
        BuildError::Store(_) | BuildError::Io { .. } => ErrorCode::Internal,
    }
}

fn build_request(q: &QueryPairs) -> ApiResult<BuildRequest> {
    let mut build_args = BTreeMap::new();
    for a in q.all("build_arg") {
        let (k, v) = a.split_once('=').ok_or_else(|| ApiError::invalid(format!("build_arg {a:?} is not KEY=VALUE")))?;
        build_args.insert(k.to_string(), v.to_string());
    }
    let network_rules = match q.get("network") {
        None | Some("default") => None,
        Some("none") => Some(BTreeMap::new()),
        Some(rules) => Some(
            serde_json::from_str::<BTreeMap<String, bool>>(rules)
                .map_err(|e| ApiError::invalid(format!("network must be default, none or a JSON object of rules: {e}")))?,
        ),
    };
    Ok(BuildRequest {
        name: q.required("name")?.to_string(),
        build_args,
        target: q.get("target").map(str::to_string),
        no_cache: q.bool("no_cache", false)?,
        network_rules,
        memory_mb: q.number("memory_mb")?,
        cpu_cores: q.number("cpu_cores")?,
        disk_mb: q.number("disk_mb")?,
        step_timeout_s: q.number("step_timeout_s")?,
    })
}

/// Build an image from a Dockerfile. The body is the build context, a tar
/// archive (gzip-compressed or not) holding the Dockerfile (at
/// `dockerfile`, default `Dockerfile`) and the files its `COPY`/`ADD`
/// steps use; `.dockerignore` applies. Each `RUN` runs in a container
/// sandbox of the stage so far, as the Dockerfile's `USER`, with the
/// node's named network services (`network`: `default`, `none` or a JSON
/// object of rules); each step's changes become a layer. Steps whose
/// inputs are unchanged come from the step cache (`no_cache=true` runs
/// them all). The response is `application/x-ndjson`: `step` and
/// `step_done` events, then `{"type": "done", ...}` with the image, or
/// `{"type": "error", "code", "message"}`. Closing the connection cancels
/// the build. A cluster's apiserver sends the build to a node (`node`, or
/// a healthy one with the most free memory), whose store then holds the
/// image. While it runs, a build holds one sandbox of its step limits
/// against the caller's project quotas (429 `quota_exceeded` if that does
/// not fit).
#[utoipa::path(post, path = "/v1/images/build", tag = "images",
    params(
        ("name" = String, Query, description = "name[:tag] of the image"),
        ("dockerfile" = Option<String>, Query, description = "path of the Dockerfile in the context (default Dockerfile)"),
        ("build_arg" = Option<Vec<String>>, Query, description = "KEY=VALUE, repeatable"),
        ("target" = Option<String>, Query, description = "the stage to build (default the last)"),
        ("no_cache" = Option<bool>, Query),
        ("network" = Option<String>, Query, description = "RUN steps' network: default (the node's named services), none, or a JSON object of rules"),
        ("memory_mb" = Option<u64>, Query), ("cpu_cores" = Option<f64>, Query), ("disk_mb" = Option<u64>, Query),
        ("step_timeout_s" = Option<u64>, Query, description = "longest a RUN step may take"),
        ("node" = Option<String>, Query, description = "the node that builds (a cluster's apiserver; default: a healthy one with the most free memory)"),
    ),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 200, description = "progress, one JSON object per line", content_type = "application/x-ndjson"),
        (status = 400, body = api::ErrorBody), (status = 413, body = api::ErrorBody), (status = 429, body = api::ErrorBody)))]
pub async fn build(State(st): State<AppState>, Auth(caller): Auth, q: QueryPairs, req: Request<Body>) -> ApiResult<Response> {
    let Some(builder) = st.builder.clone() else {
        // An apiserver in front of edges: a node builds, into its store.
        return forward(&st, &caller, &q, req).await;
    };
    let body = req.into_body();
    let req = build_request(&q)?;
    // Before the context is received: a build that cannot fit its
    // project's quota is refused before the client sends it.
    let hold = crate::quota::build::hold(&st, &caller, &req)?;
    let dockerfile = q.get("dockerfile").unwrap_or("Dockerfile").to_string();
    let ctx = receive_context(&builder, body, st.limits.max_upload_bytes, &dockerfile).await?;
    // Refuse what cannot start before answering 200 and streaming.
    dsec_build::dockerfile::parse(ctx.dockerfile()).map_err(|e| ApiError::invalid(format!("Dockerfile: {e}")))?;
    req.name.parse::<dsec_image::Reference>().map_err(|e| ApiError::invalid(format!("image name: {e}")))?;

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<BuildEvent>();
    // The hold is given back when the build ends, or when the task is
    // aborted because the client went away.
    let job = tokio::spawn(async move {
        let _hold = hold;
        builder.build(&caller, &req, &ctx, &tx).await
    });
    // A long step sends nothing for minutes: an empty line every few
    // seconds finds a client that went away (the write fails), which drops
    // this stream and so cancels the build.
    let mut beat = tokio::time::interval(HEARTBEAT);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stream = futures_util::stream::unfold((rx, Some(AbortOnDrop(job)), beat), |(mut rx, job, mut beat)| async move {
        let mut job = job?;
        let next = tokio::select! {
            e = rx.recv() => e.map(|e| line(&e)),
            _ = beat.tick() => Some(bytes::Bytes::from_static(b"\n")),
        };
        match next {
            Some(bytes) => Some((Ok::<_, std::io::Error>(bytes), (rx, Some(job), beat))),
            None => {
                let end = match (&mut job.0).await {
                    Ok(Ok(summary)) => done_line(&summary),
                    Ok(Err(e)) => error_line(error_code(&e), &e.to_string()),
                    Err(e) => error_line(ErrorCode::Internal, &format!("the build task failed: {e}")),
                };
                Some((Ok(end), (rx, None, beat)))
            }
        }
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(stream)).into_response())
}

/// How often a build's progress stream proves the client is still there.
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(2);

/// Sends the build, streams and all, to the node `node` names, else to a
/// healthy node with the most free memory (builds are memory-hungry, and
/// the image lands in that node's store).
async fn forward(st: &AppState, caller: &Caller, q: &QueryPairs, req: Request<Body>) -> ApiResult<Response> {
    let remote = match q.get("node") {
        Some(name) => match st.nodes.by_name(name) {
            Some(NodeRef::Remote(r)) => r,
            _ => return Err(ApiError::new(ErrorCode::NotFound, format!("no node named {name:?}"))),
        },
        None => st
            .nodes
            .remotes()
            .into_iter()
            .filter(|r| r.reachable() && r.status().healthy)
            .max_by_key(|r| {
                let s = r.status();
                s.memory_capacity_mb.saturating_sub(s.memory_reserved_mb)
            })
            .ok_or_else(|| ApiError::new(ErrorCode::EdgeUnavailable, "no healthy node to build on"))?,
    };
    // The node that builds keeps no ledger: this apiserver holds the
    // build's sandbox for as long as the node's answer streams.
    let hold = crate::quota::build::hold(st, caller, &build_request(q)?)?;
    let (parts, body) = remote.forward(caller, req).await?.into_response().into_parts();
    let body = Body::from_stream(body.into_data_stream().map(move |chunk| {
        let _held = &hold;
        chunk
    }));
    Ok(Response::from_parts(parts, body))
}

/// Aborts the build when the response is dropped (the client went away).
struct AbortOnDrop(tokio::task::JoinHandle<Result<BuildSummary, BuildError>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn line(event: &BuildEvent) -> bytes::Bytes {
    let mut v = serde_json::to_vec(event).unwrap_or_default();
    v.push(b'\n');
    v.into()
}

fn done_line(s: &BuildSummary) -> bytes::Bytes {
    let mut v = serde_json::to_value(s).unwrap_or_default();
    v["type"] = "done".into();
    let mut bytes = serde_json::to_vec(&v).unwrap_or_default();
    bytes.push(b'\n');
    bytes.into()
}

fn error_line(code: ErrorCode, message: &str) -> bytes::Bytes {
    let mut bytes =
        serde_json::to_vec(&serde_json::json!({"type": "error", "code": code.as_str(), "message": message})).unwrap_or_default();
    bytes.push(b'\n');
    bytes.into()
}

/// Spools the request body to the builder's scratch directory (bounded by
/// `max` bytes), then unpacks it.
async fn receive_context(builder: &Arc<Builder>, body: Body, max: u64, dockerfile: &str) -> ApiResult<Context> {
    let scratch = builder.scratch().to_path_buf();
    tokio::fs::create_dir_all(&scratch)
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("creating {}: {e}", scratch.display())))?;
    let spool =
        tempfile::NamedTempFile::new_in(&scratch).map_err(|e| ApiError::new(ErrorCode::Internal, format!("spooling the context: {e}")))?;
    let mut file = tokio::fs::File::from_std(spool.reopen().map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?);
    let mut data = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = data.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid(format!("reading the build context: {e}")))?;
        total += chunk.len() as u64;
        if total > max {
            return Err(ApiError::new(ErrorCode::PayloadTooLarge, format!("the build context is larger than the limit of {max} bytes")));
        }
        file.write_all(&chunk).await.map_err(|e| ApiError::new(ErrorCode::Internal, format!("spooling the context: {e}")))?;
    }
    file.flush().await.map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
    let dockerfile = dockerfile.to_string();
    tokio::task::spawn_blocking(move || {
        let reader = std::fs::File::open(spool.path())?;
        Ok::<_, std::io::Error>(Context::unpack(reader, &scratch, &dockerfile))
    })
    .await
    .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?
    .map_err(|e| ApiError::new(ErrorCode::Internal, format!("reading the spooled context: {e}")))?
    .map_err(|e| match e {
        BuildError::Invalid(m) => ApiError::invalid(m),
        other => ApiError::new(ErrorCode::Internal, other.to_string()),
    })
}
