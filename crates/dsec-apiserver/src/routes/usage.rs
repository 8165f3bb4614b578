//! Resource use over time: a sandbox's and a node's, one sample a second
//! for the last minutes (the edge's sampler, `dsec_edge::usage`).

use axum::extract::{Path, State};
use axum::Json;
use dsec_api::{self as api, ErrorCode};
use dsec_edge::{NodeUsage, SandboxUsage};

use crate::auth::{Admin, Auth};
use crate::convert::state_out;
use crate::error::{ApiError, ApiResult};
use crate::extract::QueryPairs;
use crate::nodes::NodeRef;
use crate::state::AppState;

/// A sandbox's CPU, memory, pids, disk and network use, second by second,
/// oldest first: the last `seconds` (default: all the node keeps, five
/// minutes unless configured otherwise). Reading it does not resume a
/// paused sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/metrics", tag = "sandboxes",
    params(("id" = String, Path), ("seconds" = Option<u64>, Query, description = "how many of the last seconds (at least 1)")),
    responses((status = 200, body = api::SandboxMetrics), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn sandbox(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    q: QueryPairs,
) -> ApiResult<Json<api::SandboxMetrics>> {
    let seconds = seconds_of(&q)?;
    Ok(Json(sandbox_out(st.nodes.owner(&id)?.usage(&caller, &id, seconds)?)))
}

/// A node's CPU, memory and swap use and its running sandboxes, second by
/// second, oldest first (admin only).
#[utoipa::path(get, path = "/v1/nodes/{node}/metrics", tag = "admin",
    params(("node" = String, Path), ("seconds" = Option<u64>, Query, description = "how many of the last seconds (at least 1)")),
    responses((status = 200, body = api::NodeMetrics), (status = 400, body = api::ErrorBody), (status = 403, body = api::ErrorBody), (status = 404, body = api::ErrorBody)))]
pub async fn node(
    State(st): State<AppState>,
    Admin(_admin): Admin,
    Path(node): Path<String>,
    q: QueryPairs,
) -> ApiResult<Json<api::NodeMetrics>> {
    let seconds = seconds_of(&q)?;
    match st.nodes.by_name(&node) {
        Some(NodeRef::Local(edge)) => Ok(Json(node_out(edge.node_usage(seconds)?))),
        // The proxy layer forwards a remote node's requests before they get
        // here.
        Some(NodeRef::Remote(r)) => Err(ApiError::new(ErrorCode::Internal, format!("node {} is remote", r.name))),
        None => Err(ApiError::new(ErrorCode::NotFound, format!("node {node} not found"))),
    }
}

fn seconds_of(q: &QueryPairs) -> ApiResult<Option<u64>> {
    q.get("seconds")
        .map(|s| s.parse::<u64>().map_err(|_| ApiError::invalid(format!("seconds={s:?} must be a positive integer"))))
        .transpose()
}

fn sandbox_out(u: SandboxUsage) -> api::SandboxMetrics {
    api::SandboxMetrics {
        sandbox_id: u.id,
        state: state_out(u.state),
        limits: api::Limits {
            memory_limit_mb: u.limits.memory_mb,
            cpu_cores_limit: u.limits.cpu_cores,
            disk_limit_mb: u.limits.disk_mb,
            pids_limit: u.limits.pids,
        },
        interval_ms: u.interval_ms,
        net_rx_bytes: u.net_rx_bytes,
        net_tx_bytes: u.net_tx_bytes,
        samples: u
            .samples
            .into_iter()
            .map(|s| api::MetricsSample {
                time_ms: s.time_ms,
                cpu_cores: s.cpu_cores,
                memory_bytes: s.memory_bytes,
                pids: s.pids,
                disk_bytes: s.disk_bytes,
                net_rx_bytes_per_s: s.net_rx_bytes_per_s,
                net_tx_bytes_per_s: s.net_tx_bytes_per_s,
            })
            .collect(),
    }
}

fn node_out(u: NodeUsage) -> api::NodeMetrics {
    api::NodeMetrics {
        node: u.node,
        interval_ms: u.interval_ms,
        cpus: u.cpus,
        memory_total_bytes: u.memory_total_bytes,
        samples: u
            .samples
            .into_iter()
            .map(|s| api::NodeMetricsSample {
                time_ms: s.time_ms,
                cpu_cores: s.cpu_cores,
                memory_bytes: s.memory_bytes,
                swap_bytes: s.swap_bytes,
                sandboxes: s.sandboxes,
            })
            .collect(),
    }
}
