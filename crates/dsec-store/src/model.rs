//! The records the store keeps, as plain data.

use std::collections::BTreeMap;

/// The SHA-256 of a bearer token: the store never sees a token itself.
pub type TokenHash = [u8; 32];

/// What kind of principal a name is: a project (which nests, through
/// `Principal::parent`). The tenants of the first schemas became top-level
/// projects (migration 3); people and agents are named by their tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrincipalKind {
    Project,
}

impl PrincipalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PrincipalKind::Project => "project",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "project" => Some(PrincipalKind::Project),
            _ => None,
        }
    }
}

/// Someone who holds tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub kind: PrincipalKind,
    /// The enclosing project; `None` at the top.
    pub parent: Option<String>,
    pub admin: bool,
    pub created_at_ms: u64,
}

impl Principal {
    /// A top-level project (what a tenant was).
    pub fn tenant(name: &str, admin: bool, created_at_ms: u64) -> Self {
        Principal { name: name.to_string(), kind: PrincipalKind::Project, parent: None, admin, created_at_ms }
    }

    /// A project named by its path (`team-rl/exp-42`): its parent is the
    /// path without the last segment.
    pub fn project(path: &str, created_at_ms: u64) -> Self {
        let parent = path.rsplit_once('/').map(|(p, _)| p.to_string());
        Principal { name: path.to_string(), kind: PrincipalKind::Project, parent, admin: false, created_at_ms }
    }
}

/// A token to record for a principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewToken {
    pub hash: TokenHash,
    pub created_at_ms: u64,
    /// After this instant the token is refused; `None`: it never expires.
    pub expires_at_ms: Option<u64>,
}

/// What a live (known, unrevoked, unexpired) token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub principal: Principal,
    pub expires_at_ms: Option<u64>,
    /// What the token may do in its project.
    pub role: crate::Role,
}

impl Grant {
    /// Whether the token still holds at `now_ms`.
    pub fn live_at(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|t| now_ms < t)
    }
}

/// Whether placement may send new sandboxes to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Takes new sandboxes.
    Active,
    /// Takes no new sandboxes; what runs there goes on.
    Draining,
    /// Not seen for too long (or left): its sandboxes are `unknown`.
    Down,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Active => "active",
            NodeState::Draining => "draining",
            NodeState::Down => "down",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "active" => Some(NodeState::Active),
            "draining" => Some(NodeState::Draining),
            "down" => Some(NodeState::Down),
            _ => None,
        }
    }
}

/// One edge in the node registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub name: String,
    /// Where apiservers reach the edge.
    pub url: String,
    /// Hardware and operator labels (`kvm=true`, `gpu=...`).
    pub labels: BTreeMap<String, String>,
    /// The backends the node offers (`container`, `microvm`, `vm`).
    pub backends: Vec<String>,
    /// Its placement pool (`primary`, `burst`).
    pub pool: String,
    pub state: NodeState,
    pub last_seen_ms: Option<u64>,
    pub registered_at_ms: u64,
}
