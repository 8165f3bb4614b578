//! `dsec edge --join`: registering this edge with the cluster's apiservers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::http::Method;
use dsec_api as api;
use dsec_client::{Client, ClientError};
use dsec_edge::Edge;

/// How long an edge keeps trying to reach an apiserver that is not up yet.
const JOIN_PATIENCE: Duration = Duration::from_secs(60);

/// `KEY=VALUE`, as `--label` takes it.
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    if k.is_empty() || k.len() > 63 || !k.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/')) {
        return Err(format!("label key {k:?} must be 1-63 characters of a-z, A-Z, 0-9, '-', '_', '.', '/'"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// What the hardware says of this node: `kvm=true|false` (microVMs and
/// full VMs need it to be fast) and `arch`.
pub fn hardware_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kvm".to_string(), std::path::Path::new("/dev/kvm").exists().to_string()),
        ("arch".to_string(), std::env::consts::ARCH.to_string()),
    ])
}

pub struct JoinSpec<'a> {
    pub apiserver: &'a str,
    pub token: &'a str,
    /// The CA the apiserver's certificate must chain to (an https:// one).
    pub cluster_ca: Option<&'a std::path::Path>,
    pub url: String,
    pub secret: String,
    pub labels: BTreeMap<String, String>,
    pub pool: String,
}

/// Joins the cluster: the backends that really started, the capacity
/// admission enforces, the labels. Connection failures and 503s are
/// retried for a minute (apiservers may be starting); a refused token is
/// an error at once.
pub async fn join(edge: &Edge, spec: JoinSpec<'_>) -> anyhow::Result<api::JoinAnswer> {
    let stats = edge.stats();
    let req = api::JoinRequest {
        name: edge.node().to_string(),
        url: spec.url,
        secret: spec.secret,
        backends: edge.backends(),
        labels: spec.labels,
        pool: spec.pool,
        capacity: api::NodeCapacity {
            cpu_cores: stats.capacity.cpu_cores,
            memory_mb: stats.capacity.memory_mb,
            max_sandboxes: stats.capacity.sandboxes,
        },
    };
    let client =
        Client::with_ca(spec.apiserver, Some(spec.token), spec.cluster_ca).with_context(|| format!("apiserver URL {}", spec.apiserver))?;
    let body = serde_json::to_vec(&req)?;
    let deadline = Instant::now() + JOIN_PATIENCE;
    loop {
        match client.raw(Method::POST, "/v1/cluster/join", Some(body.clone()), "application/json").await {
            Ok((_, bytes)) => return serde_json::from_slice(&bytes).context("the apiserver's answer to the join"),
            Err(e @ ClientError::Connect { .. }) | Err(e @ ClientError::Api { status: 503, .. }) if Instant::now() < deadline => {
                tracing::warn!(error = %e, "joining: the apiserver is not answering yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(anyhow::Error::new(e).context(format!("joining the cluster at {}", spec.apiserver))),
        }
    }
}
