//! State event streams, as newline-delimited JSON over a chunked response:
//! the current state first, then one line per change. A sandbox's stream
//! ends after its final state; a job's stream lasts until the client closes
//! it (new sandboxes of the job show up in it as they are created). In a
//! cluster the apiserver merges the streams of every node, line by line.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::Response;
use bytes::Bytes;
use dsec_api as api;
use dsec_edge::{Caller, Edge, ListFilter, SandboxEvent};
use http_body_util::BodyExt;
use tokio::sync::{broadcast, mpsc};

use crate::auth::Auth;
use crate::convert;
use crate::error::ApiResult;
use crate::extract::path_segment;
use crate::state::AppState;

/// Lines buffered per stream before the producers wait for the client.
const STREAM_BUFFER: usize = 1024;

/// Follow one sandbox's state: NDJSON `SandboxEvent` lines, ending after
/// `stopped` or `failed`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/events", tag = "lifecycle",
    params(("id" = String, Path)),
    responses((status = 200, description = "NDJSON stream of SandboxEvent", content_type = "application/x-ndjson", body = api::SandboxEvent), (status = 404, body = api::ErrorBody)))]
pub async fn sandbox(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>) -> ApiResult<Response> {
    let edge = st.nodes.owner(&id)?.clone();
    // Subscribe before reading the current state: no change falls between.
    let rx = edge.subscribe();
    let current = edge.get(&caller, &id)?;
    let (tx, lines) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(async move {
        let done = current.state.is_terminal();
        if tx.send(line(&SandboxEvent::of(&current))).await.is_err() || done {
            return;
        }
        follow(edge, caller, rx, tx, move |e| e.id == id, true).await;
    });
    Ok(ndjson(lines))
}

/// Follow every sandbox of a job, on every node: the current state of each,
/// then each change, as NDJSON `SandboxEvent` lines, until the client
/// closes the stream.
#[utoipa::path(get, path = "/v1/jobs/{job}/events", tag = "jobs",
    params(("job" = String, Path)),
    responses((status = 200, description = "NDJSON stream of SandboxEvent", content_type = "application/x-ndjson", body = api::SandboxEvent)))]
pub async fn job(State(st): State<AppState>, Auth(caller): Auth, Path(job): Path<String>) -> ApiResult<Response> {
    let (tx, lines) = mpsc::channel(STREAM_BUFFER);
    for edge in st.nodes.local_edges() {
        let rx = edge.subscribe();
        let filter = ListFilter { job: Some(job.clone()), ..Default::default() };
        let snapshot = edge.list(&caller, &filter);
        let (edge, caller, tx, job) = (edge.clone(), caller.clone(), tx.clone(), job.clone());
        tokio::spawn(async move {
            for rec in &snapshot {
                if tx.send(line(&SandboxEvent::of(rec))).await.is_err() {
                    return;
                }
            }
            follow(edge, caller, rx, tx, move |e| e.job.as_deref() == Some(job.as_str()), false).await;
        });
    }
    for remote in st.nodes.remotes() {
        let (caller, tx, path) = (caller.clone(), tx.clone(), format!("/v1/jobs/{}/events", path_segment(&job)));
        tokio::spawn(async move {
            match remote.stream(&caller, &path).await {
                Ok(body) => relay_lines(body, tx).await,
                Err(e) => tracing::warn!(node = %remote.name, error = %e.message, "job event stream of a node failed"),
            }
        });
    }
    Ok(ndjson(lines))
}

/// Forwards this node's events that `wanted` selects and `caller` may see,
/// until the client goes away (or, with `until_final`, after a final state).
async fn follow(
    edge: Edge,
    caller: Caller,
    mut rx: broadcast::Receiver<SandboxEvent>,
    tx: mpsc::Sender<Bytes>,
    wanted: impl Fn(&SandboxEvent) -> bool,
    until_final: bool,
) {
    loop {
        let event = tokio::select! {
            e = rx.recv() => e,
            _ = tx.closed() => return,
        };
        match event {
            Ok(e) if wanted(&e) && caller.may_see(&e.tenant) => {
                let last = until_final && e.state.is_terminal();
                if tx.send(line(&e)).await.is_err() || last {
                    return;
                }
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::debug!(missed = n, node = edge.node(), "an event stream fell behind");
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Copies whole lines of a remote node's stream into ours.
async fn relay_lines(mut body: hyper::body::Incoming, tx: mpsc::Sender<Bytes>) {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let frame = tokio::select! {
            f = body.frame() => f,
            _ = tx.closed() => return,
        };
        let Some(Ok(frame)) = frame else { return };
        let Ok(data) = frame.into_data() else { continue };
        buf.extend_from_slice(&data);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let rest = buf.split_off(nl + 1);
            let l = std::mem::replace(&mut buf, rest);
            if tx.send(Bytes::from(l)).await.is_err() {
                return;
            }
        }
    }
}

fn line(e: &SandboxEvent) -> Bytes {
    let mut v = serde_json::to_vec(&convert::event_out(e.clone())).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn ndjson(lines: mpsc::Receiver<Bytes>) -> Response {
    let stream =
        futures_util::stream::unfold(lines, |mut rx| async move { rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(b), rx)) });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}
