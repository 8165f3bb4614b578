//! The node's journal: each sandbox's trajectory log (every operation, in
//! order, with its result and the files it changed) and the idempotency keys
//! of creations, in an SQLite database of its own next to the edge's records
//! (`journal.db`), so its writes never queue behind a burst of creations.
//!
//! Outputs are stored by reference: a step row names the SHA-256 of its
//! stdout and stderr, and the bytes live once in `blobs` (identical outputs
//! share one row). Each output is already bounded by the command's
//! `max_output_bytes`; uploaded file contents are kept (for replay) only up
//! to [`MAX_KEPT_CONTENT`].
//!
//! Each call is one short statement or transaction on one connection behind
//! a mutex: WAL with `synchronous=NORMAL` commits without an fsync, so a
//! step costs tens of microseconds, and a commit survives a crash of the
//! edge process (not a power loss, like the edge's own records).

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};
use sha2::{Digest, Sha256};

const SCHEMA_VERSION: i64 = 1;

/// Uploaded file content larger than this is recorded by digest only (the
/// step then cannot be replayed).
pub const MAX_KEPT_CONTENT: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("trajectory journal: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("trajectory journal schema version {0} is newer than this edge understands ({SCHEMA_VERSION})")]
    TooNew(i64),
}

/// Where a step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepStatus {
    /// Running now (or, read back after a restart, see `Interrupted`).
    Running,
    /// Finished; the outcome is recorded (an operation that failed inside
    /// the sandbox, e.g. a missing file, is finished too).
    Done,
    /// It was running when the edge stopped, or the edge lost the agent
    /// mid-way: whether it took effect is unknown.
    Interrupted,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Running => "running",
            StepStatus::Done => "done",
            StepStatus::Interrupted => "interrupted",
        }
    }

    fn parse(s: &str) -> StepStatus {
        match s {
            "running" => StepStatus::Running,
            "done" => StepStatus::Done,
            _ => StepStatus::Interrupted,
        }
    }
}

/// One row of a trajectory log, as stored. `op` and `outcome` are JSON of
/// the edge's `trajectory` types; the journal does not interpret them.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    pub seq: u64,
    pub step_id: Option<String>,
    pub kind: String,
    pub fingerprint: String,
    pub op: String,
    pub status: StepStatus,
    pub outcome: Option<String>,
    pub changed: Option<String>,
    pub started_ms: u64,
    pub finished_ms: Option<u64>,
}

/// What [`Journal::begin`] found.
#[derive(Debug)]
pub enum Begin {
    /// A new row with this sequence number, status running.
    New(u64),
    /// The step id was already in the log.
    Existing(StepRow),
}

/// What [`Journal::claim`] found for an idempotency key.
#[derive(Debug, PartialEq)]
pub enum Claim {
    /// The key is now ours; set its target with [`Journal::settle`].
    New,
    /// The key was used before, with this request fingerprint; `target` is
    /// `None` while the first request is still in progress.
    Existing { fingerprint: String, target: Option<String> },
}

pub struct Journal {
    conn: Mutex<Connection>,
    /// Folds the WAL back on a thread of its own (see `Store`): a
    /// checkpoint fsyncs, and must not land inside a step.
    _checkpointer: std::sync::mpsc::Sender<()>,
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

use crate::model::now_ms;

impl Journal {
    /// Opens (creating or migrating) the journal. Steps left `running` by
    /// an earlier edge process become `interrupted`: nobody will record
    /// their outcome now.
    pub fn open(path: &Path) -> Result<Journal, JournalError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        migrate(&conn)?;
        conn.execute("UPDATE steps SET status = 'interrupted', finished_ms = ?1 WHERE status = 'running'", params![now_ms() as i64])?;
        // A key claimed by a creation the previous edge never finished
        // names no sandbox: free it, so the client's retry creates one.
        conn.execute("DELETE FROM idempotency WHERE target IS NULL", [])?;
        let checkpointer = crate::store::spawn_checkpointer(path).map_err(|e| match e {
            crate::store::StoreError::Sqlite(e) => JournalError::Sqlite(e),
            other => JournalError::Sqlite(rusqlite::Error::ToSqlConversionFailure(Box::new(std::io::Error::other(other.to_string())))),
        })?;
        Ok(Journal { conn: Mutex::new(conn), _checkpointer: checkpointer })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps what a sandbox was created from (for replay), once.
    pub fn remember_sandbox(&self, sandbox: &str, tenant: &str, spec_json: &str) -> Result<(), JournalError> {
        self.conn()
            .execute("INSERT OR IGNORE INTO sandboxes (id, tenant, spec) VALUES (?1, ?2, ?3)", params![sandbox, tenant, spec_json])?;
        Ok(())
    }

    /// The tenant and spec (JSON) a sandbox was created with.
    pub fn sandbox(&self, sandbox: &str) -> Result<Option<(String, String)>, JournalError> {
        Ok(self
            .conn()
            .query_row("SELECT tenant, spec FROM sandboxes WHERE id = ?1", params![sandbox], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    pub fn lookup(&self, sandbox: &str, step_id: &str) -> Result<Option<StepRow>, JournalError> {
        lookup(&self.conn(), sandbox, step_id)
    }

    pub fn step(&self, sandbox: &str, seq: u64) -> Result<Option<StepRow>, JournalError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!("SELECT {COLUMNS} FROM steps WHERE sandbox = ?1 AND seq = ?2"))?;
        Ok(stmt.query_row(params![sandbox, seq as i64], row).optional()?)
    }

    /// Appends a running step, unless its step id is already in the log
    /// (then the recorded row is returned). Check and append are one
    /// transaction, so two clients racing with one step id get one row.
    pub fn begin(&self, sandbox: &str, step_id: Option<&str>, kind: &str, fingerprint: &str, op: &str) -> Result<Begin, JournalError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        if let Some(sid) = step_id {
            if let Some(existing) = lookup(&tx, sandbox, sid)? {
                return Ok(Begin::Existing(existing));
            }
        }
        let seq: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) + 1 FROM steps WHERE sandbox = ?1", params![sandbox], |r| r.get(0))?;
        tx.prepare_cached(
            "INSERT INTO steps (sandbox, seq, step_id, kind, fingerprint, op, status, started_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', ?7)",
        )?
        .execute(params![sandbox, seq, step_id, kind, fingerprint, op, now_ms() as i64])?;
        tx.commit()?;
        Ok(Begin::New(seq as u64))
    }

    /// Records how a step ended, with the blobs its outcome refers to (one
    /// transaction). `op`/`fingerprint`, when given, replace the provisional
    /// ones (an upload's content digest is known only at its end).
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        &self,
        sandbox: &str,
        seq: u64,
        status: StepStatus,
        outcome: Option<&str>,
        changed: Option<&str>,
        op: Option<(&str, &str)>,
        blobs: &[(&str, &[u8])],
    ) -> Result<(), JournalError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for (digest, data) in blobs {
            put_blob(&tx, sandbox, digest, data)?;
        }
        let (fp, op) = op.unzip();
        tx.prepare_cached(
            "UPDATE steps SET status = ?3, outcome = ?4, changed = ?5, finished_ms = ?6,
                    fingerprint = COALESCE(?7, fingerprint), op = COALESCE(?8, op)
             WHERE sandbox = ?1 AND seq = ?2",
        )?
        .execute(params![sandbox, seq as i64, status.as_str(), outcome, changed, now_ms() as i64, fp, op])?;
        tx.commit()?;
        Ok(())
    }

    /// Records the files a finished step changed.
    pub fn set_changed(&self, sandbox: &str, seq: u64, changed: &str) -> Result<(), JournalError> {
        self.conn()
            .prepare_cached("UPDATE steps SET changed = ?3 WHERE sandbox = ?1 AND seq = ?2")?
            .execute(params![sandbox, seq as i64, changed])?;
        Ok(())
    }

    /// Every step of a sandbox, in order.
    pub fn steps(&self, sandbox: &str) -> Result<Vec<StepRow>, JournalError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!("SELECT {COLUMNS} FROM steps WHERE sandbox = ?1 ORDER BY seq"))?;
        let rows = stmt.query_map(params![sandbox], row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Stores bytes once by content for `sandbox`; returns their digest.
    pub fn put_blob(&self, sandbox: &str, data: &[u8]) -> Result<String, JournalError> {
        let digest = sha256_hex(data);
        put_blob(&self.conn(), sandbox, &digest, data)?;
        Ok(digest)
    }

    pub fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>, JournalError> {
        Ok(self.conn().prepare_cached("SELECT data FROM blobs WHERE digest = ?1")?.query_row(params![digest], |r| r.get(0)).optional()?)
    }

    /// Drops a sandbox's log (when its record is forgotten) and any blob no
    /// other step refers to.
    pub fn forget(&self, sandbox: &str) -> Result<(), JournalError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute("DELETE FROM steps WHERE sandbox = ?1", params![sandbox])?;
        tx.execute("DELETE FROM sandboxes WHERE id = ?1", params![sandbox])?;
        tx.execute("DELETE FROM blob_refs WHERE sandbox = ?1", params![sandbox])?;
        tx.execute("DELETE FROM blobs WHERE digest NOT IN (SELECT digest FROM blob_refs)", [])?;
        // Targets are a sandbox id, or `id\n...` for a result kept to
        // replay (a pack's).
        tx.execute("DELETE FROM idempotency WHERE target = ?1 OR substr(target, 1, length(?1) + 1) = ?1 || char(10)", params![sandbox])?;
        tx.commit()?;
        Ok(())
    }

    /// Claims an idempotency key of `tenant` in `scope` (`create`,
    /// `snapshot`, `pack`) for a request with this fingerprint.
    pub fn claim(&self, tenant: &str, scope: &str, key: &str, fingerprint: &str) -> Result<Claim, JournalError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let found: Option<(String, Option<String>)> = tx
            .query_row(
                "SELECT fingerprint, target FROM idempotency WHERE tenant = ?1 AND scope = ?2 AND key = ?3",
                params![tenant, scope, key],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        if let Some((fingerprint, target)) = found {
            return Ok(Claim::Existing { fingerprint, target });
        }
        tx.execute(
            "INSERT INTO idempotency (tenant, scope, key, fingerprint, target, created_ms) VALUES (?1, ?2, ?3, ?4, NULL, ?5)",
            params![tenant, scope, key, fingerprint, now_ms() as i64],
        )?;
        tx.commit()?;
        Ok(Claim::New)
    }

    /// Binds a claimed key to what its request produced.
    pub fn settle(&self, tenant: &str, scope: &str, key: &str, target: &str) -> Result<(), JournalError> {
        self.conn().execute(
            "UPDATE idempotency SET target = ?4 WHERE tenant = ?1 AND scope = ?2 AND key = ?3",
            params![tenant, scope, key, target],
        )?;
        Ok(())
    }

    /// Drops the keys of `scope` that name `target` (a deleted snapshot),
    /// so a retry makes it anew instead of finding nothing.
    pub fn forget_target(&self, scope: &str, target: &str) -> Result<(), JournalError> {
        self.conn().execute("DELETE FROM idempotency WHERE scope = ?1 AND target = ?2", params![scope, target])?;
        Ok(())
    }

    /// Gives a key back after its request failed, so a retry may try again.
    pub fn release(&self, tenant: &str, scope: &str, key: &str) -> Result<(), JournalError> {
        self.conn().execute("DELETE FROM idempotency WHERE tenant = ?1 AND scope = ?2 AND key = ?3", params![tenant, scope, key])?;
        Ok(())
    }
}

/// Stores a blob and notes that `sandbox` refers to it (so `forget` knows
/// which blobs are still used).
fn put_blob(conn: &Connection, sandbox: &str, digest: &str, data: &[u8]) -> Result<(), JournalError> {
    conn.prepare_cached("INSERT OR IGNORE INTO blobs (digest, data) VALUES (?1, ?2)")?.execute(params![digest, data])?;
    conn.prepare_cached("INSERT OR IGNORE INTO blob_refs (sandbox, digest) VALUES (?1, ?2)")?.execute(params![sandbox, digest])?;
    Ok(())
}

const COLUMNS: &str = "seq, step_id, kind, fingerprint, op, status, outcome, changed, started_ms, finished_ms";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StepRow> {
    Ok(StepRow {
        seq: r.get::<_, i64>(0)? as u64,
        step_id: r.get(1)?,
        kind: r.get(2)?,
        fingerprint: r.get(3)?,
        op: r.get(4)?,
        status: StepStatus::parse(&r.get::<_, String>(5)?),
        outcome: r.get(6)?,
        changed: r.get(7)?,
        started_ms: r.get::<_, i64>(8)? as u64,
        finished_ms: r.get::<_, Option<i64>>(9)?.map(|v| v as u64),
    })
}

fn lookup(conn: &Connection, sandbox: &str, step_id: &str) -> Result<Option<StepRow>, JournalError> {
    let mut stmt = conn.prepare_cached(&format!("SELECT {COLUMNS} FROM steps WHERE sandbox = ?1 AND step_id = ?2"))?;
    Ok(stmt.query_row(params![sandbox, step_id], row).optional()?)
}

fn migrate(conn: &Connection) -> Result<(), JournalError> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(JournalError::TooNew(version));
    }
    if version < 1 {
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS sandboxes (
                 id TEXT PRIMARY KEY,
                 tenant TEXT NOT NULL,
                 spec TEXT NOT NULL
             );
             CREATE TABLE IF NOT EXISTS steps (
                 sandbox TEXT NOT NULL,
                 seq INTEGER NOT NULL,
                 step_id TEXT,
                 kind TEXT NOT NULL,
                 fingerprint TEXT NOT NULL,
                 op TEXT NOT NULL,
                 status TEXT NOT NULL,
                 outcome TEXT,
                 changed TEXT,
                 started_ms INTEGER NOT NULL,
                 finished_ms INTEGER,
                 PRIMARY KEY (sandbox, seq)
             );
             CREATE UNIQUE INDEX IF NOT EXISTS steps_by_id ON steps (sandbox, step_id) WHERE step_id IS NOT NULL;
             CREATE TABLE IF NOT EXISTS blobs (
                 digest TEXT PRIMARY KEY,
                 data BLOB NOT NULL
             );
             CREATE TABLE IF NOT EXISTS blob_refs (
                 sandbox TEXT NOT NULL,
                 digest TEXT NOT NULL,
                 PRIMARY KEY (sandbox, digest)
             );
             CREATE TABLE IF NOT EXISTS idempotency (
                 tenant TEXT NOT NULL,
                 scope TEXT NOT NULL,
                 key TEXT NOT NULL,
                 fingerprint TEXT NOT NULL,
                 target TEXT,
                 created_ms INTEGER NOT NULL,
                 PRIMARY KEY (tenant, scope, key)
             );
             PRAGMA user_version = 1;",
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, Journal) {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("journal.db")).unwrap();
        (dir, j)
    }

    #[test]
    fn steps_append_in_order_and_step_ids_are_unique_per_sandbox() {
        let (_d, j) = open();
        assert!(matches!(j.begin("n.a", Some("s1"), "exec", "f1", "{}").unwrap(), Begin::New(1)));
        assert!(matches!(j.begin("n.a", None, "exec", "f2", "{}").unwrap(), Begin::New(2)));
        assert!(matches!(j.begin("n.b", Some("s1"), "exec", "f1", "{}").unwrap(), Begin::New(1)));
        match j.begin("n.a", Some("s1"), "exec", "other", "{}").unwrap() {
            Begin::Existing(r) => {
                assert_eq!((r.seq, r.fingerprint.as_str(), r.status), (1, "f1", StepStatus::Running));
            }
            other => panic!("expected the recorded step, got {other:?}"),
        }
        j.finish("n.a", 1, StepStatus::Done, Some("{\"x\":1}"), Some("[]"), None, &[]).unwrap();
        let steps = j.steps("n.a").unwrap();
        assert_eq!(steps.iter().map(|s| s.seq).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(steps[0].status, StepStatus::Done);
        assert_eq!(steps[0].outcome.as_deref(), Some("{\"x\":1}"));
        assert!(steps[0].finished_ms.is_some());
    }

    #[test]
    fn running_steps_become_interrupted_on_reopen_and_the_log_survives() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("journal.db");
        {
            let j = Journal::open(&db).unwrap();
            j.remember_sandbox("n.a", "t", "{\"image\":\"x\"}").unwrap();
            j.begin("n.a", Some("done"), "exec", "f", "{}").unwrap();
            j.finish("n.a", 1, StepStatus::Done, Some("{}"), None, None, &[]).unwrap();
            j.begin("n.a", Some("cut"), "exec", "f", "{}").unwrap();
        }
        let j = Journal::open(&db).unwrap();
        assert_eq!(j.sandbox("n.a").unwrap(), Some(("t".into(), "{\"image\":\"x\"}".into())));
        assert_eq!(j.lookup("n.a", "done").unwrap().unwrap().status, StepStatus::Done);
        assert_eq!(j.lookup("n.a", "cut").unwrap().unwrap().status, StepStatus::Interrupted);
    }

    #[test]
    fn finish_can_replace_the_provisional_operation() {
        let (_d, j) = open();
        j.begin("n.a", Some("w"), "write_file", "pending", "{}").unwrap();
        let out = b"output";
        let digest = sha256_hex(out);
        j.finish("n.a", 1, StepStatus::Done, Some("{}"), None, Some(("final", "{\"path\":\"/x\"}")), &[(&digest, out)]).unwrap();
        assert_eq!(j.blob(&digest).unwrap().as_deref(), Some(&out[..]));
        let r = j.step("n.a", 1).unwrap().unwrap();
        assert_eq!((r.fingerprint.as_str(), r.op.as_str()), ("final", "{\"path\":\"/x\"}"));
    }

    #[test]
    fn blobs_are_shared_by_content_and_dropped_with_their_last_sandbox() {
        let (_d, j) = open();
        let a = j.put_blob("n.a", b"same output").unwrap();
        let b = j.put_blob("n.b", b"same output").unwrap();
        assert_eq!(a, b);
        j.forget("n.a").unwrap();
        assert_eq!(j.blob(&a).unwrap().as_deref(), Some(&b"same output"[..]));
        j.forget("n.b").unwrap();
        assert_eq!(j.blob(&a).unwrap(), None);
    }

    #[test]
    fn idempotency_keys_are_claimed_once_per_tenant_and_scope() {
        let (_d, j) = open();
        assert_eq!(j.claim("t", "create", "k", "f1").unwrap(), Claim::New);
        assert_eq!(j.claim("t", "create", "k", "f2").unwrap(), Claim::Existing { fingerprint: "f1".into(), target: None });
        j.settle("t", "create", "k", "n.a").unwrap();
        assert_eq!(j.claim("t", "create", "k", "f1").unwrap(), Claim::Existing { fingerprint: "f1".into(), target: Some("n.a".into()) });
        // Another tenant, or another scope, has keys of its own.
        assert_eq!(j.claim("u", "create", "k", "f1").unwrap(), Claim::New);
        assert_eq!(j.claim("t", "snapshot", "k", "f1").unwrap(), Claim::New);
        j.release("u", "create", "k").unwrap();
        assert_eq!(j.claim("u", "create", "k", "f9").unwrap(), Claim::New);
        // Forgetting the sandbox frees its key.
        j.forget("n.a").unwrap();
        assert_eq!(j.claim("t", "create", "k", "f3").unwrap(), Claim::New);
    }
}
