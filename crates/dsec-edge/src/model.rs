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
    pub cpu_cores: f64,
    pub disk_mb: u64,
    pub pids: u64,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Creating,
    Running,
    Stopping,
    Stopped,
    Failed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Running => "running",
            State::Stopping => "stopping",
            State::Stopped => "stopped",
            State::Failed => "failed",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, State::Stopped | State::Failed)
    }

    /// The state machine: which transitions are legal.
    pub fn can_become(self, next: State) -> bool {
        use State::*;
        matches!(
            (self, next),
            (Creating, Running) | (Creating, Failed) | (Creating, Stopping)
                | (Running, Stopping) | (Running, Failed)
                | (Stopping, Stopped) | (Stopping, Failed)
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
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

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
    }
}
