//! The trajectory log: every operation that changes a sandbox (exec,
//! buffered or streamed, session open and close, interactive terminals,
//! file and archive uploads, mkdir, remove) is
//! appended, in order, to the sandbox's log in the node's [`Journal`], with
//! its outcome and the files it changed. Reads (stat, list, download) are
//! not logged: they change nothing.
//!
//! Fast-forward: an operation carrying a client step id that is already in
//! the log is not run again; its recorded outcome is returned (even while
//! the sandbox is paused: no resume is needed for that). A step id whose
//! recorded operation differs is a `StepConflict`, never a silent re-run. A
//! step that was running when the edge stopped (or lost the agent) is
//! `interrupted`: whether it took effect is unknown, so its step id answers
//! `StepInterrupted`; the client decides (check the sandbox, then go on
//! with a new step id). A step still running when its id comes again (the
//! client died and came back quickly) is waited for.
//!
//! The log lives outside every sandbox (the edge's state directory) and is
//! read through the edge by the sandbox's owner only; it is dropped with the
//! sandbox's record.

pub mod journal;
pub(crate) mod replay;

use std::sync::Arc;
use std::time::Duration;

use dsec_agent_proto::client::ClientError;
use dsec_agent_proto::{ChangedPath, ExecResult, ExecSpec, Op, PtySpec, Reply, SessionSpec, WriteFileSpec};
use dsec_api::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::backends::instance::Instance;
use crate::edge::{ActivityGuard, Edge, Entry};
use crate::error::EdgeError;
use crate::model::Caller;
use crate::trajectory::journal::{sha256_hex, Begin, StepRow, StepStatus};

/// Paths reported per step, at most.
const MAX_CHANGED_PATHS: u32 = 1000;
/// The walk of the writable layer holds the sandbox's next step: bounded,
/// so an agent that stops answering cannot wedge the sandbox's log.
const WALK_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a re-issued step id polls a step that is still running.
const RUNNING_POLL: Duration = Duration::from_millis(20);

/// An operation as the log records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StepOp {
    Exec {
        spec: ExecSpec,
    },
    OpenSession {
        spec: SessionSpec,
    },
    CloseSession {
        session_id: String,
    },
    /// An upload; `digest` is the SHA-256 of the content.
    WriteFile {
        spec: WriteFileSpec,
        digest: String,
        bytes: u64,
    },
    Mkdir {
        path: String,
        parents: bool,
        mode: u32,
    },
    Remove {
        path: String,
        recursive: bool,
    },
    /// A tar upload extracted into `path`.
    ExtractArchive {
        path: String,
        max_bytes: u64,
        digest: String,
        bytes: u64,
    },
    /// An interactive terminal, from open to exit. Recorded with its exit
    /// status and the files it changed; never fast-forwarded or replayed
    /// (what was typed is not an operation the log can repeat).
    Pty {
        spec: PtySpec,
    },
}

impl StepOp {
    pub fn kind(&self) -> &'static str {
        match self {
            StepOp::Exec { .. } => "exec",
            StepOp::OpenSession { .. } => "open_session",
            StepOp::CloseSession { .. } => "close_session",
            StepOp::WriteFile { .. } => "write_file",
            StepOp::Mkdir { .. } => "mkdir",
            StepOp::Remove { .. } => "remove",
            StepOp::ExtractArchive { .. } => "extract_archive",
            StepOp::Pty { .. } => "pty",
        }
    }

    fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// What two issues of one step must share to be "the same operation".
    pub fn fingerprint(&self) -> String {
        sha256_hex(self.json().as_bytes())
    }

    /// The agent request that carries out a non-upload operation.
    fn agent_op(&self) -> Option<Op> {
        Some(match self.clone() {
            StepOp::Exec { spec } => Op::Exec(spec),
            StepOp::OpenSession { spec } => Op::OpenSession(spec),
            StepOp::CloseSession { session_id } => Op::CloseSession { session_id },
            StepOp::Mkdir { path, parents, mode } => Op::Mkdir { path, parents, mode },
            StepOp::Remove { path, recursive } => Op::Remove { path, recursive },
            StepOp::WriteFile { .. } | StepOp::ExtractArchive { .. } | StepOp::Pty { .. } => return None,
        })
    }
}

/// An outcome as stored: outputs by digest.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StoredOutcome {
    Exited {
        exit_code: Option<i32>,
        signal: Option<i32>,
        stdout: String,
        stderr: String,
        truncated: bool,
        timed_out: bool,
        duration_us: u64,
    },
    Session {
        session_id: String,
    },
    Written {
        bytes: u64,
    },
    Done,
    Failed {
        code: ErrorCode,
        message: String,
    },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct StoredChanges {
    paths: Vec<ChangedPath>,
    truncated: bool,
}

/// One step of a log, for provenance and replay.
#[derive(Debug, Clone)]
pub struct TrajectoryStep {
    pub seq: u64,
    pub step_id: Option<String>,
    pub op: StepOp,
    pub status: StepStatus,
    /// The recorded outcome (with outputs); `None` unless `Done`.
    pub outcome: Option<Result<Reply, (ErrorCode, String)>>,
    /// Files changed while the step ran; `None` when unknown.
    pub changed: Option<Vec<ChangedPath>>,
    pub changed_truncated: bool,
    pub started_ms: u64,
    pub finished_ms: Option<u64>,
}

/// A step the edge has begun to record; finish it with the outcome.
pub struct StepTicket {
    sandbox: String,
    seq: u64,
    since: (i64, u32),
    inst: Arc<Instance>,
    gate: Arc<tokio::sync::Mutex<()>>,
}

/// A re-issued upload whose step id is in the log: the caller hashes the
/// body it was sent, then [`Edge::settle_recorded`] answers.
pub struct RecordedStep {
    sandbox: String,
    row: StepRow,
}

/// What [`Edge::begin_stream`] opens: a command with streamed output
/// (logged) or an interactive terminal (logged as opened, never replayed).
#[derive(Debug, Clone)]
pub enum StreamOp {
    Exec(ExecSpec),
    Pty(PtySpec),
}

/// A finished step's result as the log keeps it: the reply, or the error
/// code and message it failed with.
type RecordedResult = Result<Reply, (ErrorCode, String)>;

/// How a streamed exec or a terminal begins.
pub enum StreamStart {
    /// The step id is in the log: its recorded answer (an exec's output is
    /// in it), and nothing runs.
    Recorded(Result<Reply, EdgeError>),
    /// Run it: relay the call, then [`Edge::finish_stream`].
    Fresh { ticket: StepTicket, call: dsec_agent_proto::client::Call, activity: ActivityGuard },
}

/// The operation a streamed exec is logged as. `stream_output` is how the
/// answer travels, not what ran, so it is left out; the stdin mode stays
/// (a streamed command's stdin comes from its client while it runs, and
/// that input is not kept).
pub fn streamed_exec_op(spec: &ExecSpec) -> StepOp {
    let mut spec = spec.clone();
    spec.stream_output = false;
    StepOp::Exec { spec }
}

/// How an upload begins.
pub enum UploadStart {
    Recorded(RecordedStep),
    /// Run it: feed the call, then [`Edge::finish_upload`].
    Fresh {
        ticket: StepTicket,
        call: dsec_agent_proto::client::Call,
        activity: ActivityGuard,
    },
}

/// The kernel stamps inode times from the coarse clock, which lags the
/// precise one by up to a tick: a change made just after a precise "now"
/// could carry an earlier ctime. Comparing against the coarse clock never
/// misses a change (it may include one made in the same tick before).
fn coarse_now() -> (i64, u32) {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut t) };
    (t.tv_sec, t.tv_nsec as u32)
}

fn journal_err(e: crate::trajectory::journal::JournalError) -> EdgeError {
    EdgeError::Journal(e)
}

impl Edge {
    /// Runs a non-upload operation through the log.
    pub async fn run_step(&self, caller: &Caller, id: &str, step_id: Option<&str>, op: StepOp) -> Result<Reply, EdgeError> {
        let fingerprint = op.fingerprint();
        if let Some(recorded) = self.lookup_step(caller, id, step_id)? {
            return self.settle_recorded(recorded, &op).await;
        }
        let (entry, inst) = self.running(caller, id).await?;
        let _activity = entry.begin();
        let ticket = match self.begin_step(&entry, &inst, id, step_id, &op, &fingerprint).await? {
            Ok(t) => t,
            Err(recorded) => return self.settle_recorded(recorded, &op).await,
        };
        let agent_op = op.agent_op().ok_or(EdgeError::Invariant("uploads go through begin_upload"))?;
        let result = match agent_op {
            Op::Exec(spec) => self.exec_on(&inst, spec).await.map(Reply::Exited),
            other => inst.agent.call(other).await.map_err(EdgeError::from),
        };
        self.finish_step(ticket, &result, None).await;
        result
    }

    /// Starts an upload (`op` is `WriteFile` or `ExtractArchive`; its digest
    /// is not known yet).
    pub async fn begin_upload(&self, caller: &Caller, id: &str, step_id: Option<&str>, op: &StepOp) -> Result<UploadStart, EdgeError> {
        if let Some(recorded) = self.lookup_step(caller, id, step_id)? {
            return Ok(UploadStart::Recorded(recorded));
        }
        let (entry, inst) = self.running(caller, id).await?;
        let activity = entry.begin();
        // The content's digest is known only at the end: until then the
        // row carries a provisional fingerprint that matches nothing.
        let ticket = match self.begin_step(&entry, &inst, id, step_id, op, "pending").await? {
            Ok(t) => t,
            Err(recorded) => return Ok(UploadStart::Recorded(recorded)),
        };
        let agent_op = match op.clone() {
            StepOp::WriteFile { spec, .. } => Op::WriteFile(spec),
            StepOp::ExtractArchive { path, max_bytes, .. } => Op::TarExtract { path, max_bytes },
            _ => return Err(EdgeError::Invariant("begin_upload is given an upload")),
        };
        let (ticket, call) = self.open_logged(ticket, &inst, agent_op).await?;
        Ok(UploadStart::Fresh { ticket, call, activity })
    }

    /// Starts a streamed exec (`Op::Exec` with `stream_output`) or a
    /// terminal (`Op::OpenPty`, which takes no step id) through the log.
    pub async fn begin_stream(&self, caller: &Caller, id: &str, step_id: Option<&str>, stream: StreamOp) -> Result<StreamStart, EdgeError> {
        let (op, agent_op) = match stream {
            StreamOp::Exec(spec) => (streamed_exec_op(&spec), Op::Exec(spec)),
            StreamOp::Pty(spec) if step_id.is_none() => (StepOp::Pty { spec: spec.clone() }, Op::OpenPty(spec)),
            StreamOp::Pty(_) => {
                return Err(EdgeError::Invalid("an interactive terminal cannot be fast-forwarded: open it without a step id".into()))
            }
        };
        if let Some(recorded) = self.lookup_step(caller, id, step_id)? {
            return Ok(StreamStart::Recorded(self.settle_recorded(recorded, &op).await));
        }
        let (entry, inst) = self.running(caller, id).await?;
        let activity = entry.begin();
        let ticket = match self.begin_step(&entry, &inst, id, step_id, &op, &op.fingerprint()).await? {
            Ok(t) => t,
            Err(recorded) => return Ok(StreamStart::Recorded(self.settle_recorded(recorded, &op).await)),
        };
        let (ticket, call) = self.open_logged(ticket, &inst, agent_op).await?;
        Ok(StreamStart::Fresh { ticket, call, activity })
    }

    /// Opens a logged step's agent call; a call that cannot be opened ends
    /// the step as interrupted.
    async fn open_logged(
        &self,
        ticket: StepTicket,
        inst: &Instance,
        agent_op: Op,
    ) -> Result<(StepTicket, dsec_agent_proto::client::Call), EdgeError> {
        match inst.agent.open(agent_op).await {
            Ok(call) => Ok((ticket, call)),
            Err(e) => {
                let e = EdgeError::from(e);
                self.finish_step(ticket, &Err(EdgeError::AgentUnavailable(e.to_string())), None).await;
                Err(e)
            }
        }
    }

    /// Records how a streamed operation ended. An exec's `result` carries
    /// the output its client was sent (bounded like a buffered exec's); a
    /// call the client left before its end is `Err` (recorded as
    /// interrupted: the command was cancelled part-way).
    pub async fn finish_stream(&self, ticket: StepTicket, result: &Result<Reply, EdgeError>) {
        self.finish_step(ticket, result, None).await;
    }

    /// Records an upload's end. `op` now carries the content's digest;
    /// `content` is kept for replay when it is small enough.
    pub async fn finish_upload(&self, ticket: StepTicket, op: &StepOp, content: Option<&[u8]>, result: &Result<Reply, EdgeError>) {
        if let Some(data) = content {
            if let Err(e) = self.inner.journal.put_blob(&ticket.sandbox, data) {
                tracing::warn!(error = %e, "could not keep an upload for replay");
            }
        }
        self.finish_step(ticket, result, Some(op)).await;
    }

    /// The answer to a re-issued step: its recorded outcome, or a conflict
    /// when `op` is not the operation recorded under its step id.
    pub async fn settle_recorded(&self, recorded: RecordedStep, op: &StepOp) -> Result<Reply, EdgeError> {
        let RecordedStep { sandbox, mut row } = recorded;
        let step_id = row.step_id.clone().unwrap_or_default();
        while row.status == StepStatus::Running {
            tokio::time::sleep(RUNNING_POLL).await;
            row = match self.inner.journal.step(&sandbox, row.seq).map_err(journal_err)? {
                Some(r) => r,
                None => return Err(EdgeError::SandboxNotFound(sandbox)),
            };
        }
        if row.fingerprint != op.fingerprint() {
            return Err(EdgeError::StepConflict {
                step_id,
                seq: row.seq,
                recorded: row.kind.clone(),
                detail: describe_difference(&row.op, op),
            });
        }
        match row.status {
            StepStatus::Interrupted => Err(EdgeError::StepInterrupted { step_id, seq: row.seq }),
            _ => match self.outcome(&row)? {
                Some(Ok(reply)) => Ok(reply),
                Some(Err((code, message))) => Err(EdgeError::Recorded { code, message }),
                None => Err(EdgeError::Invariant("a finished step has a recorded outcome")),
            },
        }
    }

    /// A sandbox's log, oldest first. Only its owner (or an admin) sees it.
    pub async fn trajectory(&self, caller: &Caller, id: &str) -> Result<Vec<TrajectoryStep>, EdgeError> {
        let entry = self.entry(caller, id)?;
        // The last step's changed files may still be being listed.
        drop(entry.step_gate.lock().await);
        let rows = self.inner.journal.steps(id).map_err(journal_err)?;
        rows.into_iter().map(|row| self.step_view(row)).collect()
    }

    /// The spec a sandbox was created with, as its log remembers it.
    pub(crate) fn logged_spec(&self, id: &str) -> Result<Option<crate::model::SandboxSpec>, EdgeError> {
        let Some((_, json)) = self.inner.journal.sandbox(id).map_err(journal_err)? else {
            return Ok(None);
        };
        serde_json::from_str(&json).map(Some).map_err(|source| EdgeError::Stored { what: format!("stored spec of {id}"), source })
    }

    pub(crate) fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>, EdgeError> {
        self.inner.journal.blob(digest).map_err(journal_err)
    }

    /// Drops a sandbox's log (its record is being forgotten).
    pub(crate) fn forget_log(&self, id: &str) {
        if let Err(e) = self.inner.journal.forget(id) {
            tracing::warn!(%id, error = %e, "could not drop a trajectory log");
        }
    }

    fn lookup_step(&self, caller: &Caller, id: &str, step_id: Option<&str>) -> Result<Option<RecordedStep>, EdgeError> {
        let Some(sid) = step_id else { return Ok(None) };
        // Ownership first: nobody learns of another tenant's steps.
        self.entry(caller, id)?;
        Ok(self.inner.journal.lookup(id, sid).map_err(journal_err)?.map(|row| RecordedStep { sandbox: id.to_string(), row }))
    }

    /// Appends the running row; `Err` carries the row that won a race for
    /// the same step id.
    async fn begin_step(
        &self,
        entry: &Arc<Entry>,
        inst: &Arc<Instance>,
        id: &str,
        step_id: Option<&str>,
        op: &StepOp,
        fingerprint: &str,
    ) -> Result<Result<StepTicket, RecordedStep>, EdgeError> {
        // The previous step's changed files are being listed: its changes
        // must not be counted as this step's.
        drop(entry.step_gate.lock().await);
        let since = coarse_now();
        let journal = &self.inner.journal;
        match journal.begin(id, step_id, op.kind(), fingerprint, &op.json()).map_err(journal_err)? {
            Begin::Existing(row) => Ok(Err(RecordedStep { sandbox: id.to_string(), row })),
            Begin::New(seq) => {
                self.inner.counters.step();
                if seq == 1 {
                    let rec = entry.record();
                    let spec = serde_json::to_string(&rec.spec).unwrap_or_default();
                    journal.remember_sandbox(id, &rec.tenant, &spec).map_err(journal_err)?;
                }
                Ok(Ok(StepTicket { sandbox: id.to_string(), seq, since, inst: inst.clone(), gate: entry.step_gate.clone() }))
            }
        }
    }

    async fn finish_step(&self, ticket: StepTicket, result: &Result<Reply, EdgeError>, op: Option<&StepOp>) {
        let journal = &self.inner.journal;
        let mut blobs: Vec<(String, &[u8])> = Vec::new();
        let outcome = match result {
            Ok(reply) => Some(stored_reply(reply, &mut blobs)),
            // Refused inside the sandbox (a missing file, a bad user): the
            // operation is over, and so is its answer.
            Err(EdgeError::Agent(e)) => {
                let err = EdgeError::Agent(e.clone());
                Some(StoredOutcome::Failed { code: err.code(), message: err.to_string() })
            }
            // The edge lost the agent, or a deadline passed: unknown.
            Err(_) => None,
        };
        let status = if outcome.is_some() { StepStatus::Done } else { StepStatus::Interrupted };
        let outcome_json = outcome.map(|o| serde_json::to_string(&o).unwrap_or_default());
        let final_op = op.map(|o| (o.fingerprint(), o.json()));
        let blobs: Vec<(&str, &[u8])> = blobs.iter().map(|(d, b)| (d.as_str(), *b)).collect();
        if let Err(e) = journal.finish(
            &ticket.sandbox,
            ticket.seq,
            status,
            outcome_json.as_deref(),
            None,
            final_op.as_ref().map(|(f, j)| (f.as_str(), j.as_str())),
            &blobs,
        ) {
            tracing::error!(sandbox = %ticket.sandbox, seq = ticket.seq, error = %e, "could not record a step's outcome");
        }
        if status != StepStatus::Done {
            return;
        }
        // The outcome is durable; the answer may go. Which files changed is
        // listed meanwhile, off the answer's path: the gate holds the next
        // step of this sandbox (and readers of its log) until it is done.
        let gate = ticket.gate.clone().lock_owned().await;
        let edge = self.clone();
        tokio::spawn(async move {
            if let Some(changes) = edge.changed_since(&ticket.inst, ticket.since).await {
                let json = serde_json::to_string(&changes).unwrap_or_default();
                if let Err(e) = edge.inner.journal.set_changed(&ticket.sandbox, ticket.seq, &json) {
                    tracing::warn!(sandbox = %ticket.sandbox, seq = ticket.seq, error = %e, "could not record a step's changed files");
                }
            }
            drop(gate);
        });
    }

    async fn changed_since(&self, inst: &Instance, since: (i64, u32)) -> Option<StoredChanges> {
        let op = Op::ChangedSince { since_sec: since.0, since_nsec: since.1, max_paths: MAX_CHANGED_PATHS };
        match tokio::time::timeout(WALK_TIMEOUT, inst.agent.call(op)).await.unwrap_or(Err(ClientError::Closed)) {
            Ok(Reply::Changed { paths, truncated }) => Some(StoredChanges { paths, truncated }),
            Ok(other) => {
                tracing::debug!(?other, "unexpected reply to ChangedSince");
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "the agent could not list changed files");
                None
            }
        }
    }

    fn outcome(&self, row: &StepRow) -> Result<Option<RecordedResult>, EdgeError> {
        let Some(json) = &row.outcome else { return Ok(None) };
        let stored: StoredOutcome = serde_json::from_str(json)
            .map_err(|source| EdgeError::Stored { what: format!("stored outcome of step {}", row.seq), source })?;
        let output = |d: &str| -> Result<Vec<u8>, EdgeError> { Ok(self.blob(d)?.unwrap_or_default()) };
        Ok(Some(match stored {
            StoredOutcome::Exited { exit_code, signal, stdout, stderr, truncated, timed_out, duration_us } => {
                Ok(Reply::Exited(ExecResult {
                    exit_code,
                    signal,
                    stdout: output(&stdout)?,
                    stderr: output(&stderr)?,
                    truncated,
                    timed_out,
                    duration_us,
                }))
            }
            StoredOutcome::Session { session_id } => Ok(Reply::Session { session_id }),
            StoredOutcome::Written { bytes } => Ok(Reply::Written { bytes }),
            StoredOutcome::Done => Ok(Reply::Done),
            StoredOutcome::Failed { code, message } => Err((code, message)),
        }))
    }

    fn step_view(&self, row: StepRow) -> Result<TrajectoryStep, EdgeError> {
        let op: StepOp =
            serde_json::from_str(&row.op).map_err(|source| EdgeError::Stored { what: format!("stored step {}", row.seq), source })?;
        let outcome = self.outcome(&row)?;
        let changes: Option<StoredChanges> = row.changed.as_deref().and_then(|c| serde_json::from_str(c).ok());
        Ok(TrajectoryStep {
            seq: row.seq,
            step_id: row.step_id,
            op,
            status: row.status,
            outcome,
            changed_truncated: changes.as_ref().is_some_and(|c| c.truncated),
            changed: changes.map(|c| c.paths),
            started_ms: row.started_ms,
            finished_ms: row.finished_ms,
        })
    }
}

/// A reply as the log stores it; its outputs go to `blobs` by digest.
fn stored_reply<'a>(reply: &'a Reply, blobs: &mut Vec<(String, &'a [u8])>) -> StoredOutcome {
    let mut keep = |data: &'a [u8]| -> String {
        let digest = sha256_hex(data);
        blobs.push((digest.clone(), data));
        digest
    };
    match reply {
        Reply::Exited(r) => StoredOutcome::Exited {
            exit_code: r.exit_code,
            signal: r.signal,
            stdout: keep(&r.stdout),
            stderr: keep(&r.stderr),
            truncated: r.truncated,
            timed_out: r.timed_out,
            duration_us: r.duration_us,
        },
        Reply::Session { session_id } => StoredOutcome::Session { session_id: session_id.clone() },
        Reply::Written { bytes } => StoredOutcome::Written { bytes: *bytes },
        _ => StoredOutcome::Done,
    }
}

/// A short, human account of how a re-issued operation differs.
fn describe_difference(recorded_json: &str, op: &StepOp) -> String {
    let recorded: serde_json::Value = serde_json::from_str(recorded_json).unwrap_or_default();
    let now: serde_json::Value = serde_json::to_value(op).unwrap_or_default();
    if recorded.get("kind") != now.get("kind") {
        return format!("recorded a {} operation, re-issued as {}", recorded["kind"], now["kind"]);
    }
    let mut fields = Vec::new();
    diff(&recorded, &now, String::new(), &mut fields);
    if fields.is_empty() {
        "the content differs".to_string()
    } else {
        format!("differs in {}", fields.join(", "))
    }
}

fn diff(a: &serde_json::Value, b: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match (a, b) {
        (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let null = serde_json::Value::Null;
                let sub = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                diff(x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null), sub, out);
            }
        }
        _ if a != b => out.push(at),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsec_agent_proto::{Command, Stdin};

    fn exec(cmd: &str) -> StepOp {
        StepOp::Exec {
            spec: ExecSpec {
                command: Command::Shell(cmd.into()),
                env: vec![],
                cwd: None,
                user: None,
                stdin: Stdin::Null,
                stream_output: false,
                timeout_ms: None,
                kill_grace_ms: 2000,
                max_output_bytes: 1 << 20,
                session: None,
            },
        }
    }

    #[test]
    fn fingerprints_tell_operations_apart() {
        assert_eq!(exec("echo a").fingerprint(), exec("echo a").fingerprint());
        assert_ne!(exec("echo a").fingerprint(), exec("echo b").fingerprint());
        let rm = StepOp::Remove { path: "/a".into(), recursive: false };
        assert_ne!(rm.fingerprint(), exec("echo a").fingerprint());
    }

    #[test]
    fn a_conflict_names_what_differs() {
        let d = describe_difference(&exec("echo a").json(), &exec("echo b"));
        assert!(d.contains("spec.command"), "{d}");
        let rm = StepOp::Remove { path: "/a".into(), recursive: false };
        let d = describe_difference(&exec("echo a").json(), &rm);
        assert!(d.contains("exec") && d.contains("remove"), "{d}");
    }
}
