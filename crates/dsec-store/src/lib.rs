//! The control plane's shared state: principals and their tokens, and the
//! node registry, behind one interface (`Store`) with two engines: SQLite
//! (`dsec up`, one apiserver) and PostgreSQL (a cluster: any number of
//! apiservers on one database). Per-sandbox state is not here: it stays on
//! its edge, and a sandbox id names its node.
//!
//! Both engines run the same versioned migrations (`migrations`) and pass
//! the same test suite (`tests/suite.rs`).

use std::future::Future;
use std::path::PathBuf;

pub mod cluster;
pub mod creation_keys;
mod error;
pub mod migrations;
mod model;
mod postgres;
mod postgres_iam;
pub mod projects;
mod sqlite;
mod sqlite_iam;
#[cfg(feature = "testing")]
pub mod testing;

pub use cluster::{ClusterStore, Member, Membership};
pub use creation_keys::{CreationKeys, CREATION_KEY_TTL_MS};
pub use error::StoreError;
pub use model::{Grant, NewToken, NodeRecord, NodeState, Principal, PrincipalKind, TokenHash};
pub use postgres::PgStore;
pub use projects::{Limit, Quota, QuotaError, Role, TokenInfo};
pub use sqlite::SqliteStore;

/// Milliseconds since the Unix epoch: the stamp both engines put on rows
/// no caller dated (a migration applied, older tokens revoked).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// The shared state, as every engine serves it.
///
/// Writes are atomic: each call is one transaction. A call that fails with
/// `StoreError::Unavailable` changed nothing and may be retried.
pub trait Store: Send + Sync {
    /// The version of the schema the database is at.
    fn schema_version(&self) -> impl Future<Output = Result<i64>> + Send;

    /// Adds a principal, with its first token if given; `Exists` if the
    /// name (or the token) is taken, `NoSuchPrincipal` if its parent is
    /// missing.
    fn create_principal(&self, principal: &Principal, token: Option<NewToken>) -> impl Future<Output = Result<()>> + Send;

    /// Every principal, by name.
    fn principals(&self) -> impl Future<Output = Result<Vec<Principal>>> + Send;

    fn principal(&self, name: &str) -> impl Future<Output = Result<Option<Principal>>> + Send;

    /// Makes `name` an admin principal (created if missing) holding
    /// `token`. With `exclusive`, every other token of `name` is revoked:
    /// one apiserver whose token file is the only admin token; without it,
    /// replicas that each bring a token file add theirs.
    fn set_admin_token(&self, name: &str, token: NewToken, exclusive: bool) -> impl Future<Output = Result<()>> + Send;

    /// Gives `principal` one more token.
    fn add_token(&self, principal: &str, token: NewToken) -> impl Future<Output = Result<()>> + Send;

    /// Revokes a token at `now_ms`, and every token it issued (and so on
    /// down); `false` if it was unknown or already revoked. Every later
    /// `grant` of them, by any process, is `None`.
    fn revoke_token(&self, hash: &TokenHash, now_ms: u64) -> impl Future<Output = Result<bool>> + Send;

    /// What the token grants at `now_ms`: `None` if it is unknown, revoked
    /// or expired.
    fn grant(&self, hash: &TokenHash, now_ms: u64) -> impl Future<Output = Result<Option<Grant>>> + Send;

    /// Registers a node or replaces its record.
    fn put_node(&self, node: &NodeRecord) -> impl Future<Output = Result<()>> + Send;

    /// Every registered node, by name.
    fn nodes(&self) -> impl Future<Output = Result<Vec<NodeRecord>>> + Send;

    fn node(&self, name: &str) -> impl Future<Output = Result<Option<NodeRecord>>> + Send;

    /// `false` if no such node.
    fn set_node_state(&self, name: &str, state: NodeState) -> impl Future<Output = Result<bool>> + Send;

    /// Records that the node answered at `at_ms`; `false` if no such node.
    fn node_seen(&self, name: &str, at_ms: u64) -> impl Future<Output = Result<bool>> + Send;

    /// `false` if no such node.
    fn remove_node(&self, name: &str) -> impl Future<Output = Result<bool>> + Send;

    // Projects, roles and quotas (IAM).

    /// Gives `principal` a token of `role`, issued by the token `issuer`
    /// (`IssuerRevoked` if that one is no longer live).
    fn issue_token(
        &self,
        principal: &str,
        token: NewToken,
        role: Role,
        issuer: Option<TokenHash>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Every token, revoked and expired ones too, by principal then
    /// creation.
    fn tokens(&self) -> impl Future<Output = Result<Vec<TokenInfo>>> + Send;

    /// Deletes a project with its tokens and quota, and revokes every token
    /// its tokens issued; `HasChildren` while it has sub-projects, `false`
    /// if there is no such project.
    fn delete_principal(&self, name: &str, now_ms: u64) -> impl Future<Output = Result<bool>> + Send;

    /// Sets (`None`: removes) a project's quota, checked against its
    /// parent's quota and its siblings' in the same transaction
    /// (`projects::check_delegation`).
    fn set_quota(&self, project: &str, quota: Option<Quota>) -> impl Future<Output = Result<()>> + Send;

    /// Every project's quota, by project.
    fn quotas(&self) -> impl Future<Output = Result<Vec<(String, Quota)>>> + Send;
}

/// Where the shared state lives, as `--database` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// `sqlite:PATH`: a file owned by one process.
    Sqlite(PathBuf),
    /// `postgres://...` or `postgresql://...` (libpq's URL form).
    Postgres(String),
}

impl Database {
    pub fn parse(s: &str) -> Result<Database> {
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            return Ok(Database::Postgres(s.to_string()));
        }
        match s.strip_prefix("sqlite:") {
            Some(path) if !path.is_empty() => Ok(Database::Sqlite(PathBuf::from(path))),
            _ => Err(StoreError::Engine(format!("unknown database {s:?}: expected postgres://... or sqlite:PATH"))),
        }
    }
}

impl std::fmt::Display for Database {
    /// Without a password, for logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(p) => write!(f, "sqlite:{}", p.display()),
            Database::Postgres(url) => f.write_str(&postgres::redact(url)),
        }
    }
}

/// Either engine, chosen at run time (closed dispatch: the two engines are
/// the whole set).
pub enum AnyStore {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

impl AnyStore {
    /// Opens the database and brings its schema to this build's version.
    pub async fn open(db: &Database) -> Result<AnyStore> {
        match db {
            Database::Sqlite(path) => Ok(AnyStore::Sqlite(SqliteStore::open(path).await?)),
            Database::Postgres(url) => Ok(AnyStore::Postgres(PgStore::open(url).await?)),
        }
    }

    /// Whether this process is the only one writing (SQLite): then a
    /// single apiserver's token file may be the only admin token.
    pub fn is_exclusive(&self) -> bool {
        matches!(self, AnyStore::Sqlite(_))
    }
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            AnyStore::Sqlite($s) => $e.await,
            AnyStore::Postgres($s) => $e.await,
        }
    };
}

impl Store for AnyStore {
    async fn schema_version(&self) -> Result<i64> {
        dispatch!(self, s => s.schema_version())
    }
    async fn create_principal(&self, principal: &Principal, token: Option<NewToken>) -> Result<()> {
        dispatch!(self, s => s.create_principal(principal, token))
    }
    async fn principals(&self) -> Result<Vec<Principal>> {
        dispatch!(self, s => s.principals())
    }
    async fn principal(&self, name: &str) -> Result<Option<Principal>> {
        dispatch!(self, s => s.principal(name))
    }
    async fn set_admin_token(&self, name: &str, token: NewToken, exclusive: bool) -> Result<()> {
        dispatch!(self, s => s.set_admin_token(name, token, exclusive))
    }
    async fn add_token(&self, principal: &str, token: NewToken) -> Result<()> {
        dispatch!(self, s => s.add_token(principal, token))
    }
    async fn revoke_token(&self, hash: &TokenHash, now_ms: u64) -> Result<bool> {
        dispatch!(self, s => s.revoke_token(hash, now_ms))
    }
    async fn grant(&self, hash: &TokenHash, now_ms: u64) -> Result<Option<Grant>> {
        dispatch!(self, s => s.grant(hash, now_ms))
    }
    async fn put_node(&self, node: &NodeRecord) -> Result<()> {
        dispatch!(self, s => s.put_node(node))
    }
    async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        dispatch!(self, s => s.nodes())
    }
    async fn node(&self, name: &str) -> Result<Option<NodeRecord>> {
        dispatch!(self, s => s.node(name))
    }
    async fn set_node_state(&self, name: &str, state: NodeState) -> Result<bool> {
        dispatch!(self, s => s.set_node_state(name, state))
    }
    async fn node_seen(&self, name: &str, at_ms: u64) -> Result<bool> {
        dispatch!(self, s => s.node_seen(name, at_ms))
    }
    async fn remove_node(&self, name: &str) -> Result<bool> {
        dispatch!(self, s => s.remove_node(name))
    }
    async fn issue_token(&self, principal: &str, token: NewToken, role: Role, issuer: Option<TokenHash>) -> Result<()> {
        dispatch!(self, s => s.issue_token(principal, token, role, issuer))
    }
    async fn tokens(&self) -> Result<Vec<TokenInfo>> {
        dispatch!(self, s => s.tokens())
    }
    async fn delete_principal(&self, name: &str, now_ms: u64) -> Result<bool> {
        dispatch!(self, s => s.delete_principal(name, now_ms))
    }
    async fn set_quota(&self, project: &str, quota: Option<Quota>) -> Result<()> {
        dispatch!(self, s => s.set_quota(project, quota))
    }
    async fn quotas(&self) -> Result<Vec<(String, Quota)>> {
        dispatch!(self, s => s.quotas())
    }
}

impl ClusterStore for AnyStore {
    async fn add_join_token(&self, token: NewToken) -> Result<()> {
        dispatch!(self, s => s.add_join_token(token))
    }
    async fn join_token_live(&self, hash: &TokenHash, now_ms: u64) -> Result<bool> {
        dispatch!(self, s => s.join_token_live(hash, now_ms))
    }
    async fn revoke_join_token(&self, hash: &TokenHash, now_ms: u64) -> Result<bool> {
        dispatch!(self, s => s.revoke_join_token(hash, now_ms))
    }
    async fn join_node(&self, node: &NodeRecord, membership: &Membership) -> Result<bool> {
        dispatch!(self, s => s.join_node(node, membership))
    }
    async fn members(&self) -> Result<Vec<Member>> {
        dispatch!(self, s => s.members())
    }
}

impl CreationKeys for AnyStore {
    async fn place_creation(&self, tenant: &str, key: &str, node: &str, now_ms: u64) -> Result<String> {
        dispatch!(self, s => s.place_creation(tenant, key, node, now_ms))
    }
    async fn move_creation(&self, tenant: &str, key: &str, from: &str, to: &str) -> Result<bool> {
        dispatch!(self, s => s.move_creation(tenant, key, from, to))
    }
    async fn forget_creations(&self, before_ms: u64) -> Result<u64> {
        dispatch!(self, s => s.forget_creations(before_ms))
    }
}

/// Encodes labels and backends for their text columns (JSON, the same in
/// both engines).
pub(crate) mod columns {
    use std::collections::BTreeMap;

    use crate::{NodeState, Principal, PrincipalKind, StoreError};

    pub fn labels_json(v: &BTreeMap<String, String>) -> String {
        serde_json::Value::from_iter(v.iter().map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))).to_string()
    }

    pub fn backends_json(v: &[String]) -> String {
        serde_json::Value::from(v).to_string()
    }

    pub fn labels(s: &str) -> Result<BTreeMap<String, String>, StoreError> {
        serde_json::from_str(s).map_err(|e| StoreError::Corrupt { table: "nodes", detail: format!("labels: {e}") })
    }

    pub fn backends(s: &str) -> Result<Vec<String>, StoreError> {
        serde_json::from_str(s).map_err(|e| StoreError::Corrupt { table: "nodes", detail: format!("backends: {e}") })
    }

    pub fn node_state(s: &str) -> Result<NodeState, StoreError> {
        NodeState::parse(s).ok_or_else(|| StoreError::Corrupt { table: "nodes", detail: format!("state {s:?}") })
    }

    pub fn principal(name: String, kind: &str, parent: Option<String>, admin: bool, created_at_ms: i64) -> Result<Principal, StoreError> {
        let kind =
            PrincipalKind::parse(kind).ok_or_else(|| StoreError::Corrupt { table: "principals", detail: format!("kind {kind:?}") })?;
        Ok(Principal { name, kind, parent, admin, created_at_ms: created_at_ms.max(0) as u64 })
    }

    pub fn role(s: &str) -> Result<crate::Role, StoreError> {
        crate::Role::parse(s).ok_or_else(|| StoreError::Corrupt { table: "tokens", detail: format!("role {s:?}") })
    }

    /// A limit column: NULL is no limit.
    pub fn limit(v: Option<i64>) -> Option<u64> {
        v.map(|v| v.max(0) as u64)
    }

    pub fn limit_value(v: Option<u64>) -> Option<i64> {
        v.map(|v| v.min(i64::MAX as u64) as i64)
    }

    pub fn hash(bytes: &[u8]) -> Result<crate::TokenHash, StoreError> {
        bytes.try_into().map_err(|_| StoreError::Corrupt { table: "tokens", detail: format!("a token hash of {} bytes", bytes.len()) })
    }

    pub const QUOTA_COLUMNS: &str = "sandboxes, cpu_millis, memory_mb, disk_mb, creations_per_s, fncall_per_s, overcommit";

    /// The limit columns in `QUOTA_COLUMNS`' order.
    pub fn quota_values(q: &crate::Quota) -> [Option<i64>; 6] {
        crate::Limit::ALL.map(|l| limit_value(q.get(l)))
    }

    pub fn quota(values: [Option<i64>; 6], overcommit: bool) -> crate::Quota {
        let mut q = crate::Quota { overcommit, ..crate::Quota::default() };
        for (l, v) in crate::Limit::ALL.into_iter().zip(values) {
            q.set(l, limit(v));
        }
        q
    }
}
