//! E2B's control plane: sandboxes created, listed, inspected, killed,
//! paused, resumed and connected to, on the native API's own calls.

use std::collections::BTreeMap;

use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use dsec_api::{self as api, ErrorCode};
use dsec_edge::{Caller, Lease, ListFilter, PauseMode};
use rand::RngCore;

use super::error::{RestError, RestResult};
use super::view::{self, NewSandbox, Reconnect, Timeout};
use super::{E2bState, Owner};
use crate::auth::Authenticator;
use crate::convert;
use crate::error::ApiError;
use crate::extract::{ApiJson, QueryPairs};

/// The caller of a control-plane call: a dsec token in `X-API-Key` (what
/// the SDK sends), or the native API's own credentials (a bearer token, or
/// an apiserver forwarding to this edge).
pub async fn caller(auth: &Authenticator, headers: &HeaderMap) -> RestResult<Caller> {
    if let (Authenticator::Tokens(store), Some(key)) = (auth, headers.get("x-api-key")) {
        let key = key.to_str().map_err(|_| RestError::new(StatusCode::UNAUTHORIZED, "X-API-Key must be visible ASCII"))?;
        // A database that is away is a 503 with Retry-After, not a 401.
        return match store.verify(key.trim()).await.map_err(ApiError::from)? {
            Some(t) => Ok(Caller { tenant: t.name, admin: t.admin }),
            None => Err(RestError::new(StatusCode::UNAUTHORIZED, "invalid API key: use a dsec token")),
        };
    }
    auth.authenticate(headers).await.map_err(|e| match e.code {
        ErrorCode::Unauthorized => RestError::new(StatusCode::UNAUTHORIZED, e.message),
        _ => RestError::from(e),
    })
}

fn new_access_token() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// `POST /sandboxes` and `POST /v2/sandboxes` (the same body in both).
pub async fn create(
    State(st): State<E2bState>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<NewSandbox>,
) -> RestResult<(StatusCode, Json<view::Created>)> {
    let caller = caller(&st.app.auth, &headers).await?;
    let mut labels = req.metadata.unwrap_or_default();
    if let Some(k) = labels.keys().find(|k| k.starts_with(view::RESERVED_PREFIX)) {
        return Err(RestError::new(
            StatusCode::BAD_REQUEST,
            format!("metadata key {k:?}: the prefix {} is reserved", view::RESERVED_PREFIX),
        ));
    }
    labels.insert(view::TOKEN_LABEL.to_string(), new_access_token());
    let timeout = req.timeout.unwrap_or(view::DEFAULT_TIMEOUT_S);
    if timeout == 0 {
        return Err(RestError::new(StatusCode::BAD_REQUEST, "timeout must be at least 1 second"));
    }
    let create = api::CreateSandboxRequest {
        backend: api::Backend::Container,
        image: if req.template_id.is_empty() { view::DEFAULT_TEMPLATE.to_string() } else { req.template_id },
        workspace: None,
        toolkits: vec![],
        memory_limit_mb: None,
        cpu_cores_limit: None,
        disk_limit_mb: None,
        pids_limit: None,
        qos_class: None,
        // E2B sandboxes end at their timeout, idle or not.
        ttl_running_stop: Some(0),
        max_lifetime_s: Some(timeout),
        network_rules: BTreeMap::new(),
        init_user: None,
        env: req.env_vars.unwrap_or_default(),
        workdir: None,
        labels,
        node_selector: Default::default(),
        job: None,
        snapshot: None,
        volumes: Default::default(),
        first_exec: None,
    };
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string);
    let created = crate::quota::create(&st.app, &caller, create, key.as_deref()).await?;
    Ok((StatusCode::CREATED, Json(view::created(&created.sandbox, &caller.tenant, st.app.sandbox_domain.as_deref()))))
}

/// A live sandbox of the caller as the native API shows it; a stopped or
/// failed one is gone (404), as a killed one is in E2B.
fn live(st: &E2bState, caller: &Caller, id: &str) -> RestResult<api::Sandbox> {
    let not_found = || RestError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found"));
    let edge = match st.owner(id) {
        Owner::Local(e) => e,
        Owner::Remote(node) => return Err(RestError::new(StatusCode::NOT_IMPLEMENTED, super::remote_message(id, &node))),
        Owner::Unknown => return Err(not_found()),
    };
    let rec = edge.get(caller, id).map_err(|e| match e.code() {
        ErrorCode::SandboxNotFound => not_found(),
        _ => e.into(),
    })?;
    let s = convert::sandbox_out(rec);
    view::state(s.state).ok_or_else(not_found)?;
    Ok(s)
}

pub async fn get(State(st): State<E2bState>, headers: HeaderMap, Path(id): Path<String>) -> RestResult<Json<view::Detail>> {
    let caller = caller(&st.app.auth, &headers).await?;
    let s = live(&st, &caller, &id)?;
    view::detail(&s, &caller.tenant, true).map(Json).ok_or_else(|| RestError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found")))
}

pub async fn kill(State(st): State<E2bState>, headers: HeaderMap, Path(id): Path<String>) -> RestResult<StatusCode> {
    let caller = caller(&st.app.auth, &headers).await?;
    live(&st, &caller, &id)?;
    st.app.nodes.owner(&id)?.delete(&caller, &id).await?;
    st.processes.forget_sandbox(&id);
    Ok(StatusCode::NO_CONTENT)
}

pub async fn set_timeout(
    State(st): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<Timeout>,
) -> RestResult<StatusCode> {
    let caller = caller(&st.app.auth, &headers).await?;
    live(&st, &caller, &id)?;
    set_lifetime(&st, &caller, &id, req.timeout)?;
    Ok(StatusCode::NO_CONTENT)
}

/// The sandbox ends `timeout` seconds from now.
fn set_lifetime(st: &E2bState, caller: &Caller, id: &str, timeout: u64) -> RestResult<()> {
    if timeout == 0 {
        return Err(RestError::new(StatusCode::BAD_REQUEST, "timeout must be at least 1 second"));
    }
    st.app.nodes.owner(id)?.set_lease(caller, id, Lease { idle_ttl_s: None, lifetime_s: Some(timeout) })?;
    Ok(())
}

pub async fn pause(State(st): State<E2bState>, headers: HeaderMap, Path(id): Path<String>) -> RestResult<StatusCode> {
    let caller = caller(&st.app.auth, &headers).await?;
    live(&st, &caller, &id)?;
    let outcome = st.app.nodes.owner(&id)?.pause_with(&caller, &id, PauseMode::Auto).await?;
    if !outcome.changed {
        return Err(RestError::new(StatusCode::CONFLICT, format!("sandbox {id} is already paused")));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The start of resume and connect: the caller, the (optional) body and
/// the live sandbox.
pub struct Reconnecting {
    caller: Caller,
    id: String,
    req: Reconnect,
    sandbox: api::Sandbox,
}

/// The most a resume or connect body holds.
const MAX_RECONNECT_BODY: usize = 64 << 10;

impl FromRequest<E2bState> for Reconnecting {
    type Rejection = RestError;

    async fn from_request(req: Request, st: &E2bState) -> Result<Self, RestError> {
        let (mut parts, body) = req.into_parts();
        let caller = caller(&st.app.auth, &parts.headers).await?;
        let Path(id) =
            Path::<String>::from_request_parts(&mut parts, st).await.map_err(|e| RestError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
        let body = axum::body::to_bytes(body, MAX_RECONNECT_BODY)
            .await
            .map_err(|e| RestError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("reading the body: {e}")))?;
        let req = if body.iter().all(u8::is_ascii_whitespace) {
            Reconnect::default()
        } else {
            serde_json::from_slice(&body).map_err(|e| RestError::new(StatusCode::BAD_REQUEST, format!("invalid body: {e}")))?
        };
        let sandbox = live(st, &caller, &id)?;
        Ok(Reconnecting { caller, id, req, sandbox })
    }
}

/// `POST /sandboxes/{id}/resume`: a paused sandbox only (409 otherwise),
/// with a new timeout from now.
pub async fn resume(State(st): State<E2bState>, r: Reconnecting) -> RestResult<Response> {
    let Reconnecting { caller, id, req, sandbox } = r;
    if view::state(sandbox.state) != Some("paused") {
        return Err(RestError::new(StatusCode::CONFLICT, format!("sandbox {id} is already running")));
    }
    st.app.nodes.owner(&id)?.resume(&caller, &id).await?;
    set_lifetime(&st, &caller, &id, req.timeout.unwrap_or(view::DEFAULT_TIMEOUT_S))?;
    let s = live(&st, &caller, &id)?;
    Ok((StatusCode::CREATED, Json(view::created(&s, &caller.tenant, st.app.sandbox_domain.as_deref()))).into_response())
}

/// `POST /sandboxes/{id}/connect` (and `/v2/...`): resumes a paused
/// sandbox (201) or takes a running one as it is (200); the timeout is
/// raised to `timeout` from now, never shortened.
pub async fn connect(State(st): State<E2bState>, r: Reconnecting) -> RestResult<Response> {
    let Reconnecting { caller, id, req, sandbox } = r;
    let resumed = view::state(sandbox.state) == Some("paused");
    if resumed {
        st.app.nodes.owner(&id)?.resume(&caller, &id).await?;
    }
    if let Some(timeout) = req.timeout {
        let want_ms = dsec_edge::model::now_ms() + timeout * 1000;
        if want_ms > view::end_ms(&sandbox) {
            set_lifetime(&st, &caller, &id, timeout)?;
        }
    }
    let s = live(&st, &caller, &id)?;
    let status = if resumed { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(view::created(&s, &caller.tenant, st.app.sandbox_domain.as_deref()))).into_response())
}

/// `GET /sandboxes`: every live sandbox of the caller, unpaged.
pub async fn list_v1(State(st): State<E2bState>, headers: HeaderMap, q: QueryPairs) -> RestResult<Json<Vec<view::Detail>>> {
    let caller = caller(&st.app.auth, &headers).await?;
    let query = ListQuery::parse(&q)?;
    let all = query.matching(&st, &caller).await;
    Ok(Json(all.iter().filter_map(|s| view::detail(s, &caller.tenant, false)).collect()))
}

/// `GET /v2/sandboxes`: filtered by metadata and state, ordered by start
/// time, paged by `limit` and `nextToken` (the next page's token in the
/// `x-next-token` header).
pub async fn list_v2(State(st): State<E2bState>, headers: HeaderMap, q: QueryPairs) -> RestResult<Response> {
    let caller = caller(&st.app.auth, &headers).await?;
    let query = ListQuery::parse(&q)?;
    let mut all = query.matching(&st, &caller).await;
    if query.descending {
        all.reverse();
    }
    // The token is the position after the last sandbox sent: its start time
    // and id, which order the list.
    if let Some(token) = &query.next_token {
        let after = decode_token(token)?;
        let key = |s: &api::Sandbox| (s.created_at.clone(), s.id.clone());
        all.retain(|s| if query.descending { key(s) < after } else { key(s) > after });
    }
    let more = all.len() > query.limit;
    all.truncate(query.limit);
    let page: Vec<view::Detail> = all.iter().filter_map(|s| view::detail(s, &caller.tenant, false)).collect();
    let mut resp = Json(page).into_response();
    if let (true, Some(last)) = (more, all.last()) {
        let token = encode_token(&last.created_at, &last.id);
        if let Ok(v) = HeaderValue::from_str(&token) {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}

/// A page's `nextToken`: the start time and id of its last sandbox.
fn encode_token(created_at: &str, id: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{created_at}\n{id}"))
}

fn decode_token(token: &str) -> RestResult<(String, String)> {
    let bad = || RestError::new(StatusCode::BAD_REQUEST, format!("invalid nextToken {token:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    let s = String::from_utf8(raw).map_err(|_| bad())?;
    let (at, id) = s.split_once('\n').ok_or_else(bad)?;
    Ok((at.to_string(), id.to_string()))
}

/// The filters of a list call.
struct ListQuery {
    metadata: Vec<(String, String)>,
    /// `running`, `paused`; empty: both.
    states: Vec<String>,
    descending: bool,
    limit: usize,
    next_token: Option<String>,
}

/// The most a page holds (E2B's maximum).
const MAX_PAGE: usize = 100;

impl ListQuery {
    fn parse(q: &QueryPairs) -> RestResult<ListQuery> {
        let bad = |m: String| RestError::new(StatusCode::BAD_REQUEST, m);
        // `metadata` is itself a query string (`k=v&k2=v2`, each part
        // percent-encoded once more).
        let metadata = q.get("metadata").map(|m| form_urlencoded::parse(m.as_bytes()).into_owned().collect()).unwrap_or_default();
        let mut states = Vec::new();
        for s in q.all("state").flat_map(|v| v.split(',')).filter(|s| !s.is_empty()) {
            match s {
                "running" | "paused" => states.push(s.to_string()),
                other => return Err(bad(format!("unknown state {other:?} (running or paused)"))),
            }
        }
        let descending = match q.get("order") {
            None | Some("asc") => false,
            Some("desc") => true,
            Some(o) => return Err(bad(format!("order must be asc or desc, not {o:?}"))),
        };
        let limit = match q.number::<usize>("limit").map_err(RestError::from)? {
            None => MAX_PAGE,
            Some(0) => return Err(bad("limit must be at least 1".into())),
            Some(n) => n.min(MAX_PAGE),
        };
        Ok(ListQuery { metadata, states, descending, limit, next_token: q.get("nextToken").map(str::to_string) })
    }

    /// The caller's live sandboxes that match, oldest first.
    async fn matching(&self, st: &E2bState, caller: &Caller) -> Vec<api::Sandbox> {
        let filter = ListFilter { state: None, job: None, labels: self.metadata.clone() };
        let (all, _unreachable) = st.app.nodes.list(caller, &filter, "").await;
        all.into_iter()
            .filter(|s| match view::state(s.state) {
                Some(state) => self.states.is_empty() || self.states.iter().any(|w| w == state),
                None => false,
            })
            .filter(|s| self.metadata.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(q: &str) -> RestResult<ListQuery> {
        ListQuery::parse(&QueryPairs(form_urlencoded::parse(q.as_bytes()).into_owned().collect()))
    }

    #[test]
    fn list_queries_read_as_the_sdk_writes_them() {
        // The SDK quotes each key and value, then encodes the pairs as the
        // value of `metadata`: two layers of percent-encoding.
        let q = query("metadata=a%3D1%26b%3Dx%2520y&state=running,paused&order=desc&limit=500").unwrap();
        assert_eq!(q.metadata, vec![("a".to_string(), "1".to_string()), ("b".to_string(), "x y".to_string())]);
        assert_eq!(q.states, vec!["running", "paused"]);
        assert!(q.descending);
        assert_eq!(q.limit, MAX_PAGE, "a page holds at most {MAX_PAGE}");
        let plain = query("").unwrap();
        assert!(plain.metadata.is_empty() && plain.states.is_empty() && !plain.descending);
        for bad in ["state=stopped", "order=up", "limit=0", "limit=x"] {
            assert_eq!(query(bad).err().map(|e| e.status), Some(StatusCode::BAD_REQUEST), "{bad}");
        }
    }

    #[test]
    fn page_tokens_round_trip_and_refuse_garbage() {
        let t = encode_token("2026-12-02T01:00:00.000Z", "n1.abcdefghijkl");
        assert_eq!(decode_token(&t).unwrap(), ("2026-12-02T01:00:00.000Z".to_string(), "n1.abcdefghijkl".to_string()));
        assert!(decode_token("!!").is_err());
        assert!(decode_token(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("no newline")).is_err());
    }
}
