//! envd's filesystem service (`/filesystem.Filesystem/*`) on the agent's
//! file operations, with envd's semantics where they differ from the
//! native routes: `MakeDir` makes parents and answers `already_exists` for
//! an existing path; `Remove` of a missing path succeeds; `ListDir` is a
//! walk to `depth`, sorted by path.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use dsec_edge::agent::{Command, ExecSpec, FileKind, FileStat, Reply, Stdin};
use dsec_edge::{AgentRequest, StepOp};
use serde::Deserialize;
use serde_json::json;

use super::connect;
use super::envd::{self, Target};
use super::error::{Code, RpcError, RpcResult};
use super::E2bState;
use crate::convert;
use crate::error::ApiError;

#[derive(Debug, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize)]
struct ListDirRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

/// The deepest walk `ListDir` makes.
const MAX_DEPTH: u32 = 32;
/// The most entries one `ListDir` answers.
const MAX_ENTRIES: usize = 100_000;

pub async fn dispatch(State(st): State<E2bState>, Path(method): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    let answer = async {
        let t = envd::target(&st, &headers)?;
        let user = envd::user(&headers)?;
        match method.as_str() {
            "Stat" => {
                let req: PathRequest = connect::request(&headers, &body)?;
                let path = absolute(&req.path, user.as_deref())?;
                Ok(json!({"entry": entry(&path, stat(&t, &path).await?)}))
            }
            "MakeDir" => make_dir(&t, absolute(&connect::request::<PathRequest>(&headers, &body)?.path, user.as_deref())?).await,
            "ListDir" => {
                let req: ListDirRequest = connect::request(&headers, &body)?;
                list_dir(&t, absolute(&req.path, user.as_deref())?, req.depth.unwrap_or(1)).await
            }
            "Remove" => {
                let path = absolute(&connect::request::<PathRequest>(&headers, &body)?.path, user.as_deref())?;
                t.edge.run_step(&t.caller, &t.id, None, StepOp::Remove { path, recursive: true }).await.map_err(ApiError::from).or_else(
                    |e| match e.code {
                        dsec_api::ErrorCode::FileNotFound => Ok(Reply::Done),
                        _ => Err(RpcError::from(e)),
                    },
                )?;
                Ok(json!({}))
            }
            "Move" => {
                let req: MoveRequest = connect::request(&headers, &body)?;
                let (from, to) = (absolute(&req.source, user.as_deref())?, absolute(&req.destination, user.as_deref())?);
                move_entry(&t, &from, &to, user).await
            }
            "WatchDir" | "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => {
                Err(RpcError::new(Code::Unimplemented, format!("filesystem.Filesystem/{method}: directory watches are not served yet")))
            }
            other => Err(RpcError::new(
                Code::Unimplemented,
                format!("filesystem.Filesystem/{other} is not a method of envd's filesystem service"),
            )),
        }
    }
    .await;
    match answer {
        Ok(v) => connect::unary(&v),
        Err(e) if connect::is_stream(&headers) => connect::failed_stream(e),
        Err(e) => e.into_response(),
    }
}

/// envd resolves a relative path against the user's home.
pub fn absolute(path: &str, user: Option<&str>) -> RpcResult<String> {
    if path.is_empty() {
        return Err(RpcError::invalid("path must not be empty"));
    }
    if path.starts_with('/') {
        return Ok(path.to_string());
    }
    let home = match user {
        None | Some("root") => "/root".to_string(),
        Some(u) => format!("/home/{u}"),
    };
    Ok(format!("{home}/{}", path.trim_start_matches("./")))
}

async fn stat(t: &Target<'_>, path: &str) -> RpcResult<FileStat> {
    match t.edge.call(&t.caller, &t.id, AgentRequest::Stat { path: path.to_string() }).await? {
        Reply::Stat(s) => Ok(s),
        other => Err(RpcError::new(Code::Internal, format!("unexpected agent reply {other:?}"))),
    }
}

async fn make_dir(t: &Target<'_>, path: String) -> RpcResult<serde_json::Value> {
    match stat(t, &path).await {
        Ok(_) => return Err(RpcError::new(Code::AlreadyExists, format!("{path} already exists"))),
        Err(e) if e.code == Code::NotFound => {}
        Err(e) => return Err(e),
    }
    t.edge.run_step(&t.caller, &t.id, None, StepOp::Mkdir { path: path.clone(), parents: true, mode: 0o755 }).await?;
    Ok(json!({"entry": entry(&path, stat(t, &path).await?)}))
}

async fn list_dir(t: &Target<'_>, root: String, depth: u32) -> RpcResult<serde_json::Value> {
    let depth = depth.clamp(1, MAX_DEPTH);
    let mut out: Vec<(String, FileStat)> = Vec::new();
    let mut level = vec![root.clone()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in level {
            let entries = match t.edge.call(&t.caller, &t.id, AgentRequest::ListDir { path: dir.clone() }).await {
                Ok(Reply::Dir(e)) => e,
                Ok(other) => return Err(RpcError::new(Code::Internal, format!("unexpected agent reply {other:?}"))),
                // The root must be listable; a subdirectory that vanished
                // or cannot be read mid-walk is skipped, as envd's walk does.
                Err(e) if dir == root => return Err(e.into()),
                Err(_) => continue,
            };
            for s in entries {
                let path = format!("{}/{}", dir.trim_end_matches('/'), s.name);
                if s.kind == FileKind::Dir {
                    next.push(path.clone());
                }
                out.push((path, s));
                if out.len() > MAX_ENTRIES {
                    return Err(RpcError::new(Code::ResourceExhausted, format!("more than {MAX_ENTRIES} entries under {root}")));
                }
            }
        }
        level = next;
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(json!({"entries": out.iter().map(|(p, s)| entry(p, s.clone())).collect::<Vec<_>>()}))
}

/// A rename has no agent operation of its own: it is `mv` run in the
/// sandbox, as the caller's user.
async fn move_entry(t: &Target<'_>, from: &str, to: &str, user: Option<String>) -> RpcResult<serde_json::Value> {
    stat(t, from).await?;
    let spec = ExecSpec {
        command: Command::Argv(vec!["mv".into(), "-T".into(), "--".into(), from.into(), to.into()]),
        env: vec![],
        cwd: None,
        user,
        stdin: Stdin::Null,
        stream_output: false,
        timeout_ms: Some(60_000),
        kill_grace_ms: convert::KILL_GRACE_MS,
        max_output_bytes: 64 << 10,
        session: None,
    };
    match t.edge.run_step(&t.caller, &t.id, None, StepOp::Exec { spec }).await? {
        Reply::Exited(r) if r.exit_code == Some(0) => Ok(json!({"entry": entry(to, stat(t, to).await?)})),
        Reply::Exited(r) => Err(RpcError::new(
            Code::FailedPrecondition,
            format!("moving {from} to {to} failed: {}", String::from_utf8_lossy(&r.stderr).trim()),
        )),
        other => Err(RpcError::new(Code::Internal, format!("unexpected agent reply {other:?}"))),
    }
}

/// envd's `EntryInfo`.
pub fn entry(path: &str, s: FileStat) -> serde_json::Value {
    let (kind, letter) = match s.kind {
        FileKind::Dir => ("FILE_TYPE_DIRECTORY", 'd'),
        FileKind::Symlink => ("FILE_TYPE_SYMLINK", 'L'),
        FileKind::File | FileKind::Other => ("FILE_TYPE_FILE", '-'),
    };
    let name = path.rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or("/");
    let mut v = json!({
        "name": name,
        "type": kind,
        "path": path,
        "size": s.size.to_string(),
        "mode": s.mode,
        "permissions": permissions(letter, s.mode),
        "owner": id_name(s.uid),
        "group": id_name(s.gid),
        "modifiedTime": dsec_image::rfc3339_millis(u64::try_from(s.mtime).unwrap_or(0) * 1000),
    });
    if let Some(target) = s.link_target {
        v["symlinkTarget"] = json!(target);
    }
    v
}

/// The agent reports numeric ids; `root` is the one name every image has.
fn id_name(id: u32) -> String {
    if id == 0 {
        "root".into()
    } else {
        id.to_string()
    }
}

/// `ls -l`'s permission string, as Go's `FileMode.String()` writes it.
fn permissions(kind: char, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(kind);
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_like_envd() {
        let s =
            FileStat { name: "a.txt".into(), kind: FileKind::File, size: 5, mode: 0o644, uid: 0, gid: 1000, mtime: 0, link_target: None };
        let e = entry("/tmp/a.txt", s);
        assert_eq!(e["name"], "a.txt");
        assert_eq!(e["size"], "5", "int64 is a string in protobuf JSON");
        assert_eq!(e["permissions"], "-rw-r--r--");
        assert_eq!((e["owner"].as_str(), e["group"].as_str()), (Some("root"), Some("1000")));
        assert_eq!(permissions('d', 0o755), "drwxr-xr-x");
    }

    #[test]
    fn relative_paths_start_at_the_users_home() {
        assert_eq!(absolute("/etc", None).unwrap(), "/etc");
        assert_eq!(absolute("x/y", Some("user")).unwrap(), "/home/user/x/y");
        assert_eq!(absolute("./x", None).unwrap(), "/root/x");
        assert!(absolute("", None).is_err());
    }
}
