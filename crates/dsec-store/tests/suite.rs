//! One suite, both engines: every test function below runs on SQLite and
//! on PostgreSQL (`DSEC_TEST_POSTGRES`, see `dsec_store::testing`).

use std::collections::BTreeMap;

use dsec_store::{
    migrations, AnyStore, ClusterStore, CreationKeys, Database, Member, Membership, NewToken, NodeRecord, NodeState, Principal, Quota,
    QuotaError, Role, Store, StoreError, TokenHash,
};

const NOW: u64 = 1_700_000_000_000;

fn token(n: u8) -> NewToken {
    NewToken { hash: [n; 32], created_at_ms: NOW, expires_at_ms: None }
}

fn hash(n: u8) -> TokenHash {
    [n; 32]
}

async fn principals_and_tokens(s: &AnyStore) {
    s.create_principal(&Principal::tenant("team-b", false, NOW), Some(token(2))).await.unwrap();
    s.create_principal(&Principal::tenant("team-a", false, NOW + 1), Some(token(1))).await.unwrap();
    let g = s.grant(&hash(1), NOW).await.unwrap().expect("a fresh token is live");
    assert_eq!(g.principal, Principal::tenant("team-a", false, NOW + 1));
    assert_eq!(g.expires_at_ms, None);
    assert!(s.grant(&hash(9), NOW).await.unwrap().is_none(), "an unknown token grants nothing");

    assert!(matches!(s.create_principal(&Principal::tenant("team-a", false, NOW), None).await, Err(StoreError::Exists(_))));
    // A token already held: nothing of the call stays (one transaction).
    assert!(matches!(s.create_principal(&Principal::tenant("team-c", false, NOW), Some(token(1))).await, Err(StoreError::Exists(_))));
    assert!(s.principal("team-c").await.unwrap().is_none());

    let names: Vec<String> = s.principals().await.unwrap().into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["team-a", "team-b"]);
    assert_eq!(s.principal("team-b").await.unwrap().unwrap().created_at_ms, NOW);

    let mut child = Principal::tenant("child", false, NOW);
    child.parent = Some("nobody".into());
    assert!(matches!(s.create_principal(&child, None).await, Err(StoreError::NoSuchPrincipal(p)) if p == "nobody"));
    child.parent = Some("team-a".into());
    s.create_principal(&child, None).await.unwrap();
    assert_eq!(s.principal("child").await.unwrap().unwrap().parent.as_deref(), Some("team-a"));
}

async fn tokens_expire_and_are_revoked(s: &AnyStore) {
    s.create_principal(&Principal::tenant("team-a", false, NOW), Some(token(1))).await.unwrap();
    s.add_token("team-a", NewToken { hash: hash(2), created_at_ms: NOW, expires_at_ms: Some(NOW + 1000) }).await.unwrap();
    assert_eq!(s.grant(&hash(2), NOW + 999).await.unwrap().unwrap().expires_at_ms, Some(NOW + 1000));
    assert!(s.grant(&hash(2), NOW + 1000).await.unwrap().is_none(), "expired at its expiry instant");

    assert!(s.revoke_token(&hash(1), NOW).await.unwrap());
    assert!(s.grant(&hash(1), NOW).await.unwrap().is_none(), "revoked at once");
    assert!(!s.revoke_token(&hash(1), NOW).await.unwrap(), "revoking twice changes nothing");
    assert!(!s.revoke_token(&hash(7), NOW).await.unwrap(), "an unknown token");
    assert!(s.grant(&hash(2), NOW).await.unwrap().is_some(), "the principal's other token still holds");

    assert!(matches!(s.add_token("nobody", token(3)).await, Err(StoreError::NoSuchPrincipal(_))));
    assert!(matches!(s.add_token("team-a", token(2)).await, Err(StoreError::Exists(_))));
}

async fn admin_tokens(s: &AnyStore) {
    s.set_admin_token("admin", token(1), true).await.unwrap();
    assert!(s.grant(&hash(1), NOW).await.unwrap().unwrap().principal.admin);
    // One apiserver, a new token file: the old token stops working.
    s.set_admin_token("admin", token(2), true).await.unwrap();
    assert!(s.grant(&hash(1), NOW).await.unwrap().is_none());
    assert!(s.grant(&hash(2), NOW).await.unwrap().is_some());
    // Replicas each bring theirs: both hold.
    s.set_admin_token("admin", token(3), false).await.unwrap();
    assert!(s.grant(&hash(2), NOW).await.unwrap().is_some());
    assert!(s.grant(&hash(3), NOW).await.unwrap().is_some());
    // The token file is the authority: a revoked token put back is live.
    s.revoke_token(&hash(3), NOW).await.unwrap();
    s.set_admin_token("admin", token(3), false).await.unwrap();
    assert!(s.grant(&hash(3), NOW).await.unwrap().is_some());
    assert_eq!(s.principals().await.unwrap().len(), 1);
}

fn node(name: &str) -> NodeRecord {
    NodeRecord {
        name: name.into(),
        url: format!("http://{name}:8081"),
        labels: BTreeMap::from([("kvm".to_string(), "true".to_string()), ("gpu".to_string(), "h800".to_string())]),
        backends: vec!["container".into(), "microvm".into()],
        pool: "primary".into(),
        state: NodeState::Active,
        last_seen_ms: None,
        registered_at_ms: NOW,
    }
}

async fn node_registry(s: &AnyStore) {
    s.put_node(&node("n2")).await.unwrap();
    s.put_node(&node("n1")).await.unwrap();
    assert_eq!(s.node("n1").await.unwrap(), Some(node("n1")));
    assert_eq!(s.nodes().await.unwrap(), vec![node("n1"), node("n2")]);

    let mut moved = node("n1");
    moved.url = "http://elsewhere:8081".into();
    moved.pool = "burst".into();
    moved.labels.clear();
    s.put_node(&moved).await.unwrap();
    assert_eq!(s.node("n1").await.unwrap(), Some(moved));

    assert!(s.set_node_state("n2", NodeState::Draining).await.unwrap());
    assert!(s.node_seen("n2", NOW + 5).await.unwrap());
    let n2 = s.node("n2").await.unwrap().unwrap();
    assert_eq!((n2.state, n2.last_seen_ms), (NodeState::Draining, Some(NOW + 5)));

    assert!(s.remove_node("n2").await.unwrap());
    assert!(!s.remove_node("n2").await.unwrap());
    assert!(!s.set_node_state("n2", NodeState::Down).await.unwrap());
    assert!(!s.node_seen("n2", NOW).await.unwrap());
    assert_eq!(s.node("n2").await.unwrap(), None);
}

async fn projects_nest_and_delete_bottom_up(s: &AnyStore) {
    s.create_principal(&Principal::tenant("team-rl", false, NOW), Some(token(1))).await.unwrap();
    s.create_principal(&Principal::project("team-rl/exp-42", NOW), None).await.unwrap();
    assert!(
        matches!(s.create_principal(&Principal::project("nobody/exp", NOW), None).await, Err(StoreError::NoSuchPrincipal(p)) if p == "nobody")
    );
    assert_eq!(s.principal("team-rl/exp-42").await.unwrap().unwrap().parent.as_deref(), Some("team-rl"));
    // A parent token issues one for the child; deleting the parent's
    // project later would revoke it, but a parent with children stays.
    s.issue_token("team-rl/exp-42", token(2), Role::Solver, Some(hash(1))).await.unwrap();
    assert_eq!(s.grant(&hash(2), NOW).await.unwrap().unwrap().role, Role::Solver);
    assert!(matches!(s.delete_principal("team-rl", NOW).await, Err(StoreError::HasChildren(p)) if p == "team-rl"));
    assert!(s.delete_principal("team-rl/exp-42", NOW).await.unwrap());
    assert!(!s.delete_principal("team-rl/exp-42", NOW).await.unwrap(), "gone");
    assert!(s.grant(&hash(2), NOW).await.unwrap().is_none(), "its tokens went with it");
    assert!(s.delete_principal("team-rl", NOW).await.unwrap());
    assert!(s.grant(&hash(1), NOW).await.unwrap().is_none());
    assert!(s.principals().await.unwrap().is_empty());
}

async fn revoking_a_token_revokes_what_it_issued(s: &AnyStore) {
    s.create_principal(&Principal::tenant("team", false, NOW), Some(token(1))).await.unwrap();
    s.create_principal(&Principal::project("team/a", NOW), None).await.unwrap();
    s.issue_token("team/a", token(2), Role::Admin, Some(hash(1))).await.unwrap();
    s.issue_token("team/a", token(3), Role::Builder, Some(hash(2))).await.unwrap();
    s.issue_token("team", token(4), Role::Solver, Some(hash(1))).await.unwrap();
    let listed = s.tokens().await.unwrap();
    assert_eq!(listed.len(), 4);
    let t3 = listed.iter().find(|t| t.hash == hash(3)).unwrap();
    assert_eq!((t3.principal.as_str(), t3.role, t3.issuer), ("team/a", Role::Builder, Some(hash(2))));
    assert!(s.revoke_token(&hash(2), NOW).await.unwrap());
    assert!(s.grant(&hash(2), NOW).await.unwrap().is_none());
    assert!(s.grant(&hash(3), NOW).await.unwrap().is_none(), "issued by a revoked token");
    assert!(s.grant(&hash(1), NOW).await.unwrap().is_some() && s.grant(&hash(4), NOW).await.unwrap().is_some());
    assert!(matches!(s.issue_token("team/a", token(5), Role::Solver, Some(hash(2))).await, Err(StoreError::IssuerRevoked)));
    assert_eq!(s.tokens().await.unwrap().iter().find(|t| t.hash == hash(3)).unwrap().revoked_at_ms, Some(NOW));
    // A whole project: what its tokens issued elsewhere goes too.
    s.issue_token("team/a", token(6), Role::Solver, Some(hash(1))).await.unwrap();
    s.delete_principal("team/a", NOW).await.unwrap();
    assert!(s.revoke_token(&hash(1), NOW).await.unwrap());
    assert!(s.grant(&hash(4), NOW).await.unwrap().is_none());
}

async fn quotas_delegate_at_most_the_free_share(s: &AnyStore) {
    s.create_principal(&Principal::tenant("team", false, NOW), None).await.unwrap();
    for c in ["team/a", "team/b", "team/a/x"] {
        s.create_principal(&Principal::project(c, NOW), None).await.unwrap();
    }
    let q = |n: u64| Quota { sandboxes: Some(n), cpu_millis: Some(n * 1000), ..Quota::default() };
    s.set_quota("team", Some(q(10))).await.unwrap();
    s.set_quota("team/a", Some(q(6))).await.unwrap();
    let e = s.set_quota("team/b", Some(q(5))).await.unwrap_err();
    assert!(matches!(&e, StoreError::Quota(QuotaError::AboveParentShare { free: 4, .. })), "{e}");
    s.set_quota("team/b", Some(q(4))).await.unwrap();
    // Changing a child's own quota does not count its old value.
    s.set_quota("team/a", Some(q(6))).await.unwrap();
    s.set_quota("team/b", Some(Quota { overcommit: true, ..q(8) })).await.unwrap();
    assert!(matches!(s.set_quota("team/a/x", Some(q(0))).await, Err(StoreError::Quota(QuotaError::Zero { .. }))));
    assert!(matches!(s.set_quota("nobody", Some(q(1))).await, Err(StoreError::NoSuchPrincipal(_))));
    let all = s.quotas().await.unwrap();
    assert_eq!(all.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(), ["team", "team/a", "team/b"]);
    assert!(all[2].1.overcommit && all[2].1.sandboxes == Some(8) && all[2].1.memory_mb.is_none());
    s.set_quota("team/b", None).await.unwrap();
    assert_eq!(s.quotas().await.unwrap().len(), 2);
    s.delete_principal("team/a/x", NOW).await.unwrap();
    s.delete_principal("team/a", NOW).await.unwrap();
    assert_eq!(s.quotas().await.unwrap().len(), 1, "a deleted project's quota goes with it");
}

async fn join_tokens_expire_and_are_revoked(s: &AnyStore) {
    s.add_join_token(token(10)).await.unwrap();
    s.add_join_token(NewToken { expires_at_ms: Some(NOW + 10), ..token(11) }).await.unwrap();
    assert!(s.join_token_live(&hash(10), NOW).await.unwrap());
    assert!(!s.join_token_live(&hash(12), NOW).await.unwrap(), "an unknown token admits nobody");
    assert!(s.join_token_live(&hash(11), NOW + 9).await.unwrap());
    assert!(!s.join_token_live(&hash(11), NOW + 10).await.unwrap(), "expired");
    assert!(s.revoke_join_token(&hash(10), NOW).await.unwrap());
    assert!(!s.revoke_join_token(&hash(10), NOW).await.unwrap());
    assert!(!s.join_token_live(&hash(10), NOW).await.unwrap());
    // A join token is not a user token, nor the other way round.
    assert!(s.grant(&hash(11), NOW).await.unwrap().is_none());
}

async fn members_join_rejoin_and_leave(s: &AnyStore) {
    let m = Membership { secret: "s1".into(), cpu_millis: 8000, memory_mb: 16384, max_sandboxes: 100 };
    assert!(!s.join_node(&node("n1"), &m).await.unwrap(), "a first join");
    s.put_node(&node("static")).await.unwrap();
    let members = s.members().await.unwrap();
    assert_eq!(members.len(), 2);
    assert_eq!(members[0], Member { node: node("n1"), membership: Some(m.clone()) });
    assert_eq!(members[1], Member { node: node("static"), membership: None });

    // Drained, then the edge restarts and joins again with a new secret:
    // it stays drained and its record is the new one.
    assert!(s.set_node_state("n1", NodeState::Draining).await.unwrap());
    let m2 = Membership { secret: "s2".into(), max_sandboxes: 50, ..m.clone() };
    let mut moved = node("n1");
    moved.url = "http://10.0.0.9:8081".into();
    assert!(s.join_node(&moved, &m2).await.unwrap(), "a rejoin");
    let got = s.members().await.unwrap().remove(0);
    assert_eq!((got.node.url.as_str(), got.node.state, got.membership), ("http://10.0.0.9:8081", NodeState::Draining, Some(m2.clone())));

    // A node that was down comes back active.
    assert!(s.set_node_state("n1", NodeState::Down).await.unwrap());
    s.join_node(&moved, &m2).await.unwrap();
    assert_eq!(s.node("n1").await.unwrap().unwrap().state, NodeState::Active);

    // Leaving removes the membership with the node.
    assert!(s.remove_node("n1").await.unwrap());
    assert_eq!(s.members().await.unwrap().len(), 1);
    assert!(!s.join_node(&node("n1"), &m).await.unwrap(), "joins afresh after leaving");
}

async fn creation_keys_hold_the_first_placement(s: &AnyStore) {
    assert_eq!(s.place_creation("team-a", "k1", "n1", NOW).await.unwrap(), "n1", "the first placement is recorded");
    assert_eq!(s.place_creation("team-a", "k1", "n2", NOW + 1).await.unwrap(), "n1", "a retry finds the first node");
    assert_eq!(s.place_creation("team-b", "k1", "n2", NOW).await.unwrap(), "n2", "keys are per tenant");
    assert!(s.move_creation("team-a", "k1", "n1", "n3").await.unwrap(), "n1 refused: the key moves on");
    assert!(!s.move_creation("team-a", "k1", "n1", "n4").await.unwrap(), "moved already, by another replica");
    assert_eq!(s.place_creation("team-a", "k1", "n9", NOW).await.unwrap(), "n3");
    assert_eq!(s.forget_creations(NOW + 1).await.unwrap(), 2, "both keys recorded at NOW");
    assert_eq!(s.place_creation("team-a", "k1", "n9", NOW + 2).await.unwrap(), "n9", "forgotten: placed afresh");
}

async fn schema_is_current(s: &AnyStore) {
    assert_eq!(s.schema_version().await.unwrap(), migrations::latest());
}

macro_rules! both_engines {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $test() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = dsec_store::AnyStore::open(&dsec_store::Database::Sqlite(dir.path().join("api.db"))).await.unwrap();
                    super::$test(&store).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() {
                    let Some(url) = dsec_store::testing::fresh_schema(stringify!($test)).await else { return };
                    let store = dsec_store::AnyStore::open(&dsec_store::Database::Postgres(url)).await.unwrap();
                    super::$test(&store).await;
                }
            )*
        }
    };
}

both_engines!(
    principals_and_tokens,
    tokens_expire_and_are_revoked,
    admin_tokens,
    node_registry,
    projects_nest_and_delete_bottom_up,
    revoking_a_token_revokes_what_it_issued,
    quotas_delegate_at_most_the_free_share,
    join_tokens_expire_and_are_revoked,
    members_join_rejoin_and_leave,
    creation_keys_hold_the_first_placement,
    schema_is_current
);

// What differs between the engines by design.

#[tokio::test]
async fn sqlite_file_belongs_to_one_process_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::Sqlite(dir.path().join("api.db"));
    let first = AnyStore::open(&db).await.unwrap();
    assert!(matches!(AnyStore::open(&db).await, Err(StoreError::InUse(_))));
    drop(first);
    AnyStore::open(&db).await.expect("free again once closed");
}

#[tokio::test]
async fn sqlite_refuses_a_newer_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.db");
    drop(AnyStore::open(&Database::Sqlite(path.clone())).await.unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("INSERT INTO schema_version (version, name, applied_at_ms) VALUES (99, 'future', 0)", []).unwrap();
    drop(conn);
    let err = AnyStore::open(&Database::Sqlite(path)).await.err().expect("refused");
    assert!(matches!(err, StoreError::NewerSchema { found: 99, .. }), "{err}");
}

/// A database made by the apiserver before versioned migrations: its
/// tenants become principals and their tokens keep working.
#[tokio::test]
async fn sqlite_database_of_the_first_schema_upgrades_in_place() {
    use sha2::{Digest, Sha256};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("apiserver.db");
    let admin_token = "dsec_aaaa";
    let tenant_token = "dsec_bbbb";
    {
        // Exactly what that apiserver ran.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS tenants (
                 name TEXT PRIMARY KEY,
                 token_sha256 BLOB NOT NULL UNIQUE,
                 admin INTEGER NOT NULL,
                 created_at_ms INTEGER NOT NULL
             );",
        )
        .unwrap();
        let insert = "INSERT INTO tenants (name, token_sha256, admin, created_at_ms) VALUES (?1, ?2, ?3, ?4)";
        conn.execute(insert, rusqlite::params!["admin", Sha256::digest(admin_token).to_vec(), 1, 1000]).unwrap();
        conn.execute(insert, rusqlite::params!["team-a", Sha256::digest(tenant_token).to_vec(), 0, 2000]).unwrap();
    }
    let s = AnyStore::open(&Database::Sqlite(path.clone())).await.unwrap();
    assert_eq!(s.schema_version().await.unwrap(), migrations::latest());
    let admin = s.grant(&Sha256::digest(admin_token).into(), NOW).await.unwrap().expect("the admin token still works");
    assert_eq!(admin.principal, Principal::tenant("admin", true, 1000));
    let team = s.grant(&Sha256::digest(tenant_token).into(), NOW).await.unwrap().expect("the tenant's token still works");
    assert_eq!(team.principal, Principal::tenant("team-a", false, 2000));
    assert_eq!(team.role, Role::Admin, "a tenant's token administers its project");
    assert_eq!(s.principals().await.unwrap().len(), 2);
    drop(s);

    let conn = rusqlite::Connection::open(&path).unwrap();
    let old: i64 = conn.query_row("SELECT COUNT(*) FROM sqlite_master WHERE name = 'tenants'", [], |r| r.get(0)).unwrap();
    assert_eq!(old, 0, "the first schema's table is gone once moved");
    let steps: i64 = conn.query_row("SELECT COUNT(*) FROM schema_version", [], |r| r.get(0)).unwrap();
    assert_eq!(steps, migrations::MIGRATIONS.len() as i64, "each step recorded once");
    drop(conn);
    // Opening again applies nothing.
    let s = AnyStore::open(&Database::Sqlite(path)).await.unwrap();
    assert!(s.grant(&Sha256::digest(tenant_token).into(), NOW).await.unwrap().is_some());
}

#[tokio::test]
async fn postgres_replicas_see_each_others_writes_at_once() {
    let Some(url) = dsec_store::testing::fresh_schema("replicas").await else { return };
    let db = Database::Postgres(url);
    // Replicas starting together: the migration runs once.
    let opens = (0..4).map(|_| AnyStore::open(&db));
    let replicas: Vec<AnyStore> = futures_util::future::join_all(opens).await.into_iter().map(Result::unwrap).collect();
    let (a, b) = (&replicas[0], &replicas[1]);
    a.create_principal(&Principal::tenant("team-a", false, NOW), Some(token(1))).await.unwrap();
    assert_eq!(b.grant(&hash(1), NOW).await.unwrap().unwrap().principal.name, "team-a");
    assert!(b.revoke_token(&hash(1), NOW).await.unwrap());
    assert!(a.grant(&hash(1), NOW).await.unwrap().is_none());
    b.put_node(&node("n1")).await.unwrap();
    assert_eq!(a.nodes().await.unwrap().len(), 1);
    for r in &replicas {
        assert_eq!(r.schema_version().await.unwrap(), migrations::latest());
    }
}

#[tokio::test]
async fn postgres_refuses_a_newer_schema() {
    let Some(url) = dsec_store::testing::fresh_schema("newer_schema").await else { return };
    drop(AnyStore::open(&Database::Postgres(url.clone())).await.unwrap());
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client.batch_execute("INSERT INTO schema_version (version, name, applied_at_ms) VALUES (99, 'future', 0)").await.unwrap();
    let err = AnyStore::open(&Database::Postgres(url)).await.err().expect("refused");
    assert!(matches!(err, StoreError::NewerSchema { found: 99, .. }), "{err}");
}

#[tokio::test]
async fn postgres_outage_is_unavailable_and_heals() {
    if !dsec_store::testing::postgres_required() {
        eprintln!("postgres_outage: not run: {} is unset", dsec_store::testing::ENV);
        return;
    }
    let pg = dsec_store::testing::TempPostgres::start().expect("a private PostgreSQL server");
    let s = AnyStore::open(&Database::Postgres(pg.url().to_string())).await.unwrap();
    s.create_principal(&Principal::tenant("team-a", false, NOW), Some(token(1))).await.unwrap();
    pg.stop().unwrap();
    let started = std::time::Instant::now();
    let err = s.grant(&hash(1), NOW).await.expect_err("no database, no answer");
    assert!(err.is_unavailable(), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "fails within the connect timeout");
    pg.restart().unwrap();
    // The pool makes new connections; nothing written before is lost.
    assert_eq!(s.grant(&hash(1), NOW).await.unwrap().unwrap().principal.name, "team-a");
}
