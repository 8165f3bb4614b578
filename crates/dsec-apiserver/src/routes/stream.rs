//! Streaming exec and interactive PTYs over WebSocket.
//!
//! Exec: the client's first text frame is an `ExecRequest`; output arrives as
//! binary frames tagged with their stream; the last frame is a JSON `exit`
//! (or `error`) message. PTY: binary frames are terminal bytes both ways.
//! When the client goes away, the command is cancelled (killed).
//!
//! Both go into the sandbox's trajectory log like every other operation: a
//! streamed exec with the output its client was sent (bounded by its
//! `max_output_bytes`), so a re-issued step id answers from the log, the
//! recorded output sent as frames; a terminal with its exit status.

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::Response;
use dsec_api::{self as api, ErrorCode, ErrorDetail, StreamMessage};
use dsec_edge::agent::{Call, CallEvent, CallSender};
use dsec_edge::agent::{Command, ExecResult, PtySpec, Reply, Stream};
use dsec_edge::{Caller, EdgeError, StreamOp, StreamStart};
use futures_util::{SinkExt, StreamExt};

use crate::auth::Auth;
use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::extract::{QueryPairs, StepId};
use crate::state::AppState;

/// Stream a command's output (WebSocket).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/exec/stream", tag = "exec",
    params(("id" = String, Path)),
    responses((status = 101, description = "WebSocket: first client frame is an ExecRequest; see docs/api.md"), (status = 400, body = api::ErrorBody, description = "Not a WebSocket upgrade"), (status = 404, body = api::ErrorBody)))]
pub async fn exec_stream(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    StepId(step_id): StepId,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    st.nodes.owner(&id)?.get(&caller, &id)?;
    Ok(upgrade(ws)?.on_upgrade(move |socket| exec_session(st, caller, id, step_id, socket)))
}

/// Open an interactive terminal (WebSocket).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty", tag = "exec",
    params(("id" = String, Path), ("rows" = Option<u16>, Query), ("cols" = Option<u16>, Query), ("cmd" = Option<String>, Query), ("user" = Option<String>, Query), ("cwd" = Option<String>, Query)),
    responses((status = 101, description = "WebSocket: binary frames are terminal bytes"), (status = 400, body = api::ErrorBody, description = "Not a WebSocket upgrade, or a bad size"), (status = 404, body = api::ErrorBody)))]
pub async fn pty(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    q: QueryPairs,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    st.nodes.owner(&id)?.get(&caller, &id)?;
    let spec = PtySpec {
        command: q.get("cmd").map(|c| Command::Shell(c.to_string())),
        env: vec![],
        cwd: q.get("cwd").map(str::to_string),
        user: q.get("user").map(str::to_string),
        rows: q.number("rows")?.unwrap_or(24),
        cols: q.number("cols")?.unwrap_or(80),
    };
    Ok(upgrade(ws)?.on_upgrade(move |socket| pty_session(st, caller, id, spec, socket)))
}

/// A request that is not a WebSocket upgrade gets the API's error body
/// (axum's own rejection is plain text).
fn upgrade(ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>) -> ApiResult<WebSocketUpgrade> {
    ws.map_err(|e| ApiError::invalid(format!("this route answers WebSocket upgrades only: {e}")))
}

fn text(msg: &StreamMessage) -> Message {
    Message::Text(serde_json::to_string(msg).unwrap_or_default().into())
}

fn error_msg(e: ApiError) -> Message {
    text(&StreamMessage::Error(ErrorDetail { code: e.code, message: e.message }))
}

async fn exec_session(st: AppState, caller: Caller, id: String, step_id: Option<String>, socket: WebSocket) {
    let (mut out, mut inp) = socket.split();
    let req: api::ExecRequest = match inp.next().await {
        Some(Ok(Message::Text(t))) => match serde_json::from_str(&t) {
            Ok(r) => r,
            Err(e) => {
                let _ = out.send(error_msg(ApiError::invalid(format!("first frame must be an ExecRequest: {e}")))).await;
                return;
            }
        },
        _ => {
            let _ = out.send(error_msg(ApiError::invalid("first frame must be an ExecRequest as JSON text"))).await;
            return;
        }
    };
    let encoding = req.encoding.unwrap_or_default();
    let opened = async {
        let spec = convert::exec_spec(&req, true)?;
        let keep = spec.max_output_bytes;
        let edge = st.nodes.owner(&id)?;
        let start = edge.begin_stream(&caller, &id, step_id.as_deref(), StreamOp::Exec(spec)).await.map_err(ApiError::from)?;
        Ok::<_, ApiError>((edge, start, keep))
    };
    let (edge, start, keep) = match opened.await {
        Ok(c) => c,
        Err(e) => {
            let _ = out.send(error_msg(e)).await;
            return;
        }
    };
    match start {
        StreamStart::Recorded(Ok(Reply::Exited(r))) => send_recorded(out, r, encoding).await,
        StreamStart::Recorded(Ok(other)) => {
            let _ = out.send(error_msg(ApiError::new(ErrorCode::Internal, format!("unexpected recorded reply {other:?}")))).await;
        }
        StreamStart::Recorded(Err(e)) => {
            let _ = out.send(error_msg(e.into())).await;
        }
        StreamStart::Fresh { ticket, call, activity } => {
            let mut kept = Kept::new(keep);
            let end = relay(call, inp, out, InputMode::Exec, encoding, Some(&mut kept)).await;
            drop(activity);
            edge.finish_stream(ticket, &end.map(|r| kept.into_reply(r))).await;
        }
    }
}

/// A re-issued step: its recorded output as the frames a live run sends.
async fn send_recorded(mut out: WsOut, r: ExecResult, encoding: api::OutputEncoding) {
    for (tag, data) in [(api::STREAM_STDOUT, &r.stdout), (api::STREAM_STDERR, &r.stderr)] {
        for chunk in data.chunks(64 << 10) {
            let mut frame = Vec::with_capacity(chunk.len() + 1);
            frame.push(tag);
            frame.extend_from_slice(chunk);
            if out.send(Message::Binary(frame.into())).await.is_err() {
                return;
            }
        }
    }
    let _ = out.send(text(&StreamMessage::Exit(convert::exec_response(r, encoding)))).await;
    let _ = out.close().await;
}

/// The output of a streamed exec kept for the log, each stream bounded
/// like a buffered exec's.
struct Kept {
    limit: usize,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    truncated: bool,
}

impl Kept {
    fn new(limit: u64) -> Kept {
        Kept { limit: usize::try_from(limit).unwrap_or(usize::MAX), stdout: Vec::new(), stderr: Vec::new(), truncated: false }
    }

    fn add(&mut self, stream: Stream, data: &[u8]) {
        let buf = if stream == Stream::Stderr { &mut self.stderr } else { &mut self.stdout };
        let room = self.limit.saturating_sub(buf.len());
        if data.len() > room {
            self.truncated = true;
        }
        buf.extend_from_slice(&data[..data.len().min(room)]);
    }

    fn into_reply(self, reply: Reply) -> Reply {
        match reply {
            Reply::Exited(mut r) => {
                r.stdout = self.stdout;
                r.stderr = self.stderr;
                r.truncated |= self.truncated;
                Reply::Exited(r)
            }
            other => other,
        }
    }
}

async fn pty_session(st: AppState, caller: Caller, id: String, spec: PtySpec, socket: WebSocket) {
    let (mut out, inp) = socket.split();
    let opened = async {
        let edge = st.nodes.owner(&id)?;
        let start = edge.begin_stream(&caller, &id, None, StreamOp::Pty(spec)).await.map_err(ApiError::from)?;
        Ok::<_, ApiError>((edge, start))
    };
    let (edge, ticket, call, activity) = match opened.await {
        Ok((edge, StreamStart::Fresh { ticket, call, activity })) => (edge, ticket, call, activity),
        Ok((_, StreamStart::Recorded(_))) => {
            let _ = out.send(error_msg(ApiError::new(ErrorCode::Internal, "a terminal has no recorded answer"))).await;
            return;
        }
        Err(e) => {
            let _ = out.send(error_msg(e)).await;
            return;
        }
    };
    let end = relay(call, inp, out, InputMode::Pty, api::OutputEncoding::Utf8, None).await;
    drop(activity);
    edge.finish_stream(ticket, &end).await;
}

type WsOut = futures_util::stream::SplitSink<WebSocket, Message>;
type WsIn = futures_util::stream::SplitStream<WebSocket>;

/// Runs both directions of a streaming call until it ends: output to the
/// client (tagged by stream for exec, raw for a PTY) and its final message;
/// client input to the sandbox in a task of its own. Returns how the call
/// ended, for the log: `Err` when it did not reach its end (the client
/// left, the agent went away).
async fn relay(
    call: Call,
    inp: WsIn,
    mut out: WsOut,
    mode: InputMode,
    encoding: api::OutputEncoding,
    mut kept: Option<&mut Kept>,
) -> Result<Reply, EdgeError> {
    let (tx, mut rx) = call.into_split();
    let input = tokio::spawn(forward_input(inp, tx, mode));
    let mut end = Err(EdgeError::AgentUnavailable("the stream ended before the command did".into()));
    loop {
        let msg = match rx.recv().await {
            Ok(Some(CallEvent::Data { stream, data })) => match mode {
                InputMode::Pty => Message::Binary(data.into()),
                InputMode::Exec => {
                    if let Some(k) = kept.as_deref_mut() {
                        k.add(stream, &data);
                    }
                    let tag = if stream == Stream::Stderr { api::STREAM_STDERR } else { api::STREAM_STDOUT };
                    let mut frame = Vec::with_capacity(data.len() + 1);
                    frame.push(tag);
                    frame.extend_from_slice(&data);
                    Message::Binary(frame.into())
                }
            },
            Ok(Some(CallEvent::Reply(Ok(Reply::Exited(r))))) => {
                let _ = out.send(text(&StreamMessage::Exit(convert::exec_response(r.clone(), encoding)))).await;
                end = Ok(Reply::Exited(r));
                break;
            }
            Ok(Some(CallEvent::Reply(Ok(other)))) => {
                let _ = out.send(error_msg(ApiError::new(ErrorCode::Internal, format!("unexpected reply {other:?}")))).await;
                break;
            }
            Ok(Some(CallEvent::Reply(Err(e)))) => {
                let _ = out.send(error_msg(EdgeError::Agent(e.clone()).into())).await;
                end = Err(EdgeError::Agent(e));
                break;
            }
            Ok(None) => break,
            Err(e) => {
                let _ = out.send(error_msg(EdgeError::from(e).into())).await;
                break;
            }
        };
        if out.send(msg).await.is_err() {
            // The client left: dropping the receiver cancels the command.
            break;
        }
    }
    input.abort();
    let _ = out.close().await;
    end
}

#[derive(Clone, Copy, PartialEq)]
enum InputMode {
    /// Binary frames carry a stream tag byte (0 = stdin).
    Exec,
    /// Binary frames are raw terminal input.
    Pty,
}

/// Client -> sandbox: stdin bytes, EOF, signals, resizes. When the client
/// closes the socket, the command is cancelled.
async fn forward_input(mut inp: WsIn, tx: CallSender, mode: InputMode) {
    while let Some(msg) = inp.next().await {
        let ok = match msg {
            Ok(Message::Binary(b)) => {
                let data = match mode {
                    InputMode::Exec => match b.split_first() {
                        Some((&api::STREAM_STDIN, rest)) => rest.to_vec(),
                        _ => continue,
                    },
                    InputMode::Pty => b.to_vec(),
                };
                tx.send_data(&data).await.is_ok()
            }
            Ok(Message::Text(t)) => match serde_json::from_str::<StreamMessage>(&t) {
                Ok(StreamMessage::Eof) => tx.send_eof().is_ok(),
                Ok(StreamMessage::Signal { signal }) => tx.signal(signal).is_ok(),
                Ok(StreamMessage::Resize { rows, cols }) => tx.resize(rows, cols).is_ok(),
                _ => true,
            },
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => true,
        };
        if !ok {
            return;
        }
    }
    let _ = tx.cancel();
}
