//! Cluster membership in the shared store: join tokens, and what an edge
//! declares when it joins, beside its row of the node registry.
//!
//! Kept apart from [`crate::Store`] (one trait per concern) so each engine
//! implements it in a file of its own (`sqlite/cluster.rs`,
//! `postgres/cluster.rs`).

use std::future::Future;

use crate::{NewToken, NodeRecord, Result, TokenHash};

/// What a joined edge declared beyond its registry row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The bearer apiservers present to the edge. The apiservers need it in
    /// clear to call the edge, so the database holding it is as trusted as
    /// they are.
    pub secret: String,
    /// Capacity: CPU in thousandths of a core, memory, sandboxes.
    pub cpu_millis: u64,
    pub memory_mb: u64,
    pub max_sandboxes: u64,
}

/// A registered node with its membership, if it joined (nodes put in the
/// registry by other means have none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub node: NodeRecord,
    pub membership: Option<Membership>,
}

pub trait ClusterStore: Send + Sync {
    /// Records a join token.
    fn add_join_token(&self, token: NewToken) -> impl Future<Output = Result<()>> + Send;

    /// Whether the token admits an edge at `now_ms` (known, unrevoked,
    /// unexpired).
    fn join_token_live(&self, hash: &TokenHash, now_ms: u64) -> impl Future<Output = Result<bool>> + Send;

    /// Revokes a join token; `false` if it was unknown or already revoked.
    fn revoke_join_token(&self, hash: &TokenHash, now_ms: u64) -> impl Future<Output = Result<bool>> + Send;

    /// Registers (or re-registers) a node and its membership in one
    /// transaction. A node that was draining stays draining (a restarted
    /// edge does not undo its drain); any other state becomes
    /// `node.state`. `true` if the node was registered before.
    fn join_node(&self, node: &NodeRecord, membership: &Membership) -> impl Future<Output = Result<bool>> + Send;

    /// Every registered node with its membership, by name.
    fn members(&self) -> impl Future<Output = Result<Vec<Member>>> + Send;
}
