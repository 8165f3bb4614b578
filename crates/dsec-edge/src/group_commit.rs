//! Group commit for an SQLite connection: writes that arrive while another
//! is committing are run together in one transaction (each in a savepoint
//! of its own, so one failing write does not undo the others), and every
//! caller returns only once its write is committed.
//!
//! Why: a commit in WAL mode costs a lock round trip and a `pwrite` of each
//! page it touched, whatever it contains. The trajectory log commits two or
//! three times per exec; under load most of that cost is the commits
//! themselves, and writes that share a commit share its pages too.
//!
//! How: leader/follower, with no thread of its own. A caller queues its
//! write, then tries to take the connection. Whoever holds it (the leader)
//! drains the queue into one transaction, commits, hands each caller its
//! result, and drains again until the queue is empty. A caller that finds
//! the connection taken just waits for its result: the holder re-checks the
//! queue after letting go of the connection, so a write queued while it
//! held the connection is never left behind. With no contention this is
//! one transaction per write on the caller's own thread, as before.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};

use rusqlite::Connection;

/// A queued write: runs on the leader's thread inside the batch's
/// transaction and says whether it succeeded; `deliver` is called after
/// the commit with the commit's error, if any.
struct Job {
    run: Box<dyn FnOnce(&Connection) -> Delivery + Send>,
}

struct Delivery {
    ok: bool,
    deliver: Box<dyn FnOnce(Option<&rusqlite::Error>) + Send>,
}

/// Where a caller waits for its own result.
struct Slot<R> {
    value: Mutex<Option<R>>,
    ready: Condvar,
}

/// Fills a caller's slot exactly once: with its result, or, if the job is
/// dropped undelivered (a panic in the leader's batch), with an error, so
/// no caller waits forever.
struct Notify<R, E: From<rusqlite::Error>> {
    slot: Arc<Slot<Result<R, E>>>,
    delivered: bool,
}

impl<R, E: From<rusqlite::Error>> Notify<R, E> {
    fn deliver(mut self, result: Result<R, E>) {
        self.fill(result);
    }

    fn fill(&mut self, result: Result<R, E>) {
        self.delivered = true;
        *lock(&self.slot.value) = Some(result);
        self.slot.ready.notify_one();
    }
}

impl<R, E: From<rusqlite::Error>> Drop for Notify<R, E> {
    fn drop(&mut self) {
        if !self.delivered {
            let abandoned = rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                Some("the write was abandoned by a failed batch".into()),
            );
            self.fill(Err(E::from(abandoned)));
        }
    }
}

pub struct GroupCommit {
    queue: Mutex<Vec<Job>>,
    conn: Mutex<Connection>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl GroupCommit {
    pub fn new(conn: Connection) -> GroupCommit {
        GroupCommit { queue: Mutex::new(Vec::new()), conn: Mutex::new(conn) }
    }

    /// Runs `write` in a transaction shared with whatever other writes are
    /// waiting, and returns its result once that transaction is committed.
    /// A commit that fails turns every write of the batch into `E::from`
    /// that error.
    pub fn write<R, E, F>(&self, write: F) -> Result<R, E>
    where
        F: FnOnce(&Connection) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<rusqlite::Error> + Send + 'static,
    {
        let slot: Arc<Slot<Result<R, E>>> = Arc::new(Slot { value: Mutex::new(None), ready: Condvar::new() });
        let notify = Notify { slot: slot.clone(), delivered: false };
        let run = Box::new(move |conn: &Connection| {
            let result = write(conn);
            let ok = result.is_ok();
            let deliver = Box::new(move |commit_err: Option<&rusqlite::Error>| {
                let result = match commit_err {
                    Some(e) if ok => Err(E::from(clone_error(e))),
                    _ => result,
                };
                notify.deliver(result);
            });
            Delivery { ok, deliver }
        });
        lock(&self.queue).push(Job { run });
        self.drive();
        let mut value = lock(&slot.value);
        loop {
            if let Some(result) = value.take() {
                return result;
            }
            value = slot.ready.wait(value).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Commits queued writes until the queue is empty or another thread
    /// holds the connection (that thread then sees what is queued: it
    /// re-checks after letting go).
    fn drive(&self) {
        loop {
            let mut conn = match self.conn.try_lock() {
                Ok(c) => c,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            loop {
                let jobs = std::mem::take(&mut *lock(&self.queue));
                if jobs.is_empty() {
                    break;
                }
                run_batch(&mut conn, jobs);
            }
            drop(conn);
            // A write queued between the last drain and the unlock found
            // the connection taken: it is ours to commit.
            if lock(&self.queue).is_empty() {
                return;
            }
        }
    }
}

fn run_batch(conn: &mut Connection, jobs: Vec<Job>) {
    let mut deliveries = Vec::with_capacity(jobs.len());
    if !conn.is_autocommit() {
        // A batch that panicked left its transaction open.
        let _ = conn.execute_batch("ROLLBACK");
    }
    let begun = conn.prepare_cached("BEGIN IMMEDIATE").and_then(|mut s| s.execute([]));
    if let Err(e) = begun {
        // Nothing ran: every write gets the error.
        for job in jobs {
            deliveries.push((job.run)(conn));
        }
        for d in deliveries {
            (d.deliver)(Some(&e));
        }
        return;
    }
    for job in jobs {
        let savepoint = conn.prepare_cached("SAVEPOINT w").and_then(|mut s| s.execute([]));
        let d = (job.run)(conn);
        if savepoint.is_ok() {
            let end = if d.ok { "RELEASE w" } else { "ROLLBACK TO w" };
            let _ = conn.prepare_cached(end).and_then(|mut s| s.execute([]));
            if !d.ok {
                let _ = conn.prepare_cached("RELEASE w").and_then(|mut s| s.execute([]));
            }
        }
        deliveries.push(d);
    }
    let committed = conn.prepare_cached("COMMIT").and_then(|mut s| s.execute([]));
    if committed.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    let err = committed.err();
    for d in deliveries {
        (d.deliver)(err.as_ref());
    }
}

/// rusqlite errors are not `Clone`; a failed commit is reported to every
/// write of its batch, keeping the SQLite code where there is one.
fn clone_error(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(code, msg) => rusqlite::Error::SqliteFailure(*code, msg.clone()),
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(format!("commit failed: {other}")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, Arc<GroupCommit>) {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("t.db")).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)").unwrap();
        (dir, Arc::new(GroupCommit::new(conn)))
    }

    fn count(dir: &tempfile::TempDir) -> i64 {
        let c = Connection::open(dir.path().join("t.db")).unwrap();
        c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn every_write_from_many_threads_is_committed_once() {
        let (dir, gc) = open();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let gc = gc.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let k = t * 1000 + i;
                        let got: Result<i64, rusqlite::Error> = gc.write(move |c| {
                            c.execute("INSERT INTO t (k, v) VALUES (?1, 'x')", [k])?;
                            Ok(k)
                        });
                        assert_eq!(got.unwrap(), k);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Committed, as another connection sees it.
        assert_eq!(count(&dir), 1600);
    }

    #[test]
    fn a_panicking_write_fails_its_batch_without_hanging_anyone() {
        let (dir, gc) = open();
        let gc2 = gc.clone();
        let t = std::thread::spawn(move || {
            let _: Result<(), rusqlite::Error> = gc2.write(|_| panic!("boom"));
        });
        assert!(t.join().is_err(), "the panic reaches the writer that caused it");
        // The connection is usable again, and nothing half-done was kept.
        gc.write(|c| c.execute("INSERT INTO t (k, v) VALUES (1, 'a')", []).map(|_| ())).unwrap();
        assert_eq!(count(&dir), 1);
    }

    #[test]
    fn a_failing_write_does_not_undo_the_others() {
        let (dir, gc) = open();
        gc.write(|c| c.execute("INSERT INTO t (k, v) VALUES (1, 'a')", []).map(|_| ())).unwrap();
        // Breaks the primary key halfway: its first insert is undone too.
        let bad: Result<(), rusqlite::Error> = gc.write(|c| {
            c.execute("INSERT INTO t (k, v) VALUES (2, 'b')", [])?;
            c.execute("INSERT INTO t (k, v) VALUES (1, 'dup')", [])?;
            Ok(())
        });
        assert!(bad.is_err());
        gc.write(|c| c.execute("INSERT INTO t (k, v) VALUES (3, 'c')", []).map(|_| ())).unwrap();
        assert_eq!(count(&dir), 2);
        let c = Connection::open(dir.path().join("t.db")).unwrap();
        let v: String = c.query_row("SELECT v FROM t WHERE k = 1", [], |r| r.get(0)).unwrap();
        assert_eq!(v, "a");
    }
}
