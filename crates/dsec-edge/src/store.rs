//! Durable sandbox records in an embedded SQLite database.
//!
//! The in-memory registry is the source of truth while the edge runs; this
//! store lets a restarted edge find (and re-adopt or clean up) every sandbox
//! it had. One writer thread owns the connection and commits whatever has
//! queued up in one transaction, so a burst of creations costs one commit,
//! not one per sandbox.

use std::path::Path;
use std::sync::mpsc;

use rusqlite::{params, Connection};
use tokio::sync::oneshot;

use crate::model::{SandboxRecord, RECORD_VERSION};

/// Schema version of the database (`PRAGMA user_version`).
const SCHEMA_VERSION: i64 = 1;
const MAX_BATCH: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("edge database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("edge database schema version {0} is newer than this edge understands ({SCHEMA_VERSION})")]
    TooNew(i64),
    #[error("edge database writer has stopped")]
    Stopped,
}

enum Cmd {
    Upsert(Box<SandboxRecord>),
    Delete(String),
    Sync(oneshot::Sender<()>),
}

#[derive(Clone)]
pub struct Store {
    tx: mpsc::Sender<Cmd>,
}

impl Store {
    /// Opens (creating or migrating) the database and returns every record.
    pub fn open(path: &Path) -> Result<(Store, Vec<SandboxRecord>), StoreError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // WAL + NORMAL: a commit survives a crash of the edge process (the
        // case that matters for re-adoption); only power loss may lose the
        // last commits, and with them sandboxes that died with the host.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // Every creation waits for its record's commit, so nothing slow may
        // sit on the commit path: the pages of thousands of records stay in
        // cache (the default 2 MiB is outgrown at a few thousand sandboxes),
        // and checkpoints (which fsync) run on a thread of their own instead
        // of inside whichever commit crosses the WAL threshold.
        conn.pragma_update(None, "cache_size", -65536)?;
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        migrate(&conn)?;
        let records = load(&conn)?;
        let checkpointer = spawn_checkpointer(path)?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("edge-store".into())
            .spawn(move || {
                writer(conn, rx);
                // The store is gone: so is the checkpointer.
                drop(checkpointer);
            })
            .map_err(|e| StoreError::Sqlite(rusqlite::Error::ToSqlConversionFailure(Box::new(e))))?;
        Ok((Store { tx }, records))
    }

    /// Queues a write; it commits with the next batch.
    pub fn upsert(&self, rec: &SandboxRecord) {
        let _ = self.tx.send(Cmd::Upsert(Box::new(rec.clone())));
    }

    pub fn delete(&self, id: &str) {
        let _ = self.tx.send(Cmd::Delete(id.to_string()));
    }

    /// Waits until every write queued before this call is committed.
    pub async fn sync(&self) -> Result<(), StoreError> {
        self.sync_request().await
    }

    /// Asks now for a commit of every write queued so far; the returned
    /// future resolves when it is done. Lets the caller do other work (the
    /// cgroup) while the commit is in flight.
    pub fn sync_request(&self) -> impl std::future::Future<Output = Result<(), StoreError>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let sent = self.tx.send(Cmd::Sync(tx)).is_ok();
        async move {
            if !sent {
                return Err(StoreError::Stopped);
            }
            rx.await.map_err(|_| StoreError::Stopped)
        }
    }
}

/// How often the WAL is folded back into the database.
const CHECKPOINT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// A second connection that checkpoints the WAL now and then. PASSIVE
/// never blocks the writer; it copies what it can and tries again later.
/// It runs until the returned sender is dropped.
pub(crate) fn spawn_checkpointer(path: &Path) -> Result<mpsc::Sender<()>, StoreError> {
    let conn = Connection::open(path)?;
    let (stop, stopped) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("edge-store-checkpoint".into())
        .spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(CHECKPOINT_INTERVAL) {
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    tracing::debug!(error = %e, "WAL checkpoint failed; retrying later");
                }
            }
        })
        .map_err(|e| StoreError::Sqlite(rusqlite::Error::ToSqlConversionFailure(Box::new(e))))?;
    Ok(stop)
}

fn migrate(conn: &Connection) -> Result<(), StoreError> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::TooNew(version));
    }
    if version < 1 {
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS sandboxes (
                 id TEXT PRIMARY KEY,
                 version INTEGER NOT NULL,
                 record TEXT NOT NULL
             );
             PRAGMA user_version = 1;",
        )?;
    }
    Ok(())
}

fn load(conn: &Connection) -> Result<Vec<SandboxRecord>, StoreError> {
    let mut stmt = conn.prepare("SELECT id, version, record FROM sandboxes")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?, r.get::<_, String>(2)?)))?;
    let mut out = Vec::new();
    for row in rows {
        let (id, version, json) = row?;
        match (version, serde_json::from_str::<SandboxRecord>(&json)) {
            (RECORD_VERSION, Ok(rec)) => out.push(rec),
            (v, res) => tracing::warn!(%id, version = v, error = ?res.err(), "skipping unreadable sandbox record"),
        }
    }
    Ok(out)
}

fn writer(mut conn: Connection, rx: mpsc::Receiver<Cmd>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(_) => break,
            }
        }
        let mut waiters = Vec::new();
        if let Err(e) = apply(&mut conn, batch, &mut waiters) {
            tracing::error!(error = %e, "edge database write failed");
        }
        for w in waiters {
            let _ = w.send(());
        }
    }
}

fn apply(conn: &mut Connection, batch: Vec<Cmd>, waiters: &mut Vec<oneshot::Sender<()>>) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut up = tx.prepare_cached("INSERT OR REPLACE INTO sandboxes (id, version, record) VALUES (?1, ?2, ?3)")?;
        let mut del = tx.prepare_cached("DELETE FROM sandboxes WHERE id = ?1")?;
        for cmd in batch {
            match cmd {
                Cmd::Upsert(rec) => {
                    let json = serde_json::to_string(&rec).expect("records serialize");
                    up.execute(params![rec.id, RECORD_VERSION, json])?;
                }
                Cmd::Delete(id) => {
                    del.execute(params![id])?;
                }
                Cmd::Sync(w) => waiters.push(w),
            }
        }
    }
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;

    pub(crate) fn record(id: &str) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            tenant: "t".into(),
            node: "n".into(),
            spec: SandboxSpec {
                backend: BackendKind::Container,
                image: "busybox".into(),
                workspace: None,
                toolkits: vec![],
                limits: Limits { memory_mb: 64, cpu_cores: 1.0, disk_mb: 64, pids: 64, cpu_quota_cores: None },
                idle_ttl_s: 300,
                max_lifetime_s: 3600,
                init_user: "root".into(),
                env: Default::default(),
                workdir: None,
                labels: Default::default(),
                job: None,
                network_rules: Default::default(),
                snapshot: None,
                qos_class: QosClass::BestEffort,
                volumes: Default::default(),
                writable_layer_in_memory: false,
            },
            state: State::Running,
            reason: None,
            created_at_ms: 1,
            last_active_ms: 2,
            stopped_at_ms: None,
            create_ms: Some(1.5),
            pid: Some(10),
            paused_at_ms: None,
            memory_freed_bytes: None,
            suspended: false,
            queue_position: None,
        }
    }

    #[tokio::test]
    async fn records_survive_reopen_and_deletes_stick() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("edge.db");
        {
            let (store, recs) = Store::open(&db).unwrap();
            assert!(recs.is_empty());
            for i in 0..100 {
                store.upsert(&record(&format!("n.{i}")));
            }
            store.delete("n.5");
            let mut r = record("n.6");
            r.state = State::Stopped;
            store.upsert(&r);
            store.sync().await.unwrap();
        }
        let (_, recs) = Store::open(&db).unwrap();
        assert_eq!(recs.len(), 99);
        assert!(recs.iter().any(|r| r.id == "n.6" && r.state == State::Stopped));
        assert!(!recs.iter().any(|r| r.id == "n.5"));
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("edge.db");
        Connection::open(&db).unwrap().pragma_update(None, "user_version", 99).unwrap();
        assert!(matches!(Store::open(&db), Err(StoreError::TooNew(99))));
    }
}
