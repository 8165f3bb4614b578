//! Apiserver replicas on one PostgreSQL database: what one does with
//! tenants and tokens holds on the others at once, and a database outage
//! is a clear 503 with Retry-After, healed when the database is back.
//! Needs `DSEC_TEST_POSTGRES` (see `dsec_store::testing`).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use dsec_apiserver::auth::{Authenticator, TokenStore};
use dsec_apiserver::nodes::Nodes;
use dsec_apiserver::{router, ApiLimits, AppState};
use dsec_store::{testing, Database, NewToken, Store};
use http_body_util::BodyExt;
use serde_json::json;
use sha2::{Digest, Sha256};
use tower::ServiceExt;

async fn replica(db: &Database, admin_token_file: &Path) -> AppState {
    let tokens = TokenStore::open(db, admin_token_file).await.expect("replica starts");
    AppState {
        auth: Arc::new(Authenticator::Tokens(tokens)),
        nodes: Arc::new(Nodes::new(vec![])),
        images: None,
        limits: Arc::new(ApiLimits::default()),
        fncall: None,
        sandboxfusion_open: false,
        sandbox_domain: None,
    }
}

struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    body: serde_json::Value,
}

impl Answer {
    fn code(&self) -> Option<&str> {
        self.body["error"]["code"].as_str()
    }
}

async fn call(st: &AppState, method: &str, path: &str, token: &str, body: Option<serde_json::Value>) -> Answer {
    let mut req = Request::builder().method(method).uri(path).header("authorization", format!("Bearer {token}"));
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req.body(body.map_or_else(Body::empty, |b| Body::from(b.to_string()))).unwrap();
    let resp = router(st.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let retry_after = resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Answer { status, retry_after, body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null) }
}

async fn create_tenant(st: &AppState, admin: &str, name: &str) -> Answer {
    call(st, "POST", "/v1/tenants", admin, Some(json!({ "name": name }))).await
}

fn read_token(file: &Path) -> String {
    std::fs::read_to_string(file).unwrap().trim().to_string()
}

fn tokens(st: &AppState) -> &TokenStore {
    st.auth.tokens().expect("a token authenticator")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

#[tokio::test]
async fn a_tenant_made_on_one_replica_works_on_another_and_revocation_holds_everywhere_at_once() {
    let Some(url) = testing::fresh_schema("replicas").await else { return };
    let db = Database::Postgres(url);
    let dir = tempfile::tempdir().unwrap();
    // Two replicas given the same admin token file, a third with its own.
    let shared_admin = dir.path().join("admin-token");
    let a = replica(&db, &shared_admin).await;
    let b = replica(&db, &shared_admin).await;
    let own_admin = dir.path().join("admin-token-c");
    let c = replica(&db, &own_admin).await;
    let admin = read_token(&shared_admin);
    assert_eq!(call(&c, "GET", "/v1/tenants", &admin, None).await.status, StatusCode::OK, "the shared admin token works on c");
    assert_eq!(call(&a, "GET", "/v1/tenants", &read_token(&own_admin), None).await.status, StatusCode::OK, "c's works on a");

    let made = create_tenant(&a, &admin, "team-a").await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let token = made.body["token"].as_str().unwrap().to_string();
    assert_eq!(call(&b, "GET", "/v1/sandboxes", &token, None).await.status, StatusCode::OK, "accepted by the other replica at once");
    let again = create_tenant(&b, &admin, "team-a").await;
    assert_eq!((again.status, again.code()), (StatusCode::CONFLICT, Some("already_exists")));
    let list = call(&c, "GET", "/v1/tenants", &admin, None).await;
    let names: Vec<&str> = list.body["tenants"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["admin", "team-a"]);

    assert!(tokens(&a).revoke(&token).await.unwrap());
    for replica in [&a, &b, &c] {
        let refused = call(replica, "GET", "/v1/sandboxes", &token, None).await;
        assert_eq!((refused.status, refused.code()), (StatusCode::UNAUTHORIZED, Some("unauthorized")));
    }

    // A token with an expiry holds until then, on every replica.
    let expiring = "dsec_expiring";
    let grant = NewToken { hash: Sha256::digest(expiring).into(), created_at_ms: now_ms(), expires_at_ms: Some(now_ms() + 1500) };
    tokens(&a).store().add_token("team-a", grant).await.unwrap();
    assert_eq!(call(&b, "GET", "/v1/sandboxes", expiring, None).await.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(call(&b, "GET", "/v1/sandboxes", expiring, None).await.status, StatusCode::UNAUTHORIZED);
}

/// Requests on `st` until `stop`: each answer must be a success or a clear
/// 503, within the store's connect timeout. Returns (ok, unavailable).
async fn steady_load(st: AppState, token: String, stop: Arc<AtomicBool>) -> (u32, u32) {
    let (mut ok, mut unavailable) = (0, 0);
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let r = call(&st, "GET", "/v1/sandboxes", &token, None).await;
        assert!(started.elapsed() < Duration::from_secs(5), "an answer within the connect timeout");
        match r.status {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!((r.code(), r.retry_after.as_deref()), (Some("store_unavailable"), Some("1")), "{}", r.body);
                unavailable += 1;
            }
            other => panic!("unexpected {other}: {}", r.body),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (ok, unavailable)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_is_a_503_with_retry_after_and_nothing_is_lost() {
    if !testing::postgres_required() {
        eprintln!("database restart: not run: {} is unset", testing::ENV);
        return;
    }
    let pg = testing::TempPostgres::start().expect("a private PostgreSQL server");
    let db = Database::Postgres(pg.url().to_string());
    let dir = tempfile::tempdir().unwrap();
    let admin_file = dir.path().join("admin-token");
    let a = replica(&db, &admin_file).await;
    let b = replica(&db, &admin_file).await;
    let admin = read_token(&admin_file);
    let token = create_tenant(&a, &admin, "team-a").await.body["token"].as_str().unwrap().to_string();

    // Requests keep coming on both replicas while the database goes away
    // and comes back.
    let stop = Arc::new(AtomicBool::new(false));
    let load = [a.clone(), b.clone()].map(|st| tokio::spawn(steady_load(st, token.clone(), stop.clone())));
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| pg.stop()).unwrap();
    let down = call(&b, "GET", "/v1/sandboxes", &token, None).await;
    assert_eq!(
        (down.status, down.code(), down.retry_after.as_deref()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("store_unavailable"), Some("1"))
    );
    let write = create_tenant(&a, &admin, "team-b").await;
    assert_eq!((write.status, write.code()), (StatusCode::SERVICE_UNAVAILABLE, Some("store_unavailable")), "{}", write.body);
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| pg.restart()).unwrap();

    // Back: both replicas answer again without a restart of their own, and
    // what was written before is there.
    for st in [&a, &b] {
        assert_eq!(call(st, "GET", "/v1/sandboxes", &token, None).await.status, StatusCode::OK);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for handle in load {
        let (ok, unavailable) = handle.await.unwrap();
        assert!(ok > 0 && unavailable > 0, "the load saw both sides of the outage ({ok} ok, {unavailable} unavailable)");
    }
    assert_eq!(create_tenant(&b, &admin, "team-b").await.status, StatusCode::CREATED);
}
