//! `GET /metrics`: the platform's counters and gauges in the Prometheus
//! text exposition format (version 0.0.4), for a scraper holding the admin
//! token (`Authorization: Bearer ...`).
//!
//! Every process serves its own: `dsec up` all of its node, an edge of a
//! cluster its node, an apiserver of a cluster the nodes as its watcher sees
//! them. Counters count from the process's start (a scraper handles resets).

use axum::extract::State;
use axum::response::IntoResponse;
use dsec_edge::metrics::EdgeMetrics;

use crate::auth::Admin;
use crate::exposition::Exposition;
use crate::routes::fncall::FnCallBackend;
use crate::state::AppState;

/// Metrics of this process's nodes (Prometheus text format).
#[utoipa::path(get, path = "/metrics", tag = "admin",
    responses((status = 200, description = "Prometheus text exposition format 0.0.4", content_type = "text/plain"), (status = 401, body = dsec_api::ErrorBody), (status = 403, body = dsec_api::ErrorBody)))]
pub async fn metrics(State(st): State<AppState>, Admin(_admin): Admin) -> impl IntoResponse {
    let mut out = Exposition::default();
    for status in st.nodes.status() {
        let node = [("node", status.name.as_str())];
        out.gauge("dsec_node_healthy", "1 if the node answers its watcher.", &node, u64::from(status.healthy) as f64);
        out.gauge("dsec_node_cpu_reserved_cores", "CPU cores reserved by sandboxes.", &node, status.cpu_reserved);
        out.gauge("dsec_node_cpu_capacity_cores", "CPU cores sandboxes may reserve (with overcommit).", &node, status.cpu_capacity);
        out.gauge("dsec_node_memory_reserved_bytes", "Memory reserved by sandboxes.", &node, (status.memory_reserved_mb << 20) as f64);
        out.gauge(
            "dsec_node_memory_capacity_bytes",
            "Memory sandboxes may reserve (with overcommit).",
            &node,
            (status.memory_capacity_mb << 20) as f64,
        );
        out.gauge("dsec_node_creations_queued", "Creations waiting in the node's queue.", &node, status.queued as f64);
    }
    for edge in st.nodes.local_edges() {
        edge_metrics(&mut out, &edge.metrics());
    }
    if let Some(FnCallBackend::Local(svc)) = st.fncall.as_deref() {
        fncall_metrics(&mut out, svc);
    }
    let (placement, refusals) = st.nodes.placement_metrics();
    out.histogram("dsec_placement_seconds", "Time to choose a node for a creation (view read and choice).", &[], &placement);
    out.counter(
        "dsec_placement_refusals_total",
        "Chosen nodes that refused a creation (no room, unreachable, queue full), each followed by another choice.",
        &[],
        refusals as f64,
    );
    for ((route, method, class), h) in st.http_metrics.snapshot() {
        out.histogram(
            "dsec_http_request_duration_seconds",
            "Time from a request's arrival to its answer's head, by route template, method and status class.",
            &[("route", &route), ("method", method), ("code", class)],
            &h,
        );
    }
    ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], out.finish())
}

fn edge_metrics(out: &mut Exposition, m: &EdgeMetrics) {
    let node = m.stats.node.as_str();
    for ((state, backend), n) in &m.sandboxes {
        out.gauge(
            "dsec_sandboxes",
            "Sandboxes the node holds, by state and backend.",
            &[("node", node), ("state", state), ("backend", backend)],
            *n as f64,
        );
    }
    let c = &m.counters;
    let n = [("node", node)];
    out.counter("dsec_sandbox_creations_total", "Sandboxes created and running.", &n, c.creations as f64);
    out.counter("dsec_sandbox_creation_failures_total", "Creations refused or failed.", &n, c.creation_failures as f64);
    out.counter("dsec_execs_total", "Buffered commands run.", &n, c.execs as f64);
    out.counter("dsec_trajectory_steps_total", "Operations appended to trajectory logs.", &n, c.steps as f64);
    out.counter("dsec_pauses_total", "Sandboxes paused.", &n, c.pauses as f64);
    out.counter("dsec_resumes_total", "Sandboxes resumed.", &n, c.resumes as f64);
    for (kind, count) in &c.audit_events {
        out.counter(
            "dsec_audit_events_total",
            "Refused attempts recorded in sandboxes (blocked system calls, denied connections, opened masked paths, tampering), by kind.",
            &[("node", node), ("kind", kind)],
            *count as f64,
        );
    }
    for (backend, h) in &c.create_latency {
        out.histogram(
            "dsec_sandbox_create_seconds",
            "Time from accepted request to running sandbox, by backend.",
            &[("node", node), ("backend", backend)],
            h,
        );
    }
    out.histogram("dsec_exec_seconds", "Time a buffered command took, from the request to its agent to the answer.", &n, &c.exec_latency);
    if let Some(swap) = m.swap_pages {
        out.counter("dsec_node_swap_in_pages_total", "Pages the host swapped in since boot.", &n, swap.swapped_in as f64);
        out.counter("dsec_node_swap_out_pages_total", "Pages the host swapped out since boot.", &n, swap.swapped_out as f64);
    }
}

fn fncall_metrics(out: &mut Exposition, svc: &dsec_fncall::FnCallService) {
    let latency = svc.latency();
    for p in svc.status().pools {
        let l = [("language", p.language.as_str())];
        out.gauge("dsec_fncall_runners", "FnCall runners in the pool.", &l, p.runners as f64);
        out.gauge("dsec_fncall_runners_idle", "FnCall runners waiting for a call.", &l, p.idle as f64);
        out.gauge("dsec_fncall_calls_queued", "FnCall calls waiting for a runner.", &l, p.queued as f64);
        out.counter("dsec_fncall_calls_total", "FnCall calls served.", &l, p.calls as f64);
        out.counter(
            "dsec_fncall_runners_replaced_total",
            "FnCall runners retired after a call that did not end cleanly.",
            &l,
            p.runners_replaced as f64,
        );
    }
    for (language, h) in &latency {
        out.histogram(
            "dsec_fncall_call_seconds",
            "Time a FnCall call took, waiting for a runner included, by language.",
            &[("language", language)],
            h,
        );
    }
    let (entries, bytes, hits, misses) = svc.cache_stats();
    out.gauge("dsec_fncall_compile_cache_entries", "Compiled programs the compile cache holds.", &[], entries as f64);
    out.gauge("dsec_fncall_compile_cache_bytes", "Bytes the compile cache holds.", &[], bytes as f64);
    out.counter("dsec_fncall_compile_cache_hits_total", "Compilations answered from the compile cache.", &[], hits as f64);
    out.counter("dsec_fncall_compile_cache_misses_total", "Compilations the compile cache did not hold.", &[], misses as f64);
}
