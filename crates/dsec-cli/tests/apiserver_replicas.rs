//! `dsec apiserver --database postgres://...` as it is run: two processes
//! on one PostgreSQL database, a tenant created through one used through
//! the other, and a second apiserver on one SQLite file refused.
//! Needs `DSEC_TEST_POSTGRES` (see `dsec_store::testing`).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::DSEC;
use dsec_client::{Client, ClientError};
use http::Method;

/// One `dsec apiserver` process, killed (by PID) when dropped.
struct Apiserver {
    child: Child,
    addr: String,
}

impl Drop for Apiserver {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

fn command(data_dir: &Path, database: Option<&str>) -> Command {
    let mut cmd = Command::new(DSEC);
    cmd.arg("apiserver").arg("--data-dir").arg(data_dir).args(["--listen", "127.0.0.1:0"]);
    // An edge nobody serves: these tests touch tenants and tokens only.
    cmd.args(["--edge", "n1=http://127.0.0.1:9"]).arg("--cluster-secret-file").arg(data_dir.join("cluster-secret"));
    if let Some(db) = database {
        cmd.args(["--database", db]);
    }
    for v in ["DSEC_DATA_DIR", "DSEC_DATABASE", "DSEC_ENDPOINT", "DSEC_TOKEN", "DSEC_TOKEN_FILE"] {
        cmd.env_remove(v);
    }
    cmd.env("NO_COLOR", "1");
    cmd
}

/// Starts an apiserver and waits for the address it prints.
fn start(data_dir: &Path, database: Option<&str>) -> Apiserver {
    let mut child =
        command(data_dir, database).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawning dsec");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[dsec apiserver] {line}");
            if let Some(rest) = line.split("dsec is up at http://").nth(1) {
                let _ = tx.send(rest.chars().take_while(|c| c.is_ascii_digit() || matches!(c, '.' | ':')).collect::<String>());
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(addr) = rx.recv_timeout(Duration::from_millis(50)) {
            return Apiserver { child, addr };
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("dsec apiserver exited ({status}) before it was up");
        }
        assert!(Instant::now() < deadline, "dsec apiserver did not come up within 30 s");
    }
}

fn client(api: &Apiserver, token: &str) -> Client {
    Client::new(&format!("http://{}", api.addr), Some(token)).unwrap()
}

#[tokio::test]
async fn two_apiserver_processes_share_tenants_through_postgres() {
    let Some(url) = dsec_store::testing::fresh_schema("apiserver processes").await else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster-secret"), "s3cret").unwrap();
    // Both replicas read one admin token file (the first one writes it).
    let a = start(dir.path(), Some(&url));
    let b = start(dir.path(), Some(&url));
    let admin = std::fs::read_to_string(dir.path().join("admin-token")).unwrap().trim().to_string();

    let body = serde_json::to_vec(&serde_json::json!({"name": "team-a"})).unwrap();
    let (_, made) = client(&a, &admin).raw(Method::POST, "/v1/tenants", Some(body), "application/json").await.unwrap();
    let made: dsec_api::TenantInfo = serde_json::from_slice(&made).unwrap();
    let token = made.token.expect("the new tenant's token");
    let listed = client(&b, &token).raw(Method::GET, "/v1/sandboxes", None, "application/json").await;
    assert!(listed.is_ok(), "the tenant made on a is accepted by b: {listed:?}");
    let tenants = client(&b, &admin).raw(Method::GET, "/v1/tenants", None, "application/json").await.unwrap().1;
    let tenants: dsec_api::TenantList = serde_json::from_slice(&tenants).unwrap();
    assert_eq!(tenants.tenants.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["admin", "team-a"]);
    let wrong = client(&b, "dsec_wrong").raw(Method::GET, "/v1/sandboxes", None, "application/json").await;
    assert!(matches!(wrong, Err(ClientError::Api { status: 401, .. })), "{wrong:?}");
}

#[test]
fn a_second_apiserver_on_one_sqlite_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster-secret"), "s3cret").unwrap();
    let _first = start(dir.path(), None);
    let out = common::run_bounded(command(dir.path(), None), Duration::from_secs(30));
    out.fails_with("in use by another process");
}
