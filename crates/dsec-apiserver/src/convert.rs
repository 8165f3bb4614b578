//! Conversions between the public wire types (`dsec_api`) and the edge's
//! core types. The only place that knows both.

use base64::Engine;
use dsec_api as api;
use dsec_edge::agent::{Command, ExecResult, ExecSpec, FileKind, FileStat, Stdin};
use dsec_edge::model::{BackendKind, SandboxRecord, State};
use dsec_edge::SandboxRequest;

use crate::error::ApiError;

/// Output kept per stream when the caller does not say.
pub const DEFAULT_MAX_OUTPUT: u64 = 1 << 20;
/// The most a caller may ask to keep per stream of a buffered exec.
pub const MAX_MAX_OUTPUT: u64 = 64 << 20;
/// SIGTERM -> SIGKILL grace period of a timed-out command.
pub const KILL_GRACE_MS: u64 = 2000;

pub fn backend(b: api::Backend) -> BackendKind {
    match b {
        api::Backend::Container => BackendKind::Container,
        api::Backend::Microvm => BackendKind::Microvm,
        api::Backend::Vm => BackendKind::Vm,
        api::Backend::Fncall => BackendKind::Fncall,
    }
}

fn backend_out(b: BackendKind) -> api::Backend {
    match b {
        BackendKind::Container => api::Backend::Container,
        BackendKind::Microvm => api::Backend::Microvm,
        BackendKind::Vm => api::Backend::Vm,
        BackendKind::Fncall => api::Backend::Fncall,
    }
}

pub fn create_request(r: api::CreateSandboxRequest) -> SandboxRequest {
    SandboxRequest {
        backend: Some(backend(r.backend)),
        image: r.image,
        workspace: r.workspace,
        toolkits: r.toolkits,
        memory_mb: r.memory_limit_mb,
        cpu_cores: r.cpu_cores_limit,
        // Internal (FnCall runners): users get a quota equal to their limit.
        cpu_quota_cores: None,
        disk_mb: r.disk_limit_mb,
        pids: r.pids_limit,
        idle_ttl_s: r.ttl_running_stop,
        max_lifetime_s: r.max_lifetime_s,
        init_user: r.init_user,
        env: r.env,
        workdir: r.workdir,
        labels: r.labels,
        job: r.job,
        network_rules: r.network_rules,
        snapshot: r.snapshot,
        qos_class: r.qos_class.map(qos_in),
        volumes: r
            .volumes
            .into_iter()
            .map(|(path, m)| (path, dsec_edge::model::VolumeRef { name: m.name().to_string(), read_only: m.read_only() }))
            .collect(),
        // Only the edge's own FnCall runners keep it in memory.
        writable_layer_in_memory: false,
    }
}

pub fn qos_in(q: api::QosClass) -> dsec_edge::QosClass {
    match q {
        api::QosClass::LatencySensitive => dsec_edge::QosClass::LatencySensitive,
        api::QosClass::BestEffort => dsec_edge::QosClass::BestEffort,
    }
}

pub fn qos_out(q: dsec_edge::QosClass) -> api::QosClass {
    match q {
        dsec_edge::QosClass::LatencySensitive => api::QosClass::LatencySensitive,
        dsec_edge::QosClass::BestEffort => api::QosClass::BestEffort,
    }
}

pub fn snapshot_out(m: dsec_edge::SnapshotMeta, created: bool, frozen_ms: f64) -> api::Snapshot {
    api::Snapshot {
        name: m.name,
        id: m.id,
        source: m.source,
        image: m.image,
        workspace: m.workspace,
        toolkits: m.toolkits,
        disk_limit_mb: m.disk_mb,
        parent: m.parent,
        backend: backend_out(m.backend),
        bytes: m.bytes,
        created_at: rfc3339(m.created_at_ms),
        created,
        frozen_ms,
        memory: m.memory.is_some(),
    }
}

pub fn state_out(s: State) -> api::SandboxState {
    match s {
        State::Queued => api::SandboxState::Queued,
        State::Creating => api::SandboxState::Creating,
        State::Running => api::SandboxState::Running,
        State::Pausing => api::SandboxState::Pausing,
        State::Paused => api::SandboxState::Paused,
        State::Resuming => api::SandboxState::Resuming,
        State::Stopping => api::SandboxState::Stopping,
        State::Stopped => api::SandboxState::Stopped,
        State::Failed => api::SandboxState::Failed,
    }
}

pub fn state_in(s: &str) -> Result<State, ApiError> {
    Ok(match s {
        "queued" => State::Queued,
        "creating" => State::Creating,
        "running" => State::Running,
        "pausing" => State::Pausing,
        "paused" => State::Paused,
        "resuming" => State::Resuming,
        "stopping" => State::Stopping,
        "stopped" => State::Stopped,
        "failed" => State::Failed,
        other => return Err(ApiError::invalid(format!("unknown state {other:?}"))),
    })
}

pub fn rfc3339(ms: u64) -> String {
    dsec_image::rfc3339_millis(ms)
}

pub fn sandbox_out(r: SandboxRecord) -> api::Sandbox {
    api::Sandbox {
        id: r.id,
        project: r.tenant,
        backend: backend_out(r.spec.backend),
        image: r.spec.image,
        workspace: r.spec.workspace,
        toolkits: r.spec.toolkits,
        state: state_out(r.state),
        state_reason: r.reason,
        node: r.node,
        limits: api::Limits {
            memory_limit_mb: r.spec.limits.memory_mb,
            cpu_cores_limit: r.spec.limits.cpu_cores,
            disk_limit_mb: r.spec.limits.disk_mb,
            pids_limit: r.spec.limits.pids,
        },
        qos_class: qos_out(r.spec.qos_class),
        init_user: r.spec.init_user,
        ttl_running_stop: r.spec.idle_ttl_s,
        max_lifetime_s: r.spec.max_lifetime_s,
        labels: r.spec.labels,
        job: r.spec.job,
        created_at: rfc3339(r.created_at_ms),
        last_active_at: rfc3339(r.last_active_ms),
        stopped_at: r.stopped_at_ms.map(rfc3339),
        create_ms: r.create_ms,
        queue_position: r.queue_position,
        paused_at: r.paused_at_ms.map(rfc3339),
        memory_freed_bytes: r.memory_freed_bytes,
        suspended: r.suspended && r.state.is_paused(),
    }
}

pub fn event_out(e: dsec_edge::SandboxEvent) -> api::SandboxEvent {
    api::SandboxEvent {
        id: e.id,
        job: e.job,
        state: state_out(e.state),
        state_reason: e.reason,
        at: rfc3339(e.at_ms),
        queue_position: e.queue_position,
    }
}

/// Checks an exec request and turns it into the agent's spec.
pub fn exec_spec(r: &api::ExecRequest, stream_output: bool) -> Result<ExecSpec, ApiError> {
    let command = match (&r.cmd, &r.argv) {
        (Some(c), None) => Command::Shell(c.clone()),
        (None, Some(a)) if !a.is_empty() => Command::Argv(a.clone()),
        (None, Some(_)) => return Err(ApiError::invalid("argv must not be empty")),
        _ => return Err(ApiError::invalid("give exactly one of cmd (a shell string) and argv (a list)")),
    };
    let stdin = match (&r.stdin, &r.stdin_b64) {
        (None, None) => {
            if stream_output {
                Stdin::Stream
            } else {
                Stdin::Null
            }
        }
        (Some(s), None) => Stdin::Bytes(s.clone().into_bytes()),
        (None, Some(b)) => Stdin::Bytes(
            base64::engine::general_purpose::STANDARD.decode(b).map_err(|e| ApiError::invalid(format!("stdin_b64 is not base64: {e}")))?,
        ),
        (Some(_), Some(_)) => return Err(ApiError::invalid("give at most one of stdin and stdin_b64")),
    };
    let timeout_ms = match r.timeout {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 && t <= 7.0 * 86_400.0 => Some((t * 1000.0).ceil() as u64),
        Some(t) => return Err(ApiError::invalid(format!("timeout must be a positive number of seconds (got {t})"))),
    };
    let max_output_bytes = r.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT);
    if max_output_bytes > MAX_MAX_OUTPUT {
        return Err(ApiError::invalid(format!("max_output_bytes must be at most {MAX_MAX_OUTPUT}")));
    }
    for k in r.env.keys() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(ApiError::invalid(format!("invalid environment variable name {k:?}")));
        }
    }
    Ok(ExecSpec {
        command,
        env: r.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        cwd: r.cwd.clone(),
        user: r.user.clone(),
        stdin,
        stream_output,
        timeout_ms,
        kill_grace_ms: KILL_GRACE_MS,
        max_output_bytes,
        session: r.session.clone(),
    })
}

pub fn encode_output(bytes: &[u8], enc: api::OutputEncoding) -> String {
    match enc {
        api::OutputEncoding::Utf8 => String::from_utf8_lossy(bytes).into_owned(),
        api::OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
    }
}

pub fn exec_response(r: ExecResult, enc: api::OutputEncoding) -> api::ExecResponse {
    api::ExecResponse {
        exit_code: r.exit_code.unwrap_or_else(|| 128 + r.signal.unwrap_or(0)),
        signal: r.signal,
        stdout: encode_output(&r.stdout, enc),
        stderr: encode_output(&r.stderr, enc),
        encoding: enc,
        duration_ms: r.duration_us as f64 / 1000.0,
        truncated: r.truncated,
        timed_out: r.timed_out,
    }
}

pub fn file_info(dir: Option<&str>, s: FileStat) -> api::FileInfo {
    let path = match dir {
        Some(d) if d.ends_with('/') => format!("{d}{}", s.name),
        Some(d) => format!("{d}/{}", s.name),
        None => s.name.clone(),
    };
    api::FileInfo {
        name: s.name.rsplit('/').next().unwrap_or(&s.name).to_string(),
        path,
        file_type: match s.kind {
            FileKind::File => api::FileType::File,
            FileKind::Dir => api::FileType::Dir,
            FileKind::Symlink => api::FileType::Symlink,
            FileKind::Other => api::FileType::Other,
        },
        size: s.size,
        mode: s.mode,
        uid: s.uid,
        gid: s.gid,
        mtime: s.mtime,
        link_target: s.link_target,
    }
}

/// A logged step as the API shows it: the result as its endpoint answered.
pub fn trajectory_step_out(s: dsec_edge::TrajectoryStep) -> api::TrajectoryStep {
    let path_of = |op: &dsec_edge::StepOp| match op {
        dsec_edge::StepOp::WriteFile { spec, .. } => spec.path.clone(),
        dsec_edge::StepOp::ExtractArchive { path, .. } => path.clone(),
        _ => String::new(),
    };
    let (result, error) = match s.outcome {
        None => (None, None),
        Some(Err((code, message))) => (None, Some(api::ErrorDetail { code, message })),
        Some(Ok(reply)) => {
            let value = match reply {
                dsec_edge::agent::Reply::Exited(r) => serde_json::to_value(exec_response(r, api::OutputEncoding::Utf8)).ok(),
                dsec_edge::agent::Reply::Session { session_id } => serde_json::to_value(api::SessionInfo { session_id }).ok(),
                dsec_edge::agent::Reply::Written { bytes } => serde_json::to_value(api::WriteResult { path: path_of(&s.op), bytes }).ok(),
                _ => None,
            };
            (value, None)
        }
    };
    api::TrajectoryStep {
        seq: s.seq,
        step_id: s.step_id,
        kind: s.op.kind().to_string(),
        status: s.status.as_str().to_string(),
        operation: serde_json::to_value(&s.op).unwrap_or_default(),
        result,
        error,
        changed_files: s.changed.map(|c| {
            c.into_iter()
                .map(|p| api::ChangedFile { path: p.path, change: if p.deleted { "deleted" } else { "changed" }.to_string() })
                .collect()
        }),
        changed_truncated: s.changed_truncated,
        started_at: rfc3339(s.started_ms),
        finished_at: s.finished_ms.map(rfc3339),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_795_000_000_000), "2026-11-18T11:06:40.000Z");
    }

    #[test]
    fn exec_needs_exactly_one_command_form() {
        let mut r = api::ExecRequest::default();
        assert!(exec_spec(&r, false).is_err());
        r.cmd = Some("true".into());
        assert!(exec_spec(&r, false).is_ok());
        r.argv = Some(vec!["true".into()]);
        assert!(exec_spec(&r, false).is_err());
    }

    #[test]
    fn signals_become_128_plus_n() {
        let r = ExecResult { signal: Some(9), ..Default::default() };
        assert_eq!(exec_response(r, api::OutputEncoding::Utf8).exit_code, 137);
    }

    #[test]
    fn bad_timeouts_and_base64_are_invalid() {
        let r = api::ExecRequest { cmd: Some("x".into()), timeout: Some(-1.0), ..Default::default() };
        assert!(exec_spec(&r, false).is_err());
        let r = api::ExecRequest { cmd: Some("x".into()), stdin_b64: Some("!!".into()), ..Default::default() };
        assert!(exec_spec(&r, false).is_err());
    }
}
