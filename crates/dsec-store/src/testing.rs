//! Test support: PostgreSQL for the tests of this crate and the ones above.
//!
//! `DSEC_TEST_POSTGRES` names a server the tests may use (scripts/test.sh
//! starts one with scripts/postgres-test.sh); each test gets a schema of
//! its own on it. Unset, the PostgreSQL variants of the tests say so and
//! pass without running; set, a server that cannot be reached fails them.
//! `TempPostgres` is a private server a test may stop and start.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// The variable that names the tests' PostgreSQL server.
pub const ENV: &str = "DSEC_TEST_POSTGRES";

/// Whether the PostgreSQL tests must run.
pub fn postgres_required() -> bool {
    std::env::var(ENV).is_ok_and(|v| !v.is_empty())
}

/// A URL to a fresh, empty schema on the tests' server; `None` (with a
/// note on stderr) when `DSEC_TEST_POSTGRES` is unset. Panics if it is set
/// and the server cannot be used: the suite never skips silently.
pub async fn fresh_schema(test: &str) -> Option<String> {
    if !postgres_required() {
        eprintln!("{test}: PostgreSQL variant not run: {ENV} is unset (scripts/test.sh sets it)");
        return None;
    }
    let base = std::env::var(ENV).unwrap_or_default();
    Some(create_schema(&base).await.unwrap_or_else(|e| panic!("{ENV}={base}: {e}")))
}

/// Makes a new schema on the server at `base` and returns a URL whose
/// connections use it.
pub async fn create_schema(base: &str) -> Result<String, String> {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let schema = format!("t{}_{}_{nanos}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
    let (client, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls).await.map_err(|e| format!("cannot connect: {e}"))?;
    let conn = tokio::spawn(conn);
    client.batch_execute(&format!("CREATE SCHEMA {schema}")).await.map_err(|e| format!("CREATE SCHEMA: {e}"))?;
    drop(client);
    conn.await.ok();
    let sep = if base.contains('?') { '&' } else { '?' };
    Ok(format!("{base}{sep}options=-csearch_path%3D{schema}"))
}

/// A PostgreSQL server of one test's own, in a temporary directory; gone
/// when dropped.
pub struct TempPostgres {
    dir: tempfile::TempDir,
    url: String,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/postgres-test.sh")
}

fn run_script(action: &str, dir: &std::path::Path) -> Result<String, String> {
    let out = Command::new(script()).arg(action).arg(dir).output().map_err(|e| format!("{}: {e}", script().display()))?;
    if !out.status.success() {
        return Err(format!("postgres-test.sh {action}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl TempPostgres {
    /// Starts a new server (a few seconds: initdb).
    pub fn start() -> Result<TempPostgres, String> {
        let dir = tempfile::Builder::new().prefix("dsec-pg-").tempdir().map_err(|e| e.to_string())?;
        let url = run_script("start", dir.path())?;
        Ok(TempPostgres { dir, url })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops the server (fast shutdown: sessions are cut); its data stays.
    pub fn stop(&self) -> Result<(), String> {
        run_script("stop", self.dir.path()).map(drop)
    }

    /// Starts it again on the same port.
    pub fn restart(&self) -> Result<(), String> {
        run_script("start", self.dir.path()).map(drop)
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        if let Err(e) = run_script("destroy", self.dir.path()) {
            eprintln!("{e}");
        }
    }
}
