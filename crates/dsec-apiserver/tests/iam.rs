//! Projects, quotas and scoped tokens through the HTTP API (on SQLite, no
//! nodes): the tree, delegation, roles, expiry and revocation, and every
//! bad input of the issue that needs no sandbox (those are in the SDK's
//! end-to-end tests).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use dsec_apiserver::auth::{Authenticator, TokenStore};
use dsec_apiserver::nodes::Nodes;
use dsec_apiserver::{router, AppState};
use dsec_store::Database;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

struct Api {
    st: AppState,
    admin: String,
    _dir: tempfile::TempDir,
}

async fn api() -> Api {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admin-token");
    let tokens = TokenStore::open(&Database::Sqlite(dir.path().join("api.db")), &file).await.unwrap();
    let st = AppState::new(Arc::new(Authenticator::Tokens(tokens)), Arc::new(Nodes::new(vec![])));
    let admin = std::fs::read_to_string(&file).unwrap().trim().to_string();
    Api { st, admin, _dir: dir }
}

impl Api {
    /// (status, error code or "", body)
    async fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> (StatusCode, String, Value) {
        let mut req = Request::builder().method(method).uri(path).header("authorization", format!("Bearer {token}"));
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req.body(body.map_or_else(Body::empty, |b| Body::from(b.to_string()))).unwrap();
        let resp = router(self.st.clone()).oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, v["error"]["code"].as_str().unwrap_or("").to_string(), v)
    }

    async fn project(&self, token: &str, name: &str, quota: Option<Value>) -> (StatusCode, String, Value) {
        self.call("POST", "/v1/projects", token, Some(json!({ "name": name, "quota": quota }))).await
    }

    /// Issues a token; panics unless it was made.
    async fn token(&self, issuer: &str, project: &str, role: &str, ttl_s: Option<i64>) -> (String, String) {
        let (s, code, v) = self.call("POST", "/v1/tokens", issuer, Some(json!({ "project": project, "role": role, "ttl_s": ttl_s }))).await;
        assert_eq!(s, StatusCode::CREATED, "{code}: {v}");
        (v["token"].as_str().unwrap().to_string(), v["id"].as_str().unwrap().to_string())
    }
}

#[tokio::test]
async fn projects_nest_with_delegated_quotas_and_refuse_bad_input() {
    let a = api().await;
    let admin = a.admin.clone();
    assert_eq!(a.project(&admin, "team-rl", Some(json!({ "sandboxes": 10, "cpu": 8 }))).await.0, StatusCode::CREATED);
    let (team, _) = a.token(&admin, "team-rl", "admin", None).await;
    // The team's admin manages what is below it, not itself.
    assert_eq!(a.project(&team, "team-rl/exp-42", Some(json!({ "sandboxes": 6 }))).await.0, StatusCode::CREATED);
    let (s, code, v) = a.project(&team, "team-rl/exp-43", Some(json!({ "sandboxes": 5 }))).await;
    assert_eq!((s, code.as_str()), (StatusCode::FORBIDDEN, "forbidden"), "above the parent's free share");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("team-rl") && msg.contains("sandboxes") && msg.contains("4"), "{msg}");
    assert_eq!(a.call("GET", "/v1/projects/team-rl/exp-43", &admin, None).await.0, StatusCode::NOT_FOUND, "nothing left of it");
    assert_eq!(a.project(&team, "team-rl/exp-43", Some(json!({ "sandboxes": 5, "overcommit": true }))).await.0, StatusCode::CREATED);
    let (s, code, _) = a.call("PATCH", "/v1/projects/team-rl", &team, Some(json!({ "quota": { "sandboxes": 100 } }))).await;
    assert_eq!((s, code.as_str()), (StatusCode::FORBIDDEN, "forbidden"), "nobody raises their own quota");

    for (q, what) in [(json!({ "sandboxes": 0 }), "zero"), (json!({ "memory_mb": -5 }), "negative"), (json!({ "cpu": 0.0 }), "zero cpu")] {
        let (s, code, _) = a.project(&team, "team-rl/bad", Some(q)).await;
        assert_eq!((s, code.as_str()), (StatusCode::BAD_REQUEST, "invalid_limits"), "{what}");
    }
    let (s, code, _) = a.project(&team, "team-rl/nope/exp", None).await;
    assert_eq!((s, code.as_str()), (StatusCode::NOT_FOUND, "not_found"), "an unknown parent");
    for bad in ["team-rl/../x", "team-rl//x", "/team-rl", "Team"] {
        assert_eq!(a.project(&admin, bad, None).await.1, "invalid_request", "{bad:?}");
    }
    assert_eq!(a.project(&team, "other", None).await.1, "forbidden", "a top-level project takes the platform's admin");
    assert_eq!(a.project(&team, "team-rl/exp-42", None).await.1, "already_exists");

    let (s, _, v) = a.call("GET", "/v1/projects/team-rl", &team, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["overcommitted"], json!(true), "its children hold 11 of its 10 sandboxes");
    let sandboxes = v["usage"].as_array().unwrap().iter().find(|u| u["name"] == "sandboxes").unwrap().clone();
    assert_eq!(sandboxes, json!({ "name": "sandboxes", "limit": 10.0, "used": 0.0, "allocated": 11.0 }));
    let cpu = v["usage"].as_array().unwrap().iter().find(|u| u["name"] == "cpu").unwrap().clone();
    assert_eq!(cpu["limit"], json!(8.0));

    // A sub-project's token sees its own project only.
    let (exp, _) = a.token(&team, "team-rl/exp-42", "solver", None).await;
    let (_, _, v) = a.call("GET", "/v1/projects", &exp, None).await;
    let names: Vec<&str> = v["projects"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["team-rl/exp-42"]);
    assert_eq!(a.call("GET", "/v1/projects/team-rl", &exp, None).await.1, "not_found");

    let (s, code, _) = a.call("DELETE", "/v1/projects/team-rl", &admin, None).await;
    assert_eq!((s, code.as_str()), (StatusCode::CONFLICT, "project_not_empty"));
    assert_eq!(a.call("DELETE", "/v1/projects/team-rl/exp-42", &team, None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(a.call("GET", "/v1/projects", &exp, None).await.1, "unauthorized", "a deleted project's tokens stop working");
}

#[tokio::test]
async fn tokens_never_outrank_or_outlive_their_issuer_and_revocation_cascades() {
    let a = api().await;
    let admin = a.admin.clone();
    a.project(&admin, "team", None).await;
    a.project(&admin, "team/sub", None).await;
    let (builder, builder_id) = a.token(&admin, "team", "builder", Some(3600)).await;
    let (s, code, _) = a.call("POST", "/v1/tokens", &builder, Some(json!({ "project": "team", "role": "admin" }))).await;
    assert_eq!((s, code.as_str()), (StatusCode::FORBIDDEN, "forbidden"), "grant more than one holds");
    let (s, code, _) = a.call("POST", "/v1/tokens", &builder, Some(json!({ "project": "team", "role": "solver" }))).await;
    assert_eq!((s, code.as_str()), (StatusCode::FORBIDDEN, "forbidden"), "a builder is no solver");
    let (s, code, _) = a.call("POST", "/v1/tokens", &builder, Some(json!({ "project": "team", "ttl_s": 7200 }))).await;
    assert_eq!((s, code.as_str()), (StatusCode::FORBIDDEN, "forbidden"), "outlive its issuer");
    assert_eq!(a.call("POST", "/v1/tokens", &builder, Some(json!({ "project": "team", "ttl_s": 0 }))).await.1, "invalid_request");
    assert_eq!(a.call("POST", "/v1/tokens", &admin, Some(json!({ "project": "team", "ttl_s": i64::MAX }))).await.1, "invalid_request");
    assert_eq!(a.call("POST", "/v1/tokens", &builder, Some(json!({ "project": "team", "role": "root" }))).await.1, "invalid_request");
    assert_eq!(a.call("POST", "/v1/tokens", &builder, Some(json!({ "project": "elsewhere" }))).await.1, "not_found");

    // Issued without a ttl by an expiring token: it expires with it.
    let (agent, agent_id) = a.token(&builder, "team/sub", "builder", None).await;
    let (_, _, v) = a.call("GET", "/v1/tokens", &builder, None).await;
    let listed = v["tokens"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "itself and what it issued: {v}");
    assert!(listed.iter().all(|t| t.get("token").is_none()), "a list never holds a secret");
    let agent_row = listed.iter().find(|t| t["id"] == agent_id.as_str()).unwrap();
    let builder_row = listed.iter().find(|t| t["id"] == builder_id.as_str()).unwrap();
    assert_eq!(agent_row["expires_at"], builder_row["expires_at"]);
    assert_eq!(agent_row["issuer"], json!(builder_id));
    assert!(!v.to_string().contains(&agent), "the secret appears nowhere");

    // The agent's token works for its sub-project only.
    assert_eq!(a.call("GET", "/v1/projects/team/sub", &agent, None).await.0, StatusCode::OK);
    assert_eq!(a.call("GET", "/v1/projects/team", &agent, None).await.1, "not_found");
    assert_eq!(a.call("DELETE", &format!("/v1/tokens/{builder_id}"), &agent, None).await.1, "not_found", "not its to revoke");

    // Revoking the builder revokes the agent's token too, at once.
    assert_eq!(a.call("DELETE", &format!("/v1/tokens/{builder_id}"), &admin, None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(a.call("GET", "/v1/projects", &builder, None).await.1, "unauthorized");
    assert_eq!(a.call("GET", "/v1/projects", &agent, None).await.1, "unauthorized");
    assert_eq!(a.call("DELETE", &format!("/v1/tokens/{builder_id}"), &admin, None).await.0, StatusCode::NO_CONTENT, "idempotent");
    let (_, _, v) = a.call("GET", "/v1/tokens", &admin, None).await;
    assert!(v["tokens"].as_array().unwrap().iter().filter(|t| t["project"] == "team/sub").all(|t| !t["revoked_at"].is_null()));

    // An expired token is refused like a revoked one.
    let (short, _) = a.token(&admin, "team", "solver", Some(1)).await;
    assert_eq!(a.call("GET", "/v1/projects", &short, None).await.0, StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(a.call("GET", "/v1/projects", &short, None).await.1, "unauthorized");
}

#[tokio::test]
async fn a_creation_over_a_quota_is_refused_naming_the_project_and_the_limit() {
    let a = api().await;
    let admin = a.admin.clone();
    a.project(&admin, "team", Some(json!({ "creations_per_s": 1, "sandboxes": 3 }))).await;
    a.project(&admin, "team/exp", None).await;
    let (exp, _) = a.token(&admin, "team/exp", "solver", None).await;
    let create = || json!({ "image": "busybox" });
    // No node here: the first creation passes the quota and finds no room;
    // its reservation is given back.
    assert_eq!(a.call("POST", "/v1/sandboxes", &exp, Some(create())).await.1, "no_capacity");
    let (s, code, v) = a.call("POST", "/v1/sandboxes", &exp, Some(create())).await;
    assert_eq!((s, code.as_str()), (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"));
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("\"team\"") && msg.contains("creations_per_s"), "{msg}");
    let (_, _, v) = a.call("GET", "/v1/projects/team", &admin, None).await;
    let used = v["usage"].as_array().unwrap().iter().find(|u| u["name"] == "sandboxes").unwrap()["used"].clone();
    assert_eq!(used, json!(0.0), "nothing is held by failed creations");
}
