//! The SQLite engine: one file, owned by one process.
//!
//! Calls run on tokio's blocking threads over one connection. The process
//! holds an exclusive `flock` on the file while the store is open, so every
//! write goes through this handle; that is what lets `grant` answer from an
//! in-memory index of live tokens (one hash-map lookup, no I/O), kept
//! exact by the writes themselves.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

mod cluster;
mod creation_keys;

use crate::columns;
use crate::migrations::{self, VERSION_TABLE};
use crate::{Grant, NewToken, NodeRecord, NodeState, Principal, Result, Store, StoreError, TokenHash};

pub struct SqliteStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    conn: Mutex<Connection>,
    /// Every unrevoked token; expiry is checked at each lookup.
    pub(crate) live: RwLock<HashMap<TokenHash, Grant>>,
    /// Holds the exclusive flock for as long as the store is open.
    _lock: std::fs::File,
}

const PRINCIPAL_COLUMNS: &str = "name, kind, parent, admin, created_at_ms";
pub(crate) const NODE_COLUMNS: &str = "name, url, labels, backends, pool, state, last_seen_ms, registered_at_ms";

fn principal_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String, Option<String>, bool, i64)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get::<_, i64>(3)? != 0, r.get(4)?))
}

pub(crate) type NodeRow = (String, String, String, String, String, String, Option<i64>, i64);

pub(crate) fn node_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<NodeRow> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?))
}

pub(crate) fn node_record(row: NodeRow) -> Result<NodeRecord> {
    let (name, url, labels, backends, pool, state, last_seen_ms, registered_at_ms) = row;
    Ok(NodeRecord {
        name,
        url,
        labels: columns::labels(&labels)?,
        backends: columns::backends(&backends)?,
        pool,
        state: columns::node_state(&state)?,
        last_seen_ms: last_seen_ms.map(|t| t.max(0) as u64),
        registered_at_ms: registered_at_ms.max(0) as u64,
    })
}

fn is_constraint(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ConstraintViolation)
}

/// Brings the schema to this build's version, one transaction per step.
fn migrate(conn: &mut Connection) -> Result<()> {
    conn.execute_batch(VERSION_TABLE)?;
    let version = |c: &Connection| c.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_version", [], |r| r.get::<_, i64>(0));
    let found = version(conn)?;
    if found > migrations::latest() {
        return Err(StoreError::NewerSchema { found, known: migrations::latest() });
    }
    for m in migrations::MIGRATIONS.iter().filter(|m| m.version > found) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if version(&tx)? >= m.version {
            continue;
        }
        tx.execute_batch(m.sql)?;
        tx.execute(
            "INSERT INTO schema_version (version, name, applied_at_ms) VALUES (?1, ?2, ?3)",
            params![m.version, m.name, crate::now_ms()],
        )?;
        tx.commit()?;
        tracing::info!(version = m.version, name = m.name, "applied schema migration");
    }
    Ok(())
}

pub(crate) fn load_live(conn: &Connection) -> Result<HashMap<TokenHash, Grant>> {
    let mut stmt = conn.prepare(
        "SELECT t.token_sha256, t.expires_at_ms, p.name, p.kind, p.parent, p.admin, p.created_at_ms, t.role
         FROM tokens t JOIN principals p ON p.name = t.principal WHERE t.revoked_at_ms IS NULL",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, Vec<u8>>(0)?,
            r.get::<_, Option<i64>>(1)?,
            r.get(2)?,
            r.get::<_, String>(3)?,
            r.get(4)?,
            r.get::<_, i64>(5)? != 0,
            r.get(6)?,
            r.get::<_, String>(7)?,
        ))
    })?;
    let mut live = HashMap::new();
    for row in rows {
        let (hash, expires, name, kind, parent, admin, created, role) = row?;
        let principal = columns::principal(name, &kind, parent, admin, created)?;
        let role = columns::role(&role)?;
        live.insert(columns::hash(&hash)?, Grant { principal, expires_at_ms: expires.map(|t| t.max(0) as u64), role });
    }
    Ok(live)
}

fn lock_exclusively(path: &Path) -> Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| StoreError::Engine(format!("{}: {e}", path.display())))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(StoreError::InUse(path.display().to_string())),
        Err(e) => Err(StoreError::Engine(format!("locking {}: {e}", path.display()))),
    }
}

impl SqliteStore {
    /// Opens (or creates) the database file and migrates it.
    pub async fn open(path: &Path) -> Result<SqliteStore> {
        let path: PathBuf = path.to_path_buf();
        let inner = tokio::task::spawn_blocking(move || -> Result<Inner> {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| StoreError::Engine(format!("{}: {e}", dir.display())))?;
            }
            let mut conn = Connection::open(&path)?;
            let lock = lock_exclusively(&path)?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "foreign_keys", "ON")?;
            migrate(&mut conn)?;
            let live = load_live(&conn)?;
            Ok(Inner { conn: Mutex::new(conn), live: RwLock::new(live), _lock: lock })
        })
        .await
        .map_err(|e| StoreError::Engine(format!("opening the database: {e}")))??;
        Ok(SqliteStore { inner: Arc::new(inner) })
    }

    /// Runs `f` on the connection, on a blocking thread.
    pub(crate) async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner, &mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = inner.conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&inner, &mut conn)
        })
        .await
        .map_err(|e| StoreError::Engine(format!("database thread: {e}")))?
    }
}

impl Inner {
    pub(crate) fn index(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<TokenHash, Grant>> {
        self.live.write().unwrap_or_else(|p| p.into_inner())
    }
}

fn insert_token(tx: &rusqlite::Transaction<'_>, principal: &str, t: &NewToken) -> Result<()> {
    let r = tx.execute(
        "INSERT INTO tokens (token_sha256, principal, created_at_ms, expires_at_ms) VALUES (?1, ?2, ?3, ?4)",
        params![t.hash.to_vec(), principal, t.created_at_ms as i64, t.expires_at_ms.map(|e| e as i64)],
    );
    match r {
        Ok(_) => Ok(()),
        Err(e) if is_constraint(&e) => Err(StoreError::Exists("a token with this hash".into())),
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn get_principal(conn: &Connection, name: &str) -> Result<Option<Principal>> {
    let row = conn.query_row(&format!("SELECT {PRINCIPAL_COLUMNS} FROM principals WHERE name = ?1"), [name], principal_row).optional()?;
    row.map(|(n, k, p, a, c)| columns::principal(n, &k, p, a, c)).transpose()
}

impl Store for SqliteStore {
    async fn schema_version(&self) -> Result<i64> {
        self.with_conn(|_, c| Ok(c.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_version", [], |r| r.get(0))?)).await
    }

    async fn create_principal(&self, principal: &Principal, token: Option<NewToken>) -> Result<()> {
        let p = principal.clone();
        self.with_conn(move |inner, c| {
            let tx = c.transaction()?;
            if let Some(parent) = &p.parent {
                if get_principal(&tx, parent)?.is_none() {
                    return Err(StoreError::NoSuchPrincipal(parent.clone()));
                }
            }
            let r = tx.execute(
                "INSERT INTO principals (name, kind, parent, admin, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![p.name, p.kind.as_str(), p.parent, p.admin as i64, p.created_at_ms as i64],
            );
            match r {
                Ok(_) => {}
                Err(e) if is_constraint(&e) => return Err(StoreError::Exists(format!("principal {:?}", p.name))),
                Err(e) => return Err(e.into()),
            }
            if let Some(t) = &token {
                insert_token(&tx, &p.name, t)?;
            }
            tx.commit()?;
            if let Some(t) = token {
                inner.index().insert(t.hash, Grant { principal: p, expires_at_ms: t.expires_at_ms, role: crate::Role::Admin });
            }
            Ok(())
        })
        .await
    }

    async fn principals(&self) -> Result<Vec<Principal>> {
        self.with_conn(|_, c| {
            let mut stmt = c.prepare(&format!("SELECT {PRINCIPAL_COLUMNS} FROM principals ORDER BY name"))?;
            let rows = stmt.query_map([], principal_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter().map(|(n, k, p, a, c)| columns::principal(n, &k, p, a, c)).collect()
        })
        .await
    }

    async fn principal(&self, name: &str) -> Result<Option<Principal>> {
        let name = name.to_string();
        self.with_conn(move |_, c| get_principal(c, &name)).await
    }

    async fn set_admin_token(&self, name: &str, token: NewToken, exclusive: bool) -> Result<()> {
        let name = name.to_string();
        self.with_conn(move |inner, c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO principals (name, kind, parent, admin, created_at_ms) VALUES (?1, 'project', NULL, 1, ?2)
                 ON CONFLICT (name) DO UPDATE SET admin = 1",
                params![name, token.created_at_ms as i64],
            )?;
            if exclusive {
                tx.execute(
                    "UPDATE tokens SET revoked_at_ms = ?1 WHERE principal = ?2 AND token_sha256 <> ?3 AND revoked_at_ms IS NULL",
                    params![crate::now_ms(), name, token.hash.to_vec()],
                )?;
            }
            // The token file's token is live whatever happened to it before.
            tx.execute(
                "INSERT INTO tokens (token_sha256, principal, created_at_ms, expires_at_ms) VALUES (?1, ?2, ?3, NULL)
                 ON CONFLICT (token_sha256) DO UPDATE SET principal = excluded.principal, expires_at_ms = NULL, revoked_at_ms = NULL",
                params![token.hash.to_vec(), name, token.created_at_ms as i64],
            )?;
            tx.commit()?;
            *inner.index() = load_live(c)?;
            Ok(())
        })
        .await
    }

    async fn add_token(&self, principal: &str, token: NewToken) -> Result<()> {
        let name = principal.to_string();
        self.with_conn(move |inner, c| {
            let tx = c.transaction()?;
            let Some(p) = get_principal(&tx, &name)? else { return Err(StoreError::NoSuchPrincipal(name)) };
            insert_token(&tx, &name, &token)?;
            tx.commit()?;
            inner.index().insert(token.hash, Grant { principal: p, expires_at_ms: token.expires_at_ms, role: crate::Role::Admin });
            Ok(())
        })
        .await
    }

    async fn revoke_token(&self, hash: &TokenHash, now_ms: u64) -> Result<bool> {
        let hash = *hash;
        self.with_conn(move |inner, c| {
            let tx = c.transaction()?;
            let revoked = crate::sqlite_iam::revoke_cascade(&tx, &[hash], now_ms)?;
            tx.commit()?;
            let mut index = inner.index();
            for h in &revoked {
                index.remove(h);
            }
            Ok(revoked.contains(&hash))
        })
        .await
    }

    async fn grant(&self, hash: &TokenHash, now_ms: u64) -> Result<Option<Grant>> {
        let live = self.inner.live.read().unwrap_or_else(|p| p.into_inner());
        Ok(live.get(hash).filter(|g| g.live_at(now_ms)).cloned())
    }

    async fn put_node(&self, node: &NodeRecord) -> Result<()> {
        let n = node.clone();
        self.with_conn(move |_, c| {
            c.execute(
                &format!(
                    "INSERT INTO nodes ({NODE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                     ON CONFLICT (name) DO UPDATE SET url = excluded.url, labels = excluded.labels, backends = excluded.backends,
                       pool = excluded.pool, state = excluded.state, last_seen_ms = excluded.last_seen_ms,
                       registered_at_ms = excluded.registered_at_ms"
                ),
                params![
                    n.name,
                    n.url,
                    columns::labels_json(&n.labels),
                    columns::backends_json(&n.backends),
                    n.pool,
                    n.state.as_str(),
                    n.last_seen_ms.map(|t| t as i64),
                    n.registered_at_ms as i64
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        self.with_conn(|_, c| {
            let mut stmt = c.prepare(&format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY name"))?;
            let rows = stmt.query_map([], node_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter().map(node_record).collect()
        })
        .await
    }

    async fn node(&self, name: &str) -> Result<Option<NodeRecord>> {
        let name = name.to_string();
        self.with_conn(move |_, c| {
            let row = c.query_row(&format!("SELECT {NODE_COLUMNS} FROM nodes WHERE name = ?1"), [name], node_row).optional()?;
            row.map(node_record).transpose()
        })
        .await
    }

    async fn set_node_state(&self, name: &str, state: NodeState) -> Result<bool> {
        let name = name.to_string();
        self.with_conn(move |_, c| Ok(c.execute("UPDATE nodes SET state = ?1 WHERE name = ?2", params![state.as_str(), name])? > 0)).await
    }

    async fn node_seen(&self, name: &str, at_ms: u64) -> Result<bool> {
        let name = name.to_string();
        self.with_conn(move |_, c| Ok(c.execute("UPDATE nodes SET last_seen_ms = ?1 WHERE name = ?2", params![at_ms as i64, name])? > 0))
            .await
    }

    async fn remove_node(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.with_conn(move |_, c| Ok(c.execute("DELETE FROM nodes WHERE name = ?1", [name])? > 0)).await
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
