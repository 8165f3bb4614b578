//! The few agent operations a build step needs, on a sandbox of the edge:
//! run a command, stat a path, read a small file, put a tar archive in
//! place, and take one out.

use dsec_edge::agent::{CallEvent, Command, ErrorKind, ExecResult, ExecSpec, FileStat, Reply, Stdin, MAX_CHUNK_BYTES};
use dsec_edge::{AgentRequest, Caller, Edge, EdgeError, StepOp, UploadStart};

/// Output kept per stream of a RUN step: enough for the error message of a
/// failing step (its tail) without holding a flood.
pub const MAX_STEP_OUTPUT: u64 = 1 << 20;

/// Files read for a build's own purposes (`/etc/passwd`) are small.
const MAX_SMALL_FILE: u64 = 4 << 20;

pub struct Exec<'a> {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: &'a str,
    pub user: &'a str,
    pub timeout_ms: Option<u64>,
}

pub async fn exec(edge: &Edge, caller: &Caller, id: &str, e: Exec<'_>) -> Result<ExecResult, EdgeError> {
    let spec = ExecSpec {
        command: Command::Argv(e.argv),
        env: e.env,
        cwd: Some(e.cwd.to_string()),
        user: Some(e.user.to_string()),
        stdin: Stdin::Null,
        stream_output: false,
        timeout_ms: e.timeout_ms,
        kill_grace_ms: 2_000,
        max_output_bytes: MAX_STEP_OUTPUT,
        session: None,
    };
    edge.exec(caller, id, spec).await
}

/// The entry at `path` (symlinks not followed), or `None` if there is none.
pub async fn stat(edge: &Edge, caller: &Caller, id: &str, path: &str) -> Result<Option<FileStat>, EdgeError> {
    match edge.call(caller, id, AgentRequest::Stat { path: path.to_string() }).await {
        Ok(Reply::Stat(s)) => Ok(Some(s)),
        Ok(other) => Err(EdgeError::UnexpectedReply { peer: "the agent", op: "stat", reply: format!("{other:?}") }),
        Err(EdgeError::Agent(e)) if matches!(e.kind, ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A small file's content, or `None` if it does not exist.
pub async fn read_small(edge: &Edge, caller: &Caller, id: &str, path: &str) -> Result<Option<Vec<u8>>, EdgeError> {
    let req = AgentRequest::ReadFile { path: path.to_string(), offset: 0, limit: Some(MAX_SMALL_FILE) };
    match take(edge, caller, id, req).await {
        Ok(bytes) => Ok(Some(bytes)),
        Err(EdgeError::Agent(e)) if matches!(e.kind, ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A tar archive of `path` in the sandbox (its entries named relative to
/// `path`).
pub async fn tar_out(edge: &Edge, caller: &Caller, id: &str, path: &str) -> Result<Vec<u8>, EdgeError> {
    take(edge, caller, id, AgentRequest::TarCreate { path: path.to_string() }).await
}

async fn take(edge: &Edge, caller: &Caller, id: &str, req: AgentRequest) -> Result<Vec<u8>, EdgeError> {
    let (mut call, _activity) = edge.open(caller, id, req).await?;
    let mut out = Vec::new();
    loop {
        match call.recv().await.map_err(EdgeError::from)? {
            Some(CallEvent::Data { data, .. }) => out.extend_from_slice(&data),
            Some(CallEvent::Reply(Ok(_))) | None => return Ok(out),
            Some(CallEvent::Reply(Err(e))) => return Err(EdgeError::Agent(e)),
        }
    }
}

/// Extracts `archive` into directory `path` (created if missing, merged
/// if present), all or nothing. Goes through the sandbox's trajectory log
/// like any upload.
pub async fn tar_in(edge: &Edge, caller: &Caller, id: &str, path: &str, archive: &[u8]) -> Result<(), EdgeError> {
    let op = StepOp::ExtractArchive { path: path.to_string(), max_bytes: archive.len() as u64 + 1, digest: String::new(), bytes: 0 };
    let (ticket, call, activity) = match edge.begin_upload(caller, id, None, &op).await? {
        UploadStart::Fresh { ticket, call, activity } => (ticket, call, activity),
        UploadStart::Recorded(_) => return Err(EdgeError::Invariant("an upload without a step id is never recorded")),
    };
    let (tx, mut rx) = call.into_split();
    let send = async move {
        for piece in archive.chunks(MAX_CHUNK_BYTES) {
            if tx.send_data(piece).await.is_err() {
                return Ok::<(), EdgeError>(());
            }
        }
        let _ = tx.send_eof();
        Ok(())
    };
    let result = rx.reply_while(send).await.and_then(|r| r.map_err(EdgeError::Agent));
    drop(activity);
    let digest = dsec_edge::trajectory::journal::sha256_hex(archive);
    let done = StepOp::ExtractArchive { path: path.to_string(), max_bytes: archive.len() as u64 + 1, digest, bytes: archive.len() as u64 };
    edge.finish_upload(ticket, &done, None, &result).await;
    result.map(|_| ())
}
