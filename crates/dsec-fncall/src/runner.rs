//! One runner: a container sandbox running the FnCall monitor (the guest
//! agent's `fncall-monitor` mode, which starts the Python zygote), and the
//! edge's end of the monitor's stdin/stdout.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dsec_agent_proto::client::{CallEvent, CallReceiver, CallSender};
use dsec_agent_proto::{Command, ExecSpec, Op, Stdin, Stream, WriteFileSpec};
use dsec_edge::{ActivityGuard, Caller, Edge, SandboxRequest};

use crate::config::FnCallConfig;
use crate::error::FnCallError;
use crate::protocol::{frame, ZReady, ZRequest, ZResponse};
use crate::{RUNNER_LABEL, RUNNER_TENANT};

/// The zygote's source, written into each runner (root-only) at start.
pub const ZYGOTE: &str = include_str!("zygote.py");
const ZYGOTE_PATH: &str = "/usr/local/lib/dsec-fncall-zygote.py";
/// Where the runner gets a copy of the edge's (statically linked) guest
/// agent binary, run as `fncall-monitor`: the image's own files stay as
/// they are, and the monitor is the agent the edge already trusts.
const MONITOR_PATH: &str = "/usr/local/lib/dsec-fncall-monitor";

/// A response line longer than this is a protocol violation (the monitor
/// caps outputs and fetched files well below it).
const MAX_LINE: usize = 96 << 20;
/// Stderr of the monitor kept for diagnostics.
const MAX_STDERR: usize = 16 << 10;

/// Writes one of the runner's own files (the monitor, the monitor) into
/// the runner, usable by root only.
async fn install(edge: &Edge, id: &str, path: &str, data: &[u8]) -> Result<(), FnCallError> {
    let spec = WriteFileSpec {
        path: path.into(),
        mode: 0o700,
        append: false,
        create_parents: true,
        max_bytes: data.len() as u64,
        owner: None,
    };
    let (call, _activity) = edge.open(&runner_caller(), id, Op::WriteFile(spec)).await?;
    let failed = |e: &dyn std::fmt::Display| FnCallError::RunnerFailed(format!("writing {path} into {id}: {e}"));
    call.send_data(data).await.map_err(|e| failed(&e))?;
    call.send_eof().map_err(|e| failed(&e))?;
    match call.collect().await.map_err(|e| failed(&e))?.1 {
        Ok(_) => Ok(()),
        Err(e) => Err(failed(&e)),
    }
}

pub fn runner_caller() -> Caller {
    Caller { tenant: RUNNER_TENANT.into(), admin: false }
}

pub struct Runner {
    pub id: String,
    pub language: String,
    sender: CallSender,
    receiver: CallReceiver,
    _activity: ActivityGuard,
    buf: Vec<u8>,
    stderr: Vec<u8>,
    next_id: u64,
    pub calls: u64,
    /// Source hash of the compiled program installed in the runner.
    pub installed: Option<[u8; 32]>,
    pub idle_since: Instant,
}

impl Runner {
    /// Creates the runner's sandbox and starts the monitor in it. On any
    /// failure after the sandbox exists, the sandbox is removed.
    pub async fn start(edge: &Edge, cfg: &FnCallConfig, language: &str) -> Result<Runner, FnCallError> {
        let caller = runner_caller();
        let req = SandboxRequest {
            image: cfg.image.clone(),
            memory_mb: Some(cfg.runner_memory_mb),
            cpu_cores: Some(cfg.runner_cpu_cores),
            cpu_quota_cores: Some(cfg.runner_cpu_quota_cores.max(cfg.runner_cpu_cores)),
            disk_mb: Some(cfg.runner_disk_mb),
            pids: Some(cfg.runner_pids),
            idle_ttl_s: Some(0),
            max_lifetime_s: Some(0),
            labels: BTreeMap::from([(RUNNER_LABEL.to_string(), language.to_string())]),
            ..Default::default()
        };
        let rec = edge.create(&caller, req).await?;
        match tokio::time::timeout(cfg.start_timeout, Self::attach(edge, cfg, language, rec.id.clone())).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                let _ = edge.delete(&caller, &rec.id).await;
                Err(e)
            }
            Err(_) => {
                let _ = edge.delete(&caller, &rec.id).await;
                Err(FnCallError::RunnerFailed(format!("runner {} did not become ready in {:?}", rec.id, cfg.start_timeout)))
            }
        }
    }

    async fn attach(edge: &Edge, cfg: &FnCallConfig, language: &str, id: String) -> Result<Runner, FnCallError> {
        let agent_path = &edge.config().agent_path;
        let monitor = tokio::fs::read(agent_path)
            .await
            .map_err(|e| FnCallError::RunnerFailed(format!("reading the guest agent {}: {e}", agent_path.display())))?;
        install(edge, &id, MONITOR_PATH, &monitor).await?;
        install(edge, &id, ZYGOTE_PATH, ZYGOTE.as_bytes()).await?;
        let spec = ExecSpec {
            command: Command::Argv(vec![MONITOR_PATH.into(), "fncall-monitor".into(), ZYGOTE_PATH.into()]),
            env: vec![("DSEC_FNCALL_PRELOAD".into(), cfg.preload.join(","))],
            cwd: Some("/".into()),
            user: Some("root".into()),
            stdin: Stdin::Stream,
            stream_output: true,
            timeout_ms: None,
            kill_grace_ms: 0,
            max_output_bytes: u64::MAX,
            session: None,
        };
        let (call, activity) = edge.open(&runner_caller(), &id, Op::Exec(spec)).await?;
        let (sender, receiver) = call.into_split();
        let mut runner = Runner {
            id,
            language: language.to_string(),
            sender,
            receiver,
            _activity: activity,
            buf: Vec::new(),
            stderr: Vec::new(),
            next_id: 1,
            calls: 0,
            installed: None,
            idle_since: Instant::now(),
        };
        let line = runner.read_line().await?;
        let ready: ZReady = serde_json::from_slice(&line)
            .map_err(|e| FnCallError::RunnerFailed(format!("bad ready line from the monitor: {e}")))?;
        if !ready.ready || !ready.languages.iter().any(|l| l == language) {
            return Err(FnCallError::RunnerFailed(format!(
                "image {:?} cannot run {language} (it has {:?})",
                cfg.image, ready.languages
            )));
        }
        tracing::debug!(runner = %runner.id, %language, preloaded = ?ready.preloaded, "runner ready");
        Ok(runner)
    }

    /// Sends one request and waits for its answer, at most `deadline`.
    /// Any error leaves the runner unusable (the caller retires it).
    pub async fn request(&mut self, mut req: ZRequest<'_>, deadline: Duration) -> Result<ZResponse, FnCallError> {
        req.id = self.next_id;
        self.next_id += 1;
        self.calls += 1;
        let bytes = frame(&req);
        let id = req.id;
        let exchange = async {
            self.sender.send_data(&bytes).await.map_err(|e| FnCallError::RunnerFailed(format!("sending to the monitor: {e}")))?;
            let line = self.read_line().await?;
            let mut resp: ZResponse = serde_json::from_slice(&line)
                .map_err(|e| FnCallError::RunnerFailed(format!("bad answer from the monitor: {e}")))?;
            if resp.raw.is_empty() {
                resp.out = crate::judge::unb64(&resp.stdout);
                resp.err = crate::judge::unb64(&resp.stderr);
            } else {
                let data = self.read_exact(resp.raw_len()).await?;
                resp.take_raw(data);
            }
            if resp.fatal || resp.id != Some(id) {
                return Err(FnCallError::RunnerFailed(format!(
                    "the monitor answered out of turn: {}",
                    resp.error.as_deref().unwrap_or("no id")
                )));
            }
            Ok(resp)
        };
        match tokio::time::timeout(deadline, exchange).await {
            Ok(r) => r,
            Err(_) => Err(FnCallError::RunnerFailed(format!("runner {} did not answer within {deadline:?}", self.id))),
        }
    }

    async fn read_line(&mut self) -> Result<Vec<u8>, FnCallError> {
        loop {
            if let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
                let rest = self.buf.split_off(nl + 1);
                let mut line = std::mem::replace(&mut self.buf, rest);
                line.pop();
                return Ok(line);
            }
            if self.buf.len() > MAX_LINE {
                return Err(FnCallError::RunnerFailed("the monitor sent an over-long line".into()));
            }
            self.fill().await?;
        }
    }

    async fn read_exact(&mut self, n: usize) -> Result<Vec<u8>, FnCallError> {
        if n > MAX_LINE {
            return Err(FnCallError::RunnerFailed(format!("the monitor announced {n} bytes")));
        }
        while self.buf.len() < n {
            self.fill().await?;
        }
        let rest = self.buf.split_off(n);
        Ok(std::mem::replace(&mut self.buf, rest))
    }

    /// Appends the monitor's next stdout chunk to the buffer.
    async fn fill(&mut self) -> Result<(), FnCallError> {
        loop {
            match self.receiver.recv().await {
                Ok(Some(CallEvent::Data { stream: Stream::Stdout, data })) => {
                    self.buf.extend_from_slice(&data);
                    return Ok(());
                }
                Ok(Some(CallEvent::Data { data, .. })) => {
                    let room = MAX_STDERR.saturating_sub(self.stderr.len());
                    self.stderr.extend_from_slice(&data[..data.len().min(room)]);
                }
                Ok(Some(CallEvent::Reply(r))) => {
                    return Err(FnCallError::RunnerFailed(format!(
                        "the monitor exited ({r:?}); its stderr: {}",
                        String::from_utf8_lossy(&self.stderr).trim()
                    )))
                }
                Ok(None) => return Err(FnCallError::RunnerFailed("the runner's channel closed".into())),
                Err(e) => return Err(FnCallError::RunnerFailed(format!("the runner's channel failed: {e}"))),
            }
        }
    }

    /// Removes the runner's sandbox (ending the monitor and everything in it).
    pub async fn retire(self, edge: &Edge) {
        let (id, language) = (self.id.clone(), self.language.clone());
        drop(self);
        if let Err(e) = edge.delete(&runner_caller(), &id).await {
            tracing::warn!(runner = %id, %language, error = %e, "removing a runner failed");
        }
    }
}
