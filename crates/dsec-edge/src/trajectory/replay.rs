//! Deterministic replay: a fresh sandbox from the same image, layers and
//! run arguments re-runs a sandbox's trajectory log, step by step, and the
//! outcomes are compared with the recorded ones (exit code, stdout, stderr
//! of each command; success or the error code of other operations).
//!
//! The replay's own steps are logged under the same step ids in the new
//! sandbox, so its log can be read (and replayed) like any other.

use std::collections::HashMap;

use dsec_agent_proto::client::Call;
use dsec_agent_proto::{Reply, MAX_CHUNK_BYTES};
use dsec_api::ErrorCode;

use crate::edge::Edge;
use crate::error::EdgeError;
use crate::model::{Caller, SandboxSpec};
use crate::spec::SandboxRequest;
use crate::trajectory::journal::StepStatus;
use crate::trajectory::{StepOp, TrajectoryStep, UploadStart};

/// The label a replay sandbox carries: the id it replays.
pub const REPLAY_LABEL: &str = "dsec.replay_of";
/// Characters of an output quoted in a divergence.
const QUOTE: usize = 200;

/// Where one step's replayed outcome differs from the recorded one.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    pub seq: u64,
    pub step_id: Option<String>,
    pub kind: String,
    /// `exit_code`, `stdout`, `stderr`, `signal`, `error` or `skipped`.
    pub field: String,
    pub recorded: String,
    pub replayed: String,
}

#[derive(Debug, Clone)]
pub struct ReplayReport {
    pub source: String,
    /// The sandbox that replayed the log (stopped and removed unless kept).
    pub replay_id: String,
    pub kept: bool,
    pub steps: usize,
    pub replayed: usize,
    pub divergences: Vec<Divergence>,
}

fn request_from(spec: &SandboxSpec, source: &str) -> SandboxRequest {
    let mut labels = spec.labels.clone();
    labels.insert(REPLAY_LABEL.to_string(), source.to_string());
    SandboxRequest {
        backend: Some(spec.backend),
        image: spec.image.clone(),
        workspace: spec.workspace.clone(),
        toolkits: spec.toolkits.clone(),
        memory_mb: Some(spec.limits.memory_mb),
        cpu_cores: Some(spec.limits.cpu_cores),
        cpu_quota_cores: spec.limits.cpu_quota_cores,
        disk_mb: Some(spec.limits.disk_mb),
        pids: Some(spec.limits.pids),
        idle_ttl_s: Some(spec.idle_ttl_s),
        max_lifetime_s: Some(spec.max_lifetime_s),
        init_user: Some(spec.init_user.clone()),
        env: spec.env.clone(),
        workdir: spec.workdir.clone(),
        labels,
        // Not part of the job: pausing the job must not pause its replays.
        job: None,
        network_rules: spec.network_rules.clone(),
        // A replay starts from the image alone: it re-runs the log.
        snapshot: None,
        qos_class: Some(spec.qos_class),
        volumes: spec.volumes.clone(),
        writable_layer_in_memory: spec.writable_layer_in_memory,
    }
}

fn quote(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.chars().count() > QUOTE {
        format!("{}...", s.chars().take(QUOTE).collect::<String>())
    } else {
        s.into_owned()
    }
}

fn describe(r: &Result<Reply, (ErrorCode, String)>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err((code, msg)) => format!("{code}: {msg}"),
    }
}

/// Compares a recorded outcome with a replayed one.
fn compare(
    step: &TrajectoryStep,
    recorded: &Result<Reply, (ErrorCode, String)>,
    replayed: &Result<Reply, (ErrorCode, String)>,
) -> Vec<Divergence> {
    let mut out = Vec::new();
    let mut push = |field: &str, recorded: String, replayed: String| {
        out.push(Divergence {
            seq: step.seq,
            step_id: step.step_id.clone(),
            kind: step.op.kind().to_string(),
            field: field.to_string(),
            recorded,
            replayed,
        })
    };
    match (recorded, replayed) {
        (Ok(Reply::Exited(a)), Ok(Reply::Exited(b))) => {
            if a.exit_code != b.exit_code {
                push("exit_code", format!("{:?}", a.exit_code), format!("{:?}", b.exit_code));
            }
            if a.signal != b.signal {
                push("signal", format!("{:?}", a.signal), format!("{:?}", b.signal));
            }
            if a.stdout != b.stdout {
                push("stdout", quote(&a.stdout), quote(&b.stdout));
            }
            if a.stderr != b.stderr {
                push("stderr", quote(&a.stderr), quote(&b.stderr));
            }
        }
        (Ok(_), Ok(_)) => {}
        (Err((a, _)), Err((b, _))) if a == b => {}
        (a, b) => push("error", describe(a), describe(b)),
    }
    out
}

/// Feeds recorded content into an upload call and waits for its reply.
async fn feed(call: Call, data: &[u8]) -> Result<Reply, EdgeError> {
    let (tx, mut rx) = call.into_split();
    let send = async move {
        for piece in data.chunks(MAX_CHUNK_BYTES) {
            if tx.send_data(piece).await.is_err() {
                return Ok(());
            }
        }
        let _ = tx.send_eof();
        Ok::<(), EdgeError>(())
    };
    rx.reply_while(send).await?.map_err(EdgeError::Agent)
}

fn as_recorded(r: Result<Reply, EdgeError>) -> Result<Reply, (ErrorCode, String)> {
    r.map_err(|e| (e.code(), e.to_string()))
}

impl Edge {
    /// Replays sandbox `id`'s log in a fresh sandbox and reports where the
    /// outcomes diverge. With `keep`, the replay sandbox stays running.
    pub async fn replay(&self, caller: &Caller, id: &str, keep: bool) -> Result<ReplayReport, EdgeError> {
        let steps = self.trajectory(caller, id).await?;
        if steps.is_empty() {
            return Err(EdgeError::TrajectoryNotFound(id.to_string()));
        }
        let spec = match self.logged_spec(id)? {
            Some(s) => s,
            None => self.get(caller, id)?.spec,
        };
        let fresh = self.create(caller, request_from(&spec, id)).await?;
        let result = self.replay_into(caller, &fresh.id, &steps).await;
        if !keep {
            if let Err(e) = self.delete(caller, &fresh.id).await {
                tracing::warn!(replay = %fresh.id, error = %e, "could not remove a replay sandbox");
            }
        }
        let (replayed, divergences) = result?;
        Ok(ReplayReport { source: id.to_string(), replay_id: fresh.id, kept: keep, steps: steps.len(), replayed, divergences })
    }

    async fn replay_into(&self, caller: &Caller, target: &str, steps: &[TrajectoryStep]) -> Result<(usize, Vec<Divergence>), EdgeError> {
        // Session ids are the agent's: map the recorded ones to the new.
        let mut sessions: HashMap<String, String> = HashMap::new();
        let mut divergences = Vec::new();
        let mut replayed = 0;
        for step in steps {
            let skip = |why: &str| Divergence {
                seq: step.seq,
                step_id: step.step_id.clone(),
                kind: step.op.kind().to_string(),
                field: "skipped".into(),
                recorded: step.status.as_str().into(),
                replayed: why.into(),
            };
            let (StepStatus::Done, Some(recorded)) = (step.status, &step.outcome) else {
                divergences.push(skip("not replayed: the recorded step has no outcome"));
                continue;
            };
            let mut op = step.op.clone();
            match &mut op {
                StepOp::Pty { .. } => {
                    divergences.push(skip("not replayed: an interactive terminal"));
                    continue;
                }
                StepOp::Exec { spec } => {
                    if let Some(s) = &mut spec.session {
                        *s = sessions.get(s).cloned().unwrap_or_else(|| s.clone());
                    }
                    // A streamed command's interactive stdin is not kept:
                    // it replays with none (its output then shows whether
                    // that mattered).
                    if spec.stdin == dsec_agent_proto::Stdin::Stream {
                        spec.stdin = dsec_agent_proto::Stdin::Null;
                    }
                }
                StepOp::CloseSession { session_id } => {
                    *session_id = sessions.get(session_id).cloned().unwrap_or_else(|| session_id.clone());
                }
                _ => {}
            }
            let step_id = step.step_id.as_deref();
            let outcome = match &op {
                StepOp::WriteFile { digest, .. } | StepOp::ExtractArchive { digest, .. } => {
                    let Some(content) = self.blob(digest)? else {
                        divergences.push(skip("not replayed: the upload was too large to keep"));
                        continue;
                    };
                    self.replay_upload(caller, target, step_id, &op, &content).await
                }
                _ => self.run_step(caller, target, step_id, op.clone()).await,
            };
            if let Err(e @ (EdgeError::SandboxNotFound(_) | EdgeError::NotRunning { .. } | EdgeError::AgentUnavailable(_))) = outcome {
                // The replay sandbox itself is gone: nothing after this
                // step can be compared.
                return Err(e);
            }
            let outcome = as_recorded(outcome);
            if let (Ok(Reply::Session { session_id: old }), Ok(Reply::Session { session_id: new })) = (recorded, &outcome) {
                sessions.insert(old.clone(), new.clone());
            }
            divergences.extend(compare(step, recorded, &outcome));
            replayed += 1;
        }
        Ok((replayed, divergences))
    }

    async fn replay_upload(
        &self,
        caller: &Caller,
        target: &str,
        step_id: Option<&str>,
        op: &StepOp,
        content: &[u8],
    ) -> Result<Reply, EdgeError> {
        match self.begin_upload(caller, target, step_id, op).await? {
            UploadStart::Recorded(rec) => self.settle_recorded(rec, op).await,
            UploadStart::Fresh { ticket, call, activity } => {
                let result = feed(call, content).await;
                drop(activity);
                self.finish_upload(ticket, op, Some(content), &result).await;
                result
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsec_agent_proto::ExecResult;

    fn step() -> TrajectoryStep {
        TrajectoryStep {
            seq: 3,
            step_id: Some("s3".into()),
            op: StepOp::Remove { path: "/x".into(), recursive: false },
            status: StepStatus::Done,
            outcome: None,
            changed: None,
            changed_truncated: false,
            started_ms: 0,
            finished_ms: None,
        }
    }

    fn exited(code: i32, out: &str) -> Result<Reply, (ErrorCode, String)> {
        Ok(Reply::Exited(ExecResult { exit_code: Some(code), stdout: out.as_bytes().to_vec(), ..Default::default() }))
    }

    #[test]
    fn divergences_name_each_differing_field() {
        assert!(compare(&step(), &exited(0, "a"), &exited(0, "a")).is_empty());
        let d = compare(&step(), &exited(0, "a\n"), &exited(1, "b\n"));
        let fields: Vec<_> = d.iter().map(|d| d.field.as_str()).collect();
        assert_eq!(fields, vec!["exit_code", "stdout"]);
        assert_eq!((d[1].recorded.as_str(), d[1].replayed.as_str()), ("a\n", "b\n"));
        let failed = Err((ErrorCode::FileNotFound, "gone".into()));
        assert_eq!(compare(&step(), &Ok(Reply::Done), &failed)[0].field, "error");
        assert!(compare(&step(), &failed, &Err((ErrorCode::FileNotFound, "other text".into()))).is_empty());
    }
}
