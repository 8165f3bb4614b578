//! One runner: a container sandbox running the FnCall monitor (the guest
//! agent's `fncall-monitor` mode, which starts the Python zygote, or for
//! other languages the agent's exec zygote), and the
//! edge's connection to it. The monitor is started through the guest agent,
//! whose exec stream brings its ready line, its stderr and its end; requests
//! and answers then go over the monitor's own Unix socket, which the edge
//! reaches from the host beneath the sandbox's root (Edge::container_root),
//! so that no agent relays them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dsec_agent_proto::client::{CallEvent, CallReceiver, CallSender};
use dsec_agent_proto::fncall::MONITOR_SOCKET;
use dsec_agent_proto::{Command, ExecSpec, Stdin, Stream, WriteFileSpec};
use dsec_edge::{ActivityGuard, AgentRequest, Caller, Edge, SandboxRequest};
use dsec_fncall_runner::{EXEC_ZYGOTE_FLAG, MONITOR_MODE, ZYGOTE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::config::FnCallConfig;
use crate::error::FnCallError;
use crate::protocol::{frame, ZReady, ZRequest, ZResponse};
use crate::{RUNNER_LABEL, RUNNER_TENANT};

/// Where the runner gets zygote.py (root-only), whose path the monitor is
/// given.
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
/// Bytes asked of the monitor's socket per read.
const READ_CHUNK: usize = 64 << 10;
/// How long a runner whose monitor closed its socket is given to say why
/// (its stderr and exit status, from the agent).
const LAST_WORDS: Duration = Duration::from_secs(1);

/// Writes one of the runner's own files (the monitor, the monitor) into
/// the runner, usable by root only.
async fn install(edge: &Edge, id: &str, path: &str, data: &[u8]) -> Result<(), FnCallError> {
    let spec =
        WriteFileSpec { path: path.into(), mode: 0o700, append: false, create_parents: true, max_bytes: data.len() as u64, owner: None };
    let (call, _activity) = edge.open(&runner_caller(), id, AgentRequest::WriteFile(spec)).await?;
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
    /// The monitor's socket: requests and answers.
    link: UnixStream,
    /// The monitor's command on the agent: held so that its stdin stays
    /// open; its stdout (only the ready line), stderr and end come on
    /// `receiver`.
    _sender: CallSender,
    receiver: CallReceiver,
    /// The monitor's command ended (its status, for diagnostics).
    exited: Option<String>,
    _activity: ActivityGuard,
    buf: Vec<u8>,
    stderr: Vec<u8>,
    next_id: u64,
    pub calls: u64,
    /// Source hash of the compiled program installed in the runner.
    pub installed: Option<[u8; 32]>,
    pub idle_since: Instant,
}

/// The monitor's first stdout line, read from its command's stream.
async fn ready_line(receiver: &mut CallReceiver, stderr: &mut Vec<u8>) -> Result<Vec<u8>, FnCallError> {
    let mut out = Vec::new();
    loop {
        if let Some(nl) = out.iter().position(|b| *b == b'\n') {
            out.truncate(nl);
            return Ok(out);
        }
        if out.len() > MAX_LINE {
            return Err(FnCallError::RunnerFailed("the monitor sent an over-long ready line".into()));
        }
        match receiver.recv().await {
            Ok(Some(CallEvent::Data { stream: Stream::Stdout, data })) => out.extend_from_slice(&data),
            event => {
                let mut exited = None;
                if !keep_diagnostics(event, stderr, &mut exited) {
                    return Err(FnCallError::RunnerFailed(format!(
                        "the monitor did not start ({}); its stderr: {}",
                        exited.as_deref().unwrap_or("its stream closed"),
                        String::from_utf8_lossy(stderr).trim()
                    )));
                }
            }
        }
    }
}

/// Keeps what the monitor's command stream brings besides the ready line:
/// output (stderr, or stdout the monitor should not write) up to
/// MAX_STDERR, and its end. False once the command has ended (or its
/// stream failed), with `exited` saying how.
fn keep_diagnostics(
    event: Result<Option<CallEvent>, dsec_agent_proto::client::ClientError>,
    stderr: &mut Vec<u8>,
    exited: &mut Option<String>,
) -> bool {
    match event {
        Ok(Some(CallEvent::Data { data, .. })) => {
            let room = MAX_STDERR.saturating_sub(stderr.len());
            stderr.extend_from_slice(&data[..data.len().min(room)]);
            true
        }
        Ok(Some(CallEvent::Reply(r))) => {
            *exited = Some(format!("exited: {r:?}"));
            false
        }
        Ok(None) => {
            *exited = Some("exited".into());
            false
        }
        Err(e) => {
            *exited = Some(format!("the runner's channel failed: {e}"));
            false
        }
    }
}

impl Runner {
    /// Creates the runner's sandbox and starts the monitor in it. On any
    /// failure after the sandbox exists, the sandbox is removed.
    pub async fn start(edge: &Edge, cfg: &FnCallConfig, language: &str, memory_mb: u64) -> Result<Runner, FnCallError> {
        let caller = runner_caller();
        let req = SandboxRequest {
            image: cfg.image.clone(),
            memory_mb: Some(memory_mb),
            cpu_cores: Some(cfg.runner_cpu_cores),
            cpu_quota_cores: Some(cfg.runner_cpu_quota_cores.max(cfg.runner_cpu_cores)),
            disk_mb: Some(cfg.runner_disk_mb),
            pids: Some(cfg.runner_pids),
            qos_class: Some(cfg.runner_qos_class),
            volumes: Default::default(),
            idle_ttl_s: Some(0),
            max_lifetime_s: Some(0),
            labels: BTreeMap::from([(RUNNER_LABEL.to_string(), language.to_string())]),
            // Each call's scratch files come and go in the writable layer:
            // in memory they cost less than on the node's disk.
            writable_layer_in_memory: true,
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
        let mut command = vec![MONITOR_PATH.into(), MONITOR_MODE.into(), ZYGOTE_PATH.into()];
        if language != "python" {
            // Every step of this runner execs a program: a zygote without
            // the warm interpreter forks far more cheaply (the agent's
            // exec zygote, dsec-fncall-runner's exec_zygote.rs).
            command.push(EXEC_ZYGOTE_FLAG.into());
        }
        let spec = ExecSpec {
            command: Command::Argv(command),
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
        let (call, activity) = edge.open(&runner_caller(), &id, AgentRequest::Exec(spec)).await?;
        let (sender, mut receiver) = call.into_split();
        let mut stderr = Vec::new();
        let line = ready_line(&mut receiver, &mut stderr).await?;
        let ready: ZReady =
            serde_json::from_slice(&line).map_err(|e| FnCallError::RunnerFailed(format!("bad ready line from the monitor: {e}")))?;
        // The monitor listens before it says it is ready.
        let socket = edge.container_root(&runner_caller(), &id).await?.join(MONITOR_SOCKET.trim_start_matches('/'));
        let link = UnixStream::connect(&socket)
            .await
            .map_err(|e| FnCallError::RunnerFailed(format!("connecting to the monitor at {}: {e}", socket.display())))?;
        let runner = Runner {
            id,
            language: language.to_string(),
            link,
            _sender: sender,
            receiver,
            exited: None,
            _activity: activity,
            buf: Vec::new(),
            stderr,
            next_id: 1,
            calls: 0,
            installed: None,
            idle_since: Instant::now(),
        };
        if !ready.ready || !ready.languages.iter().any(|l| l == language) {
            return Err(FnCallError::RunnerFailed(format!("image {:?} cannot run {language} (it has {:?})", cfg.image, ready.languages)));
        }
        tracing::debug!(runner = %runner.id, %language, preloaded = ?ready.preloaded, "runner ready");
        Ok(runner)
    }

    /// Sends one request and waits for its answer, at most `deadline`.
    /// Any error leaves the runner unusable (the caller retires it); a
    /// runner gone or broken under the request is `RunnerLost`.
    pub async fn request(&mut self, mut req: ZRequest<'_>, deadline: Duration) -> Result<ZResponse, FnCallError> {
        req.id = self.next_id;
        self.next_id += 1;
        self.calls += 1;
        let bytes = frame(&req);
        let id = req.id;
        let exchange = async {
            if let Err(e) = self.link.write_all(&bytes).await {
                return Err(self.gone(&format!("sending to the monitor: {e}")).await);
            }
            let line = self.read_line().await?;
            let mut resp: ZResponse =
                serde_json::from_slice(&line).map_err(|e| FnCallError::RunnerLost(format!("bad answer from the monitor: {e}")))?;
            if resp.raw.is_empty() {
                resp.out = crate::judge::unb64(&resp.stdout);
                resp.err = crate::judge::unb64(&resp.stderr);
            } else {
                let data = self.read_exact(resp.raw_len()).await?;
                resp.take_raw(data);
            }
            if resp.fatal || resp.id != Some(id) {
                return Err(FnCallError::RunnerLost(format!(
                    "the monitor answered out of turn: {}",
                    resp.error.as_deref().unwrap_or("no id")
                )));
            }
            Ok(resp)
        };
        match tokio::time::timeout(deadline, exchange).await {
            Ok(r) => r,
            Err(_) => Err(FnCallError::RunnerLost(format!("runner {} did not answer within {deadline:?}", self.id))),
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
                return Err(FnCallError::RunnerLost("the monitor sent an over-long line".into()));
            }
            self.fill().await?;
        }
    }

    async fn read_exact(&mut self, n: usize) -> Result<Vec<u8>, FnCallError> {
        if n > MAX_LINE {
            return Err(FnCallError::RunnerLost(format!("the monitor announced {n} bytes")));
        }
        while self.buf.len() < n {
            self.fill().await?;
        }
        let rest = self.buf.split_off(n);
        Ok(std::mem::replace(&mut self.buf, rest))
    }

    /// Appends what the monitor sends next to the buffer. Meanwhile the
    /// monitor's stderr is kept (and its stream credited, so that writing
    /// it never blocks the monitor).
    async fn fill(&mut self) -> Result<(), FnCallError> {
        self.buf.reserve(READ_CHUNK);
        loop {
            tokio::select! {
                read = self.link.read_buf(&mut self.buf) => {
                    return match read {
                        Ok(0) => Err(self.gone("the monitor closed its socket").await),
                        Ok(_) => Ok(()),
                        Err(e) => Err(self.gone(&format!("reading from the monitor: {e}")).await),
                    };
                }
                event = self.receiver.recv(), if self.exited.is_none() => {
                    if !keep_diagnostics(event, &mut self.stderr, &mut self.exited) {
                        return Err(self.gone("the monitor's command ended").await);
                    }
                }
            }
        }
    }

    /// The error of a runner whose monitor is gone, with its last words:
    /// its stderr and exit status, given a moment to arrive.
    async fn gone(&mut self, what: &str) -> FnCallError {
        let _ = tokio::time::timeout(LAST_WORDS, async {
            while self.exited.is_none() {
                let event = self.receiver.recv().await;
                keep_diagnostics(event, &mut self.stderr, &mut self.exited);
            }
        })
        .await;
        FnCallError::RunnerLost(format!(
            "{what} ({}); its stderr: {}",
            self.exited.as_deref().unwrap_or("still running"),
            String::from_utf8_lossy(&self.stderr).trim()
        ))
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
