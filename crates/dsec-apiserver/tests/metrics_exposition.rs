//! `GET /metrics` read back by a strict parser of the text exposition
//! format: every sample's family is declared once and before it, label
//! values are quoted, histograms have ascending cumulative buckets ending
//! at `+Inf` equal to their `_count`, and the request-duration histogram
//! counts the requests made, by route template (never a concrete path).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use dsec_apiserver::auth::{Authenticator, TokenStore};
use dsec_apiserver::nodes::Nodes;
use dsec_apiserver::{router, AppState};
use dsec_store::Database;
use http_body_util::BodyExt;
use tower::ServiceExt;

/// One sample line: metric name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses an exposition, failing on anything the format does not allow.
/// Returns the declared families (name -> type) and the samples in order.
fn parse(text: &str) -> (HashMap<String, String>, Vec<Sample>) {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helped: HashMap<String, ()> = HashMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(helped.insert(name.to_string(), ()).is_none(), "HELP twice for {name}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(types.insert(name.to_string(), kind.to_string()).is_none(), "TYPE twice for {name}");
            continue;
        }
        assert!(!line.is_empty() && !line.starts_with('#'), "unexpected line {line:?}");
        let (head, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match head.split_once('{') {
            None => (head.to_string(), BTreeMap::new()),
            Some((name, rest)) => (name.to_string(), parse_labels(rest.strip_suffix('}').expect("labels end with }"))),
        };
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'), "bad name {name}");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.get(*f).is_some_and(|t| t == "histogram")))
            .unwrap_or(&name);
        assert!(types.contains_key(family), "sample of an undeclared family before its TYPE: {line}");
        samples.push(Sample { name, labels, value });
    }
    (types, samples)
}

fn parse_labels(mut s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    while !s.is_empty() {
        let (key, rest) = s.split_once("=\"").expect("label=\"value\"");
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next().expect("unterminated label value") {
                (_, '\\') => match chars.next().expect("escape at end").1 {
                    'n' => value.push('\n'),
                    c @ ('\\' | '"') => value.push(c),
                    c => panic!("bad escape \\{c}"),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        assert!(out.insert(key.to_string(), value).is_none(), "label {key} twice");
        s = &rest[end + 1..];
        s = s.strip_prefix(',').unwrap_or(s);
    }
    out
}

/// A series' labels but `le`, in order.
type Labels = Vec<(String, String)>;

/// Checks every histogram series: ascending bounds, non-decreasing
/// cumulative counts, a final `+Inf` bucket equal to `_count`.
fn check_histograms(types: &HashMap<String, String>, samples: &[Sample]) {
    for (family, _) in types.iter().filter(|(_, t)| *t == "histogram") {
        let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
        for s in samples.iter().filter(|s| s.name == format!("{family}_bucket")) {
            let le = s.labels.get("le").expect("a bucket has le");
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() };
            let key = s.labels.iter().filter(|(k, _)| *k != "le").map(|(k, v)| (k.clone(), v.clone())).collect();
            series.entry(key).or_default().push((le, s.value));
        }
        for (key, buckets) in series {
            assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{family} {key:?}: {buckets:?}");
            let (last_le, last) = *buckets.last().unwrap();
            assert_eq!(last_le, f64::INFINITY, "{family} {key:?} ends at +Inf");
            let labels: BTreeMap<String, String> = key.into_iter().collect();
            let count = samples.iter().find(|s| s.name == format!("{family}_count") && s.labels == labels).expect("a _count");
            assert_eq!(count.value, last, "{family} {labels:?}: +Inf bucket equals _count");
            assert!(samples.iter().any(|s| s.name == format!("{family}_sum") && s.labels == labels), "a _sum");
        }
    }
}

async fn get(st: &AppState, path: &str, token: &str) -> (StatusCode, String) {
    let req = Request::get(path).header("authorization", format!("Bearer {token}")).body(Body::empty()).unwrap();
    let resp = router(st.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    (status, String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap())
}

#[tokio::test]
async fn the_exposition_parses_and_counts_requests_by_route_template() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::parse(&format!("sqlite:{}", dir.path().join("store.db").display())).unwrap();
    let admin_file = dir.path().join("admin-token");
    let tokens = TokenStore::open(&db, &admin_file).await.unwrap();
    let admin = std::fs::read_to_string(&admin_file).unwrap().trim().to_string();
    let st = AppState::new(Arc::new(Authenticator::Tokens(tokens)), Arc::new(Nodes::new(vec![])));

    for _ in 0..3 {
        assert_eq!(get(&st, "/healthz", &admin).await.0, StatusCode::OK);
    }
    // Two different sandbox ids: one route template, not two series.
    assert_eq!(get(&st, "/v1/sandboxes/nowhere.aaaaaaaaaaaa", &admin).await.0, StatusCode::NOT_FOUND);
    assert_eq!(get(&st, "/v1/sandboxes/nowhere.bbbbbbbbbbbb", &admin).await.0, StatusCode::NOT_FOUND);
    assert_eq!(get(&st, "/no/such/route", &admin).await.0, StatusCode::NOT_FOUND);
    assert_eq!(get(&st, "/metrics", "wrong-token").await.0, StatusCode::UNAUTHORIZED);

    let (status, text) = get(&st, "/metrics", &admin).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (types, samples) = parse(&text);
    check_histograms(&types, &samples);
    assert_eq!(types.get("dsec_http_request_duration_seconds").map(String::as_str), Some("histogram"));
    assert_eq!(types.get("dsec_placement_seconds").map(String::as_str), Some("histogram"));

    let count = |route: &str, code: &str| -> f64 {
        samples
            .iter()
            .filter(|s| s.name == "dsec_http_request_duration_seconds_count")
            .filter(|s| s.labels.get("route").map(String::as_str) == Some(route) && s.labels["code"] == code)
            .map(|s| s.value)
            .sum()
    };
    assert_eq!(count("/healthz", "2xx"), 3.0);
    assert_eq!(count("/v1/sandboxes/{id}", "4xx"), 2.0, "{text}");
    assert_eq!(count("unmatched", "4xx"), 1.0);
    assert_eq!(count("/metrics", "4xx"), 1.0);
    assert!(!samples.iter().any(|s| s.labels.values().any(|v| v.contains("aaaaaaaaaaaa"))), "no concrete path becomes a label value");
}
