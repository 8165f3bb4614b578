use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Which kind of isolation runs the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Namespaces + cgroups + overlayfs over EROFS layers.
    #[default]
    Container,
    /// A QEMU microvm guest.
    Microvm,
    /// A QEMU q35 full VM.
    Vm,
    /// A warm runner from the FnCall pool.
    Fncall,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Container => "container",
            Backend::Microvm => "microvm",
            Backend::Vm => "vm",
            Backend::Fncall => "fncall",
        }
    }
}

/// A sandbox's CPU QoS class: how its tasks count when the node's CPUs
/// are contended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum QosClass {
    #[default]
    /// The default weight (and a core-scheduling cookie of its own where
    /// the node has core scheduling): for steps a caller waits on.
    LatencySensitive,
    /// Runs on the CPU time latency-sensitive sandboxes leave (cgroup v2
    /// `cpu.idle`; v1 the smallest `cpu.shares` and `SCHED_IDLE` tasks).
    BestEffort,
}

/// `POST /v1/sandboxes`. Field names follow the paper's SDK listing.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    #[serde(default)]
    pub backend: Backend,
    /// Base image name (`name` or `name:tag`), e.g. `python`, `busybox`.
    #[serde(alias = "container_image")]
    pub image: String,
    /// One workspace layer placed above the base image.
    #[serde(default)]
    pub workspace: Option<String>,
    /// Toolkit layers placed above the workspace; the last one is topmost.
    #[serde(default)]
    pub toolkits: Vec<String>,
    #[serde(default)]
    pub memory_limit_mb: Option<u64>,
    #[serde(default)]
    pub cpu_cores_limit: Option<f64>,
    /// Size of the writable layer (a full VM: of its whole disk, by
    /// default and at least its image's).
    #[serde(default)]
    pub disk_limit_mb: Option<u64>,
    #[serde(default)]
    pub pids_limit: Option<u64>,
    /// CPU QoS class. Default: `latency_sensitive` on every backend (a
    /// best-effort sandbox waits for whatever else the node runs, so it is
    /// best effort only when asked). Changeable while the sandbox runs
    /// (`PATCH /v1/sandboxes/{id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_class: Option<QosClass>,
    /// Idle lifetime in seconds: the sandbox is stopped after this long
    /// without any request. 0 disables the idle timeout.
    #[serde(default)]
    pub ttl_running_stop: Option<u64>,
    /// Hard lifetime in seconds, counted from creation, whatever the
    /// activity. 0 means the node's maximum.
    #[serde(default)]
    pub max_lifetime_s: Option<u64>,
    /// Named egress services to allow (`{"pypi": true, "npm": false}`).
    /// Without a rule, the sandbox has no outside network.
    #[serde(default)]
    pub network_rules: BTreeMap<String, bool>,
    /// The default user for commands: `root` or a user of the image.
    #[serde(default)]
    pub init_user: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub workdir: Option<String>,
    /// Free-form labels, for filtering in list calls.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Place only on nodes carrying all these labels (`kvm=true`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// The training job this sandbox belongs to.
    #[serde(default)]
    pub job: Option<String>,
    /// Start a VM from this snapshot of the caller's (`POST
    /// /v1/sandboxes/{id}/snapshot`): its disk chains onto the snapshot's;
    /// backend (`microvm` or `vm`), image, layers and disk size are the
    /// snapshot's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Named volumes of the caller's (`POST /v1/volumes`) to mount, by
    /// sandbox path: `{"/data": "NAME"}` (read-write) or `{"/data":
    /// {"name": "NAME", "read_only": true}}`. Containers only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub volumes: BTreeMap<String, crate::VolumeMount>,
    /// A first command, run as soon as the sandbox runs and answered in the
    /// same response (`first_exec` of [`CreatedSandbox`]): creation and
    /// first command in one round trip. A command that cannot be run (an
    /// error, not a non-zero exit) deletes the sandbox and the creation
    /// answers that error. Not allowed with an `Idempotency-Key` (a retry
    /// would run the command again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_exec: Option<crate::ExecRequest>,
}

/// The answer of `POST /v1/sandboxes`: the sandbox, and the result of the
/// request's `first_exec` when it had one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CreatedSandbox {
    #[serde(flatten)]
    pub sandbox: Sandbox,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_exec: Option<crate::ExecResponse>,
}

/// `POST /v1/sandboxes/{id}/snapshot`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// The snapshot's name, unique per tenant: letters, digits, `._:-`.
    pub name: String,
    /// A memory snapshot (microVMs only): the VM is suspended (it resumes
    /// on its next request) and its RAM and device state are kept too, so
    /// sandboxes started from the snapshot continue its processes.
    #[serde(default)]
    pub memory: bool,
}

/// A VM disk snapshot (a microVM's writable disk, or a full VM's disk).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    pub name: String,
    pub id: String,
    /// The sandbox it was taken from.
    pub source: String,
    pub image: String,
    pub workspace: Option<String>,
    pub toolkits: Vec<String>,
    pub disk_limit_mb: u64,
    /// The snapshot this one chains onto (`None`: the empty disk, or a
    /// full VM's base image).
    pub parent: Option<String>,
    /// What sandboxes started from it are (`microvm` or `vm`).
    #[serde(default = "microvm_backend")]
    pub backend: Backend,
    /// Bytes its own layer occupies on disk (what the source changed).
    pub bytes: u64,
    /// RFC 3339.
    pub created_at: String,
    /// False if an earlier request with the same idempotency key made it.
    #[serde(default)]
    pub created: bool,
    /// How long the source's vCPUs were stopped for the copy.
    #[serde(default)]
    pub frozen_ms: f64,
    /// A memory snapshot: its sandboxes continue the source's processes.
    #[serde(default)]
    pub memory: bool,
}

fn microvm_backend() -> Backend {
    Backend::Microvm
}

/// `GET /v1/snapshots`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// Waiting in the node's creation queue (see `queue_position`).
    Queued,
    Creating,
    Running,
    /// Being frozen and having its memory pushed out of RAM.
    Pausing,
    /// Frozen, memory out of RAM; any request resumes it first.
    Paused,
    /// Being thawed.
    Resuming,
    Stopping,
    Stopped,
    Failed,
    /// The node that owns the sandbox cannot be reached.
    Unknown,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Queued => "queued",
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Pausing => "pausing",
            SandboxState::Paused => "paused",
            SandboxState::Resuming => "resuming",
            SandboxState::Stopping => "stopping",
            SandboxState::Stopped => "stopped",
            SandboxState::Failed => "failed",
            SandboxState::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => SandboxState::Queued,
            "creating" => SandboxState::Creating,
            "running" => SandboxState::Running,
            "pausing" => SandboxState::Pausing,
            "paused" => SandboxState::Paused,
            "resuming" => SandboxState::Resuming,
            "stopping" => SandboxState::Stopping,
            "stopped" => SandboxState::Stopped,
            "failed" => SandboxState::Failed,
            "unknown" => SandboxState::Unknown,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, SandboxState::Stopped | SandboxState::Failed)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Limits {
    pub memory_limit_mb: u64,
    pub cpu_cores_limit: f64,
    pub disk_limit_mb: u64,
    pub pids_limit: u64,
}

/// A sandbox as the API reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Sandbox {
    /// Encodes the node that owns the sandbox.
    pub id: String,
    /// The project it belongs to (the path of the token's project that
    /// created it).
    #[serde(default)]
    pub project: String,
    pub backend: Backend,
    pub image: String,
    pub workspace: Option<String>,
    pub toolkits: Vec<String>,
    pub state: SandboxState,
    /// Why the sandbox stopped or failed (`idle timeout`, `deleted`, ...).
    pub state_reason: Option<String>,
    pub node: String,
    pub limits: Limits,
    pub qos_class: QosClass,
    pub init_user: String,
    pub ttl_running_stop: u64,
    pub max_lifetime_s: u64,
    pub labels: std::collections::BTreeMap<String, String>,
    pub job: Option<String>,
    /// RFC 3339 times.
    pub created_at: String,
    pub last_active_at: String,
    pub stopped_at: Option<String>,
    /// Milliseconds from the create request to a running sandbox.
    pub create_ms: Option<f64>,
    /// While `queued`: creations the node serves before this one (0 = next).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<u64>,
    /// While paused: when the pause began (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<String>,
    /// Resident memory the last pause pushed out of RAM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_freed_bytes: Option<u64>,
    /// While paused: suspended to disk (no process runs; resume restores
    /// it in a new one) rather than frozen.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspended: bool,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
    /// Nodes that could not be asked: their sandboxes last seen by this
    /// apiserver are listed with state `unknown`, others may be missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable_nodes: Vec<String>,
}

/// `POST /v1/sandboxes/{id}/pause`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PauseResult {
    pub sandbox: Sandbox,
    /// False if the sandbox was already paused (pause is idempotent).
    pub changed: bool,
    /// The sandbox's memory charge before and after the push-out.
    pub memory_before_bytes: u64,
    pub memory_after_bytes: u64,
    pub memory_freed_bytes: u64,
    pub duration_ms: f64,
    /// Suspended to disk (a microVM's process ended) rather than frozen.
    #[serde(default)]
    pub suspended: bool,
    /// Bytes the suspend image occupies on disk (0 for a freeze).
    #[serde(default)]
    pub disk_bytes: u64,
}

/// `POST /v1/sandboxes/{id}/resume`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResumeResult {
    pub sandbox: Sandbox,
    /// False if the sandbox was already running.
    pub changed: bool,
    pub duration_ms: f64,
}

/// `POST /v1/sandboxes/{id}/timeout`: extend (or shorten) a sandbox's
/// lease. Absent fields stay as they are.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTimeoutRequest {
    /// New idle TTL in seconds (0 disables the idle timeout).
    #[serde(default)]
    pub ttl_running_stop: Option<u64>,
    /// The sandbox ends this many seconds from now, whatever its activity
    /// (bounded by the node's maximum lifetime, counted from creation).
    #[serde(default)]
    pub lifetime_s: Option<u64>,
}

/// `PATCH /v1/sandboxes/{id}`: change what can change while a sandbox
/// lives. Absent fields stay as they are.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSandboxRequest {
    /// The new CPU QoS class, applied to the sandbox's running tasks too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_class: Option<QosClass>,
}

/// One sandbox a job-wide action could not change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobFailure {
    /// The sandbox id (or `node:<name>` for a node that cannot be reached).
    pub id: String,
    pub code: crate::ErrorCode,
    pub message: String,
}

/// `POST /v1/jobs/{job}/pause` and `/resume`. Idempotent: sandboxes already
/// in the asked-for state count as `unchanged`, stopped ones as `ended`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobActionResult {
    pub job: String,
    /// Sandboxes of the job this token sees, on every node.
    pub matched: u64,
    pub changed: u64,
    pub unchanged: u64,
    pub ended: u64,
    pub memory_freed_bytes: u64,
    pub failed: Vec<JobFailure>,
    pub duration_ms: f64,
}

/// One line of an event stream (`GET /v1/sandboxes/{id}/events`,
/// `GET /v1/jobs/{job}/events`): newline-delimited JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxEvent {
    pub id: String,
    pub job: Option<String>,
    pub state: SandboxState,
    pub state_reason: Option<String>,
    /// RFC 3339.
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<u64>,
}

/// `PUT /v1/sandboxes/{id}/network`: the sandbox's network rules, replaced
/// whole (same keys as at creation: service names, IPv4 prefixes with
/// optional protocol and ports, domains).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkRules {
    pub network_rules: BTreeMap<String, bool>,
}
