//! envd's process service (`/process.Process/*`) on the agent's streamed
//! exec and PTYs: `Start` and `Connect` stream a process's start, output
//! and end; `List`, `SendInput`, `CloseStdin`, `SendSignal` and `Update`
//! reach a running one by pid or tag (see `processes`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use dsec_edge::agent::{Command, ExecResult, ExecSpec, PtySpec, Stdin, Stream};
use dsec_edge::{EdgeError, StreamOp, StreamStart};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::connect::{self, de_bytes, StreamItem};
use super::envd::{self, Target};
use super::error::{Code, RpcError, RpcResult};
use super::processes::{Config, Event, Process, Selector, Spawn};
use super::E2bState;
use crate::convert;

#[derive(Debug, Default, Deserialize)]
struct ProcessConfig {
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Size {
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
}

#[derive(Debug, Default, Deserialize)]
struct Pty {
    #[serde(default)]
    size: Option<Size>,
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    #[serde(default)]
    process: Option<ProcessConfig>,
    #[serde(default)]
    pty: Option<Pty>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct SelectorMsg {
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    tag: Option<String>,
}

impl SelectorMsg {
    fn selector(&self) -> RpcResult<Selector> {
        match (self.pid, &self.tag) {
            (Some(pid), _) => Ok(Selector::Pid(pid)),
            (None, Some(tag)) => Ok(Selector::Tag(tag.clone())),
            (None, None) => Err(RpcError::invalid("the process selector needs a pid or a tag")),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Selected {
    #[serde(default)]
    process: Option<SelectorMsg>,
}

#[derive(Debug, Default, Deserialize)]
struct Input {
    #[serde(default, deserialize_with = "de_bytes")]
    stdin: Vec<u8>,
    #[serde(default, deserialize_with = "de_bytes")]
    pty: Vec<u8>,
}

#[derive(Debug, Deserialize)]
struct SendInputRequest {
    #[serde(default)]
    process: Option<SelectorMsg>,
    #[serde(default)]
    input: Option<Input>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SignalMsg {
    Number(i32),
    Name(String),
}

#[derive(Debug, Deserialize)]
struct SendSignalRequest {
    #[serde(default)]
    process: Option<SelectorMsg>,
    signal: Option<SignalMsg>,
}

#[derive(Debug, Deserialize)]
struct UpdateRequest {
    #[serde(default)]
    process: Option<SelectorMsg>,
    #[serde(default)]
    pty: Option<Pty>,
}

pub async fn dispatch(State(st): State<E2bState>, Path(method): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    let streaming = matches!(method.as_str(), "Start" | "Connect");
    let answer = async {
        let t = envd::target(&st, &headers)?;
        match method.as_str() {
            "Start" => start(&st, &t, &headers, connect::request(&headers, &body)?).await,
            "Connect" => attach(&st, &t, &headers, connect::request(&headers, &body)?),
            "List" => Ok(list(&st, &t)),
            "SendInput" => send_input(&st, &t, connect::request(&headers, &body)?).await,
            "CloseStdin" => {
                let req: Selected = connect::request(&headers, &body)?;
                let p = find(&st, &t, req.process.as_ref())?;
                p.input.send_eof().map_err(|e| RpcError::new(Code::Unavailable, e.to_string()))?;
                Ok(connect::unary(&json!({})))
            }
            "SendSignal" => send_signal(&st, &t, connect::request(&headers, &body)?),
            "Update" => update(&st, &t, connect::request(&headers, &body)?),
            "StreamInput" => Err(RpcError::new(Code::Unimplemented, "StreamInput (a client stream) is not served; use SendInput")),
            other => Err(RpcError::new(Code::Unimplemented, format!("process.Process/{other} is not a method of envd's process service"))),
        }
    }
    .await;
    match answer {
        Ok(r) => r,
        Err(e) if streaming && connect::is_stream(&headers) => connect::failed_stream(e),
        Err(e) => e.into_response(),
    }
}

fn find(st: &E2bState, t: &Target<'_>, sel: Option<&SelectorMsg>) -> RpcResult<Arc<Process>> {
    let sel = sel.ok_or_else(|| RpcError::invalid("missing process selector"))?.selector()?;
    st.processes.find(&t.id, &sel).ok_or_else(|| {
        let what = match sel {
            Selector::Pid(p) => format!("pid {p}"),
            Selector::Tag(t) => format!("tag {t:?}"),
        };
        RpcError::new(Code::NotFound, format!("process with {what} not found"))
    })
}

async fn start(st: &E2bState, t: &Target<'_>, headers: &HeaderMap, req: StartRequest) -> RpcResult<Response> {
    let cfg = req.process.ok_or_else(|| RpcError::invalid("missing process"))?;
    if cfg.cmd.is_empty() {
        return Err(RpcError::invalid("process.cmd must not be empty"));
    }
    let user = envd::user(headers)?;
    let mut argv = vec![cfg.cmd.clone()];
    argv.extend(cfg.args.iter().cloned());
    let env: Vec<(String, String)> = cfg.envs.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let cwd = cfg.cwd.clone().filter(|c| !c.is_empty());
    let op = match &req.pty {
        Some(pty) => {
            let size = pty.size.as_ref();
            StreamOp::Pty(PtySpec {
                command: Some(Command::Argv(argv)),
                env,
                cwd: cwd.clone(),
                user,
                rows: size.map_or(24, |s| s.rows.max(1)),
                cols: size.map_or(80, |s| s.cols.max(1)),
            })
        }
        None => StreamOp::Exec(ExecSpec {
            command: Command::Argv(argv),
            env,
            cwd: cwd.clone(),
            user,
            stdin: if req.stdin.unwrap_or(false) { Stdin::Stream } else { Stdin::Null },
            stream_output: true,
            timeout_ms: None,
            kill_grace_ms: convert::KILL_GRACE_MS,
            max_output_bytes: convert::DEFAULT_MAX_OUTPUT,
            session: None,
        }),
    };
    let (ticket, call, activity) = match t.edge.begin_stream(&t.caller, &t.id, None, op).await? {
        StreamStart::Fresh { ticket, call, activity } => (ticket, call, activity),
        StreamStart::Recorded(_) => return Err(RpcError::new(Code::Internal, "a fresh process had a recorded answer")),
    };
    let edge = t.edge.clone();
    let config = Config { cmd: cfg.cmd, args: cfg.args, envs: cfg.envs, cwd };
    let spawn = Spawn { tag: req.tag, config, pty: req.pty.is_some(), deadline: deadline(headers) };
    let (p, events) = st.processes.start(&t.id, spawn, call, move |end| async move {
        let end = end.map_err(EdgeError::AgentUnavailable);
        edge.finish_stream(ticket, &end).await;
        drop(activity);
    });
    Ok(event_stream(p.pid, events, keepalive(headers)))
}

fn attach(st: &E2bState, t: &Target<'_>, headers: &HeaderMap, req: Selected) -> RpcResult<Response> {
    let p = find(st, t, req.process.as_ref())?;
    Ok(event_stream(p.pid, p.attach(), keepalive(headers)))
}

/// The `Start` call's deadline (`Connect-Timeout-Ms`; none or 0: none).
fn deadline(headers: &HeaderMap) -> Option<Duration> {
    let ms = headers.get("connect-timeout-ms").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// How often an idle stream carries a keepalive event (the SDK's
/// `Keepalive-Ping-Interval`, seconds).
fn keepalive(headers: &HeaderMap) -> Duration {
    let secs = headers.get("keepalive-ping-interval").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok()).unwrap_or(50);
    Duration::from_secs(secs.clamp(1, 3600))
}

/// A process's events as envd's `StartResponse` / `ConnectResponse`
/// stream: start, data, end.
fn event_stream(pid: u32, mut events: mpsc::Receiver<Event>, ping: Duration) -> Response {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        if tx.send(StreamItem::Message(json!({"event": {"start": {"pid": pid}}}))).await.is_err() {
            return;
        }
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + ping, ping);
        loop {
            let item = tokio::select! {
                ev = events.recv() => ev,
                _ = tick.tick() => {
                    if tx.send(StreamItem::Message(json!({"event": {"keepalive": {}}}))).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let done = match item {
                Some(Event::Output { stream, data }) => {
                    let field = match stream {
                        Stream::Stderr => "stderr",
                        Stream::Pty => "pty",
                        _ => "stdout",
                    };
                    tx.send(StreamItem::Message(json!({"event": {"data": {field: connect::b64(&data)}}}))).await.is_err()
                }
                Some(Event::End(r)) => {
                    let _ = tx.send(StreamItem::Message(json!({"event": {"end": end_event(&r)}}))).await;
                    let _ = tx.send(StreamItem::End(None)).await;
                    true
                }
                // The sandbox went away: the stream ends without an end
                // event, as envd's does.
                Some(Event::Failed(m)) => {
                    let _ = tx.send(StreamItem::End(Some(RpcError::new(Code::Unavailable, m)))).await;
                    true
                }
                None => true,
            };
            if done {
                return;
            }
        }
    });
    connect::stream(rx)
}

/// envd's `EndEvent`: Go's view of the process state.
fn end_event(r: &ExecResult) -> serde_json::Value {
    match (r.exit_code, r.signal) {
        (Some(code), _) => json!({"exitCode": code, "exited": true, "status": format!("exit status {code}")}),
        (None, Some(sig)) => json!({"exitCode": -1, "exited": false, "status": format!("signal: {}", signal_name(sig))}),
        (None, None) => json!({"exitCode": -1, "exited": false, "status": "unknown", "error": "the process ended without a status"}),
    }
}

fn signal_name(sig: i32) -> String {
    match sig {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        9 => "killed".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

fn list(st: &E2bState, t: &Target<'_>) -> Response {
    let processes: Vec<serde_json::Value> = st
        .processes
        .list(&t.id)
        .iter()
        .map(|p| {
            let mut config = json!({"cmd": p.config.cmd, "args": p.config.args, "envs": p.config.envs});
            if let Some(cwd) = &p.config.cwd {
                config["cwd"] = json!(cwd);
            }
            let mut info = json!({"config": config, "pid": p.pid});
            if let Some(tag) = &p.tag {
                info["tag"] = json!(tag);
            }
            info
        })
        .collect();
    connect::unary(&json!({ "processes": processes }))
}

async fn send_input(st: &E2bState, t: &Target<'_>, req: SendInputRequest) -> RpcResult<Response> {
    let p = find(st, t, req.process.as_ref())?;
    let input = req.input.unwrap_or_default();
    let data = if p.pty { input.pty } else { input.stdin };
    p.input.send_data(&data).await.map_err(|e| RpcError::new(Code::Unavailable, e.to_string()))?;
    Ok(connect::unary(&json!({})))
}

fn send_signal(st: &E2bState, t: &Target<'_>, req: SendSignalRequest) -> RpcResult<Response> {
    let p = find(st, t, req.process.as_ref())?;
    let sig = match req.signal {
        Some(SignalMsg::Number(n @ (9 | 15))) => n,
        Some(SignalMsg::Name(n)) if n == "SIGNAL_SIGKILL" => 9,
        Some(SignalMsg::Name(n)) if n == "SIGNAL_SIGTERM" => 15,
        other => return Err(RpcError::invalid(format!("signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM, not {other:?}"))),
    };
    p.input.signal(sig).map_err(|e| RpcError::new(Code::Unavailable, e.to_string()))?;
    Ok(connect::unary(&json!({})))
}

fn update(st: &E2bState, t: &Target<'_>, req: UpdateRequest) -> RpcResult<Response> {
    let p = find(st, t, req.process.as_ref())?;
    if !p.pty {
        return Err(RpcError::invalid("only a process started with a PTY can be resized"));
    }
    let size = req.pty.and_then(|p| p.size).ok_or_else(|| RpcError::invalid("missing pty.size"))?;
    p.input.resize(size.rows.max(1), size.cols.max(1)).map_err(|e| RpcError::new(Code::Unavailable, e.to_string()))?;
    Ok(connect::unary(&json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_events_read_like_go_process_states() {
        let exited = end_event(&ExecResult { exit_code: Some(3), ..Default::default() });
        assert_eq!(exited, json!({"exitCode": 3, "exited": true, "status": "exit status 3"}));
        let killed = end_event(&ExecResult { signal: Some(9), ..Default::default() });
        assert_eq!(killed["status"], "signal: killed");
        assert_eq!(killed["exitCode"], -1);
    }

    #[test]
    fn selectors_and_signals_parse_from_protobuf_json() {
        let r: SendSignalRequest = serde_json::from_str(r#"{"process":{"pid":1001},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
        assert!(matches!(r.process.unwrap().selector().unwrap(), Selector::Pid(1001)));
        let r: SendInputRequest = serde_json::from_str(r#"{"process":{"tag":"t"},"input":{"stdin":"aGk="}}"#).unwrap();
        assert_eq!(r.input.unwrap().stdin, b"hi");
        assert!(SelectorMsg::default().selector().is_err());
    }
}
