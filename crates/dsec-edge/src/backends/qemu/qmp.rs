//! A minimal QMP client: one connection per command (QEMU serves one QMP
//! client at a time; connecting fresh keeps no state in the edge that an
//! edge restart could lose, and costs well under a millisecond).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::error::EdgeError;

const QMP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a QMP command got no answer, or a refusal.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP {command}: {step}: {source}")]
    Io {
        command: String,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP {command}: QEMU closed the connection")]
    Closed { command: String },
    #[error("QMP {command}: short write")]
    ShortWrite { command: String },
    #[error("QMP {command}: bad reply {line:?}: {source}")]
    BadReply {
        command: String,
        line: String,
        #[source]
        source: serde_json::Error,
    },
    /// QEMU answered with an error object.
    #[error("QMP {command} failed: {error}")]
    Failed { command: String, error: serde_json::Value },
    #[error("QMP {command} on {}", .socket.display())]
    Timeout { command: String, socket: PathBuf },
}

impl QmpError {
    fn io<'a>(command: &'a str, step: &'static str) -> impl FnOnce(std::io::Error) -> QmpError + 'a {
        move |source| QmpError::Io { command: command.into(), step, source }
    }
}

impl From<QmpError> for EdgeError {
    fn from(e: QmpError) -> Self {
        match e {
            QmpError::Timeout { .. } => EdgeError::Timeout(e.to_string()),
            other => EdgeError::Qmp(Box::new(other)),
        }
    }
}

/// Runs `command` (e.g. `stop`, `cont`) and returns its `return` value.
pub async fn execute(socket: &Path, command: &str) -> Result<serde_json::Value, QmpError> {
    execute_with(socket, command, serde_json::Value::Null).await
}

/// Runs `command` with `arguments` (an object; `Null` for none).
pub async fn execute_with(socket: &Path, command: &str, arguments: serde_json::Value) -> Result<serde_json::Value, QmpError> {
    tokio::time::timeout(QMP_TIMEOUT, exchange(socket, command, arguments))
        .await
        .map_err(|_| QmpError::Timeout { command: command.into(), socket: socket.to_path_buf() })?
}

async fn exchange(socket: &Path, command: &str, arguments: serde_json::Value) -> Result<serde_json::Value, QmpError> {
    let stream = UnixStream::connect(socket).await.map_err(QmpError::io(command, "connect"))?;
    let (rd, mut wr) = stream.into_split();
    let mut lines = BufReader::new(rd).lines();
    // The greeting, then capabilities negotiation, then the command.
    next_reply(&mut lines, command).await?;
    wr.write_all(b"{\"execute\":\"qmp_capabilities\"}\n").await.map_err(QmpError::io(command, "write"))?;
    next_reply(&mut lines, command).await?;
    let msg = if arguments.is_null() {
        serde_json::json!({ "execute": command })
    } else {
        serde_json::json!({ "execute": command, "arguments": arguments })
    };
    wr.write_all(format!("{msg}\n").as_bytes()).await.map_err(QmpError::io(command, "write"))?;
    next_reply(&mut lines, command).await
}

/// The next line that is not an asynchronous event.
async fn next_reply(
    lines: &mut tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    command: &str,
) -> Result<serde_json::Value, QmpError> {
    loop {
        let line =
            lines.next_line().await.map_err(QmpError::io(command, "read"))?.ok_or_else(|| QmpError::Closed { command: command.into() })?;
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
    pub fn connect(socket: &Path) -> Result<Self, QmpError> {
        let stream = std::os::unix::net::UnixStream::connect(socket).map_err(|source| QmpError::Io {
            command: format!("connect {}", socket.display()),
            step: "connect",
            source,
        })?;
        stream.set_read_timeout(Some(QMP_TIMEOUT)).map_err(QmpError::io("connect", "set a read timeout"))?;
        let reader = std::io::BufReader::new(stream.try_clone().map_err(QmpError::io("connect", "clone the socket"))?);
        let mut s = Self { stream, reader };
        s.reply("greeting")?;
        s.call("qmp_capabilities", serde_json::Value::Null)?;
        Ok(s)
    }

    /// Runs `command` with `args` (`Null`: none) and returns its `return`.
    pub fn call(&mut self, command: &str, args: serde_json::Value) -> Result<serde_json::Value, QmpError> {
        use std::io::Write;
        let line = message(command, args);
        self.stream.write_all(line.as_bytes()).map_err(QmpError::io(command, "write"))?;
        self.reply(command)
    }

    /// Runs `command` with `fd` attached (SCM_RIGHTS), as `getfd` wants.
    pub fn call_with_fd(
        &mut self,
        command: &str,
        args: serde_json::Value,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<serde_json::Value, QmpError> {
        use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let line = message(command, args);
        let fds = [fd];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut anc = SendAncillaryBuffer::new(&mut space);
        anc.push(SendAncillaryMessage::ScmRights(&fds));
        let n = sendmsg(&self.stream, &[std::io::IoSlice::new(line.as_bytes())], &mut anc, SendFlags::NOSIGNAL)
            .map_err(|e| QmpError::Io { command: command.into(), step: "sendmsg", source: e.into() })?;
        if n != line.len() {
            return Err(QmpError::ShortWrite { command: command.into() });
        }
        self.reply(command)
    }

    fn reply(&mut self, command: &str) -> Result<serde_json::Value, QmpError> {
        use std::io::BufRead;
        loop {
            let mut line = String::new();
            let n = self.reader.read_line(&mut line).map_err(QmpError::io(command, "read"))?;
            if n == 0 {
                return Err(QmpError::Closed { command: command.into() });
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
fn parse_reply(line: &str, command: &str) -> Result<Option<serde_json::Value>, QmpError> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|source| QmpError::BadReply {
        command: command.into(),
        line: line.trim_end().into(),
        source,
    })?;
    if v.get("event").is_some() {
        return Ok(None);
    }
    if let Some(e) = v.get("error") {
        return Err(QmpError::Failed { command: command.into(), error: e.clone() });
    }
    Ok(Some(v.get("return").or_else(|| v.get("QMP")).cloned().unwrap_or(serde_json::Value::Null)))
}
