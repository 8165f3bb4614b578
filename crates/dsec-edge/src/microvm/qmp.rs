//! A minimal QMP client: one connection per command (QEMU serves one QMP
//! client at a time; connecting fresh keeps no state in the edge that an
//! edge restart could lose, and costs well under a millisecond).

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::error::EdgeError;

const QMP_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `command` (e.g. `stop`, `cont`) and returns its `return` value.
pub async fn execute(socket: &Path, command: &str) -> Result<serde_json::Value, EdgeError> {
    execute_with(socket, command, serde_json::Value::Null).await
}

/// Runs `command` with `arguments` (an object; `Null` for none).
pub async fn execute_with(socket: &Path, command: &str, arguments: serde_json::Value) -> Result<serde_json::Value, EdgeError> {
    tokio::time::timeout(QMP_TIMEOUT, exchange(socket, command, arguments))
        .await
        .map_err(|_| EdgeError::Timeout(format!("QMP {command} on {}", socket.display())))?
}

async fn exchange(socket: &Path, command: &str, arguments: serde_json::Value) -> Result<serde_json::Value, EdgeError> {
    let err = |what: &str, e: &dyn std::fmt::Display| EdgeError::Internal(format!("QMP {command}: {what}: {e}"));
    let stream = UnixStream::connect(socket).await.map_err(|e| err("connect", &e))?;
    let (rd, mut wr) = stream.into_split();
    let mut lines = BufReader::new(rd).lines();
    // The greeting, then capabilities negotiation, then the command.
    next_reply(&mut lines, command).await?;
    wr.write_all(b"{\"execute\":\"qmp_capabilities\"}\n").await.map_err(|e| err("write", &e))?;
    next_reply(&mut lines, command).await?;
    let msg = if arguments.is_null() {
        serde_json::json!({ "execute": command })
    } else {
        serde_json::json!({ "execute": command, "arguments": arguments })
    };
    wr.write_all(format!("{msg}\n").as_bytes()).await.map_err(|e| err("write", &e))?;
    next_reply(&mut lines, command).await
}

/// The next line that is not an asynchronous event.
async fn next_reply(
    lines: &mut tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    command: &str,
) -> Result<serde_json::Value, EdgeError> {
    loop {
        let line = lines
            .next_line()
            .await
            .map_err(|e| EdgeError::Internal(format!("QMP {command}: read: {e}")))?
            .ok_or_else(|| EdgeError::Internal(format!("QMP {command}: QEMU closed the connection")))?;
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| EdgeError::Internal(format!("QMP {command}: bad reply {line:?}: {e}")))?;
        if v.get("event").is_some() {
            continue;
        }
        if let Some(e) = v.get("error") {
            return Err(EdgeError::Internal(format!("QMP {command} failed: {e}")));
        }
        return Ok(v.get("return").or_else(|| v.get("QMP")).cloned().unwrap_or(serde_json::Value::Null));
    }
}
