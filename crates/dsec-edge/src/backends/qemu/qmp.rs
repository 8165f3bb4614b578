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
        if let Some(v) = parse_reply(&line, command)? {
            return Ok(v);
        }
    }
}

/// A blocking QMP connection for multi-step work (suspend, restore,
/// snapshots): one negotiation, then any number of commands, with
/// arguments and descriptors passed along (`getfd`). Used on a blocking
/// thread.
pub struct Session {
    stream: std::os::unix::net::UnixStream,
    reader: std::io::BufReader<std::os::unix::net::UnixStream>,
}

impl Session {
    /// Connects and negotiates capabilities.
    pub fn connect(socket: &Path) -> Result<Self, EdgeError> {
        let stream = std::os::unix::net::UnixStream::connect(socket)
            .map_err(|e| EdgeError::Internal(format!("QMP connect {}: {e}", socket.display())))?;
        stream.set_read_timeout(Some(QMP_TIMEOUT)).map_err(|e| EdgeError::Internal(e.to_string()))?;
        let reader = std::io::BufReader::new(stream.try_clone().map_err(|e| EdgeError::Internal(e.to_string()))?);
        let mut s = Self { stream, reader };
        s.reply("greeting")?;
        s.call("qmp_capabilities", serde_json::Value::Null)?;
        Ok(s)
    }

    /// Runs `command` with `args` (`Null`: none) and returns its `return`.
    pub fn call(&mut self, command: &str, args: serde_json::Value) -> Result<serde_json::Value, EdgeError> {
        use std::io::Write;
        let line = message(command, args);
        self.stream.write_all(line.as_bytes()).map_err(|e| EdgeError::Internal(format!("QMP {command}: write: {e}")))?;
        self.reply(command)
    }

    /// Runs `command` with `fd` attached (SCM_RIGHTS), as `getfd` wants.
    pub fn call_with_fd(
        &mut self,
        command: &str,
        args: serde_json::Value,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<serde_json::Value, EdgeError> {
        use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let line = message(command, args);
        let fds = [fd];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut anc = SendAncillaryBuffer::new(&mut space);
        anc.push(SendAncillaryMessage::ScmRights(&fds));
        let n = sendmsg(&self.stream, &[std::io::IoSlice::new(line.as_bytes())], &mut anc, SendFlags::NOSIGNAL)
            .map_err(|e| EdgeError::Internal(format!("QMP {command}: sendmsg: {e}")))?;
        if n != line.len() {
            return Err(EdgeError::Internal(format!("QMP {command}: short write")));
        }
        self.reply(command)
    }

    fn reply(&mut self, command: &str) -> Result<serde_json::Value, EdgeError> {
        use std::io::BufRead;
        loop {
            let mut line = String::new();
            let n = self.reader.read_line(&mut line).map_err(|e| EdgeError::Internal(format!("QMP {command}: read: {e}")))?;
            if n == 0 {
                return Err(EdgeError::Internal(format!("QMP {command}: QEMU closed the connection")));
            }
            if let Some(v) = parse_reply(&line, command)? {
                return Ok(v);
            }
        }
    }
}

fn message(command: &str, args: serde_json::Value) -> String {
    let msg = if args.is_null() {
        serde_json::json!({ "execute": command })
    } else {
        serde_json::json!({ "execute": command, "arguments": args })
    };
    format!("{msg}\n")
}

/// A reply's value; `None` for an asynchronous event.
fn parse_reply(line: &str, command: &str) -> Result<Option<serde_json::Value>, EdgeError> {
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| EdgeError::Internal(format!("QMP {command}: bad reply {line:?}: {e}")))?;
    if v.get("event").is_some() {
        return Ok(None);
    }
    if let Some(e) = v.get("error") {
        return Err(EdgeError::Internal(format!("QMP {command} failed: {e}")));
    }
    Ok(Some(v.get("return").or_else(|| v.get("QMP")).cloned().unwrap_or(serde_json::Value::Null)))
}
