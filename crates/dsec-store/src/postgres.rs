//! The PostgreSQL engine: one database shared by every apiserver replica.
//!
//! Every call checks a connection out of a small pool (deadpool) and runs
//! one prepared statement or one transaction, so what one replica writes
//! every other one reads on its next call: nothing is cached here. A pool
//! whose server went away fails calls with `StoreError::Unavailable`
//! within the connect timeout, and makes fresh connections once the server
//! answers again.

use std::time::Duration;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::error::SqlState;
use tokio_postgres::{NoTls, Row};

mod cluster;
mod creation_keys;

use crate::columns;
use crate::migrations::{self, VERSION_TABLE};
use crate::{Grant, NewToken, NodeRecord, NodeState, Principal, Result, Store, StoreError, TokenHash};

/// Connections per apiserver: calls are single short statements.
const POOL_SIZE: usize = 16;
/// How long a call may wait for a connection (to make one, or for one to
/// free up) before it is answered `Unavailable`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The advisory lock that serializes migrations across replicas starting
/// at once ("dsec" in ASCII).
const MIGRATION_LOCK: i64 = 0x6473_6563;

pub struct PgStore {
    pub(crate) pool: Pool,
}

pub(crate) const PRINCIPAL_COLUMNS: &str = "name, kind, parent, admin, created_at_ms";
pub(crate) const NODE_COLUMNS: &str = "name, url, labels, backends, pool, state, last_seen_ms, registered_at_ms";

pub(crate) fn principal(r: &Row) -> Result<Principal> {
    columns::principal(r.try_get(0)?, r.try_get::<_, &str>(1)?, r.try_get(2)?, r.try_get(3)?, r.try_get(4)?)
}

pub(crate) fn node_record(r: &Row) -> Result<NodeRecord> {
    Ok(NodeRecord {
        name: r.try_get(0)?,
        url: r.try_get(1)?,
        labels: columns::labels(r.try_get(2)?)?,
        backends: columns::backends(r.try_get(3)?)?,
        pool: r.try_get(4)?,
        state: columns::node_state(r.try_get(5)?)?,
        last_seen_ms: r.try_get::<_, Option<i64>>(6)?.map(|t| t.max(0) as u64),
        registered_at_ms: r.try_get::<_, i64>(7)?.max(0) as u64,
    })
}

pub(crate) fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

/// The URL without its password, for logs and errors.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***{}", &rest[at..]),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// Brings the schema to this build's version: one transaction per step,
/// each under an advisory lock so replicas starting together apply it once.
async fn migrate(client: &mut Object) -> Result<()> {
    loop {
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
        tx.batch_execute(VERSION_TABLE).await?;
        let found: i64 = tx.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[]).await?.try_get(0)?;
        if found > migrations::latest() {
            return Err(StoreError::NewerSchema { found, known: migrations::latest() });
        }
        let Some(m) = migrations::MIGRATIONS.iter().find(|m| m.version > found) else {
            tx.commit().await?;
            return Ok(());
        };
        tx.batch_execute(m.sql).await?;
        tx.execute(
            "INSERT INTO schema_version (version, name, applied_at_ms) VALUES ($1, $2, $3)",
            &[&m.version, &m.name, &crate::now_ms()],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(version = m.version, name = m.name, "applied schema migration");
    }
}

impl PgStore {
    /// Connects (libpq's URL form, no TLS) and migrates the database.
    pub async fn open(url: &str) -> Result<PgStore> {
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|e| StoreError::Engine(format!("database URL {}: {e}", redact(url))))?;
        config.connect_timeout(CONNECT_TIMEOUT);
        config.keepalives_idle(Duration::from_secs(30));
        if config.get_application_name().is_none() {
            config.application_name("dsec");
        }
        let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Engine(format!("connection pool: {e}")))?;
        let store = PgStore { pool };
        migrate(&mut store.client().await?).await?;
        Ok(store)
    }

    pub(crate) async fn client(&self) -> Result<Object> {
        Ok(self.pool.get().await?)
    }

    pub(crate) async fn query(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> Result<Vec<Row>> {
        let c = self.client().await?;
        let stmt = c.prepare_cached(sql).await?;
        Ok(c.query(&stmt, params).await?)
    }

    async fn execute(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> Result<u64> {
        let c = self.client().await?;
        let stmt = c.prepare_cached(sql).await?;
        Ok(c.execute(&stmt, params).await?)
    }
}

async fn insert_token(c: &impl GenericClient, principal: &str, t: &NewToken) -> Result<()> {
    let r = c
        .execute(
            "INSERT INTO tokens (token_sha256, principal, created_at_ms, expires_at_ms) VALUES ($1, $2, $3, $4)",
            &[&t.hash.as_slice(), &principal, &(t.created_at_ms as i64), &t.expires_at_ms.map(|e| e as i64)],
        )
        .await;
    match r {
        Ok(_) => Ok(()),
        Err(e) if is_unique_violation(&e) => Err(StoreError::Exists("a token with this hash".into())),
        Err(e) => Err(e.into()),
    }
}

pub(crate) async fn get_principal(c: &impl GenericClient, name: &str) -> Result<Option<Principal>> {
    let rows = c.query(&format!("SELECT {PRINCIPAL_COLUMNS} FROM principals WHERE name = $1"), &[&name]).await?;
    rows.first().map(principal).transpose()
}

impl Store for PgStore {
    async fn schema_version(&self) -> Result<i64> {
        let rows = self.query("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[]).await?;
        Ok(rows.first().map(|r| r.try_get(0)).transpose()?.unwrap_or(0))
    }

    async fn create_principal(&self, p: &Principal, token: Option<NewToken>) -> Result<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        if let Some(parent) = &p.parent {
            if get_principal(&tx, parent).await?.is_none() {
                return Err(StoreError::NoSuchPrincipal(parent.clone()));
            }
        }
        let r = tx
            .execute(
                "INSERT INTO principals (name, kind, parent, admin, created_at_ms) VALUES ($1, $2, $3, $4, $5)",
                &[&p.name, &p.kind.as_str(), &p.parent, &p.admin, &(p.created_at_ms as i64)],
            )
            .await;
        match r {
            Ok(_) => {}
            Err(e) if is_unique_violation(&e) => return Err(StoreError::Exists(format!("principal {:?}", p.name))),
            // The parent went away since the check above.
            Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => {
                return Err(StoreError::NoSuchPrincipal(p.parent.clone().unwrap_or_default()))
            }
            Err(e) => return Err(e.into()),
        }
        if let Some(t) = &token {
            insert_token(&tx, &p.name, t).await?;
        }
        Ok(tx.commit().await?)
    }

    async fn principals(&self) -> Result<Vec<Principal>> {
        let rows = self.query(&format!("SELECT {PRINCIPAL_COLUMNS} FROM principals ORDER BY name"), &[]).await?;
        rows.iter().map(principal).collect()
    }

    async fn principal(&self, name: &str) -> Result<Option<Principal>> {
        get_principal(&self.client().await?, name).await
    }

    async fn set_admin_token(&self, name: &str, token: NewToken, exclusive: bool) -> Result<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let created = token.created_at_ms as i64;
        tx.execute(
            "INSERT INTO principals (name, kind, parent, admin, created_at_ms) VALUES ($1, 'project', NULL, TRUE, $2)
             ON CONFLICT (name) DO UPDATE SET admin = TRUE",
            &[&name, &created],
        )
        .await?;
        if exclusive {
            tx.execute(
                "UPDATE tokens SET revoked_at_ms = $1 WHERE principal = $2 AND token_sha256 <> $3 AND revoked_at_ms IS NULL",
                &[&crate::now_ms(), &name, &token.hash.as_slice()],
            )
            .await?;
        }
        tx.execute(
            "INSERT INTO tokens (token_sha256, principal, created_at_ms, expires_at_ms) VALUES ($1, $2, $3, NULL)
             ON CONFLICT (token_sha256) DO UPDATE SET principal = excluded.principal, expires_at_ms = NULL, revoked_at_ms = NULL",
            &[&token.hash.as_slice(), &name, &created],
        )
        .await?;
        Ok(tx.commit().await?)
    }

    async fn add_token(&self, principal: &str, token: NewToken) -> Result<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // Locks the principal's row, so it cannot vanish before the insert.
        if tx.query_opt("SELECT 1 FROM principals WHERE name = $1 FOR SHARE", &[&principal]).await?.is_none() {
            return Err(StoreError::NoSuchPrincipal(principal.to_string()));
        }
        insert_token(&tx, principal, &token).await?;
        Ok(tx.commit().await?)
    }

    async fn revoke_token(&self, hash: &TokenHash, now_ms: u64) -> Result<bool> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let revoked = crate::postgres_iam::revoke_cascade(&tx, &[*hash], now_ms).await?;
        tx.commit().await?;
        Ok(revoked.contains(hash))
    }

    async fn grant(&self, hash: &TokenHash, now_ms: u64) -> Result<Option<Grant>> {
        let rows = self
            .query(
                "SELECT p.name, p.kind, p.parent, p.admin, p.created_at_ms, t.expires_at_ms, t.role
                 FROM tokens t JOIN principals p ON p.name = t.principal
                 WHERE t.token_sha256 = $1 AND t.revoked_at_ms IS NULL AND (t.expires_at_ms IS NULL OR t.expires_at_ms > $2)",
                &[&hash.as_slice(), &(now_ms as i64)],
            )
            .await?;
        let Some(row) = rows.first() else { return Ok(None) };
        let expires: Option<i64> = row.try_get(5)?;
        let role = columns::role(row.try_get(6)?)?;
        Ok(Some(Grant { principal: principal(row)?, expires_at_ms: expires.map(|t| t.max(0) as u64), role }))
    }

    async fn put_node(&self, n: &NodeRecord) -> Result<()> {
        self.execute(
            &format!(
                "INSERT INTO nodes ({NODE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (name) DO UPDATE SET url = excluded.url, labels = excluded.labels, backends = excluded.backends,
                   pool = excluded.pool, state = excluded.state, last_seen_ms = excluded.last_seen_ms,
                   registered_at_ms = excluded.registered_at_ms"
            ),
            &[
                &n.name,
                &n.url,
                &columns::labels_json(&n.labels),
                &columns::backends_json(&n.backends),
                &n.pool,
                &n.state.as_str(),
                &n.last_seen_ms.map(|t| t as i64),
                &(n.registered_at_ms as i64),
            ],
        )
        .await?;
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let rows = self.query(&format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY name"), &[]).await?;
        rows.iter().map(node_record).collect()
    }

    async fn node(&self, name: &str) -> Result<Option<NodeRecord>> {
        let rows = self.query(&format!("SELECT {NODE_COLUMNS} FROM nodes WHERE name = $1"), &[&name]).await?;
        rows.first().map(node_record).transpose()
    }

    async fn set_node_state(&self, name: &str, state: NodeState) -> Result<bool> {
        Ok(self.execute("UPDATE nodes SET state = $1 WHERE name = $2", &[&state.as_str(), &name]).await? > 0)
    }

    async fn node_seen(&self, name: &str, at_ms: u64) -> Result<bool> {
        Ok(self.execute("UPDATE nodes SET last_seen_ms = $1 WHERE name = $2", &[&(at_ms as i64), &name]).await? > 0)
    }

    async fn remove_node(&self, name: &str) -> Result<bool> {
        Ok(self.execute("DELETE FROM nodes WHERE name = $1", &[&name]).await? > 0)
    }

    async fn issue_token(&self, principal: &str, token: NewToken, role: crate::Role, issuer: Option<TokenHash>) -> Result<()> {
        self.iam_issue_token(principal, token, role, issuer).await
    }

    async fn tokens(&self) -> Result<Vec<crate::TokenInfo>> {
        self.iam_tokens().await
    }

    async fn delete_principal(&self, name: &str, now_ms: u64) -> Result<bool> {
        self.iam_delete_principal(name, now_ms).await
    }

    async fn set_quota(&self, project: &str, quota: Option<crate::Quota>) -> Result<()> {
        self.iam_set_quota(project, quota).await
    }

    async fn quotas(&self) -> Result<Vec<(String, crate::Quota)>> {
        self.iam_quotas().await
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(redact("postgres://dsec:s3cret@db:5432/dsec"), "postgres://dsec:***@db:5432/dsec");
        assert_eq!(redact("postgres://dsec@db/dsec"), "postgres://dsec@db/dsec");
        assert_eq!(redact("postgresql:///dsec?host=/run/postgresql"), "postgresql:///dsec?host=/run/postgresql");
    }
}
