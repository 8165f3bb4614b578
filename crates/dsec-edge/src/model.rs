//! Core types of the edge: what a sandbox is asked to be (`SandboxSpec`) and
//! what the edge records about it (`SandboxRecord`). These are persisted (as
//! versioned JSON in the edge's database) but are not the public wire types:
//! the apiserver converts at its boundary.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Container,
    Microvm,
    Vm,
    Fncall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub memory_mb: u64,
    /// What the sandbox reserves of the node (admission, placement) and,
    /// unless `cpu_quota_cores` says otherwise, its CPU quota.
    pub cpu_cores: f64,
    pub disk_mb: u64,
    pub pids: u64,
    /// A CPU quota above the reservation, for the edge's own FnCall
    /// runners (see SandboxRequest::cpu_quota_cores); None for every
    /// sandbox a user creates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_quota_cores: Option<f64>,
}

/// A creation request, after defaults were applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxSpec {
    pub backend: BackendKind,
    pub image: String,
    pub workspace: Option<String>,
    pub toolkits: Vec<String>,
    pub limits: Limits,
    /// 0 = no idle timeout.
    pub idle_ttl_s: u64,
    pub max_lifetime_s: u64,
    pub init_user: String,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub job: Option<String>,
    pub network_rules: BTreeMap<String, bool>,
    /// A microVM whose writable disk starts from this snapshot (its id).
    #[serde(default)]
    pub snapshot: Option<String>,
    /// The CPU QoS class (changeable while the sandbox runs). Records from
    /// before classes existed ran with the default weights: latency
    /// sensitive.
    #[serde(default)]
    pub qos_class: QosClass,
    /// Named volumes of the owner's, by sandbox path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub volumes: BTreeMap<String, VolumeRef>,
    /// A container whose writable layer is a tmpfs on a node that keeps
    /// layers on its disk (`SandboxRequest::writable_layer_in_memory`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub writable_layer_in_memory: bool,
}

/// A named volume a sandbox mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRef {
    pub name: String,
    #[serde(default)]
    pub read_only: bool,
}

pub use crate::cgroup::QosClass;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Waiting for a creation slot (backpressure); in memory only.
    Queued,
    Creating,
    Running,
    /// Being frozen and having its memory pushed out.
    Pausing,
    /// Frozen, its memory in swap; holds no admission reservation.
    Paused,
    /// Being thawed.
    Resuming,
    Stopping,
    Stopped,
    Failed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Creating => "creating",
            State::Running => "running",
            State::Pausing => "pausing",
            State::Paused => "paused",
            State::Resuming => "resuming",
            State::Stopping => "stopping",
            State::Stopped => "stopped",
            State::Failed => "failed",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, State::Stopped | State::Failed)
    }

    /// Pausing, paused or resuming: the sandbox's processes are (or are
    /// about to be) frozen.
    pub fn is_paused(self) -> bool {
        matches!(self, State::Pausing | State::Paused | State::Resuming)
    }

    /// The state machine: which transitions are legal.
    pub fn can_become(self, next: State) -> bool {
        use State::*;
        matches!(
            (self, next),
            (Queued, Creating)
                | (Queued, Stopped)
                | (Creating, Running)
                | (Creating, Failed)
                | (Creating, Stopping)
                | (Running, Stopping)
                | (Running, Failed)
                | (Running, Pausing)
                | (Pausing, Paused)
                | (Pausing, Running)
                | (Pausing, Stopping)
                | (Pausing, Failed)
                | (Paused, Resuming)
                | (Paused, Stopping)
                | (Paused, Failed)
                | (Resuming, Running)
                | (Resuming, Paused)
                | (Resuming, Stopping)
                | (Resuming, Failed)
                | (Stopping, Stopped)
                | (Stopping, Failed)
        )
    }
}

/// Who asks: a tenant, or the admin who sees every tenant's sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant: String,
    pub admin: bool,
}

impl Caller {
    pub fn admin() -> Self {
        Caller { tenant: "admin".into(), admin: true }
    }

    pub fn tenant(name: impl Into<String>) -> Self {
        Caller { tenant: name.into(), admin: false }
    }

    pub fn may_see(&self, owner: &str) -> bool {
        self.admin || self.tenant == owner
    }
}

/// Schema version of persisted records; bump with a migration in store.rs.
pub const RECORD_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    pub tenant: String,
    pub node: String,
    pub spec: SandboxSpec,
    pub state: State,
    pub reason: Option<String>,
    pub created_at_ms: u64,
    pub last_active_ms: u64,
    pub stopped_at_ms: Option<u64>,
    /// Milliseconds from the request to a running sandbox.
    pub create_ms: Option<f64>,
    /// Host pid of the guest agent while it runs.
    pub pid: Option<i32>,
    /// When the sandbox was last paused (set while paused). Fields added
    /// after version 1 default when absent, so older records still load.
    #[serde(default)]
    pub paused_at_ms: Option<u64>,
    /// Resident memory the last pause pushed out of RAM.
    #[serde(default)]
    pub memory_freed_bytes: Option<u64>,
    /// Paused by a suspend to disk: no process runs; resume starts a new
    /// one from the saved image.
    #[serde(default)]
    pub suspended: bool,
    /// Place in the creation queue while `Queued` (0 = next); filled in
    /// when the record is read, never stored.
    #[serde(default, skip_serializing)]
    pub queue_position: Option<u64>,
}

pub use dsec_agent_proto::now_ms;

/// Filter of list calls.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub state: Option<State>,
    pub job: Option<String>,
    pub labels: Vec<(String, String)>,
}

impl ListFilter {
    pub fn matches(&self, r: &SandboxRecord) -> bool {
        self.state.is_none_or(|s| s == r.state)
            && self.job.as_ref().is_none_or(|j| r.spec.job.as_ref() == Some(j))
            && self.labels.iter().all(|(k, v)| r.spec.labels.get(k) == Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_machine_allows_only_forward_moves() {
        use State::*;
        assert!(Creating.can_become(Running));
        assert!(Running.can_become(Stopping));
        assert!(Stopping.can_become(Stopped));
        assert!(!Stopped.can_become(Running));
        assert!(!Failed.can_become(Stopping));
        assert!(!Running.can_become(Creating));
        assert!(Running.can_become(Pausing) && Pausing.can_become(Paused));
        assert!(Paused.can_become(Resuming) && Resuming.can_become(Running));
        assert!(!Paused.can_become(Running), "resume goes through resuming");
        assert!(!Stopped.can_become(Resuming));
        assert!(Queued.can_become(Creating) && !Queued.can_become(Running));
    }

    /// A spec stored before QoS classes existed ran with the default
    /// weights: it reads back latency sensitive.
    #[test]
    fn a_spec_without_a_qos_class_is_latency_sensitive() {
        let json = r#"{"backend":"vm","image":"debian-vm","workspace":null,"toolkits":[],
            "limits":{"memory_mb":1024,"cpu_cores":1.0,"disk_mb":64,"pids":64},"idle_ttl_s":0,
            "max_lifetime_s":60,"init_user":"root","env":{},"workdir":null,"labels":{},"job":null,
            "network_rules":{}}"#;
        let spec: SandboxSpec = serde_json::from_str(json).unwrap();
        assert_eq!(spec.qos_class, QosClass::LatencySensitive);
        let back: SandboxSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(back, spec);
    }
}
