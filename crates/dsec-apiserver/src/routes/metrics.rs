//! `GET /metrics`: the platform's counters and gauges in the Prometheus
//! text exposition format (version 0.0.4), for a scraper holding the admin
//! token (`Authorization: Bearer ...`).
//!
//! Every process serves its own: `dsec up` all of its node, an edge of a
//! cluster its node, an apiserver of a cluster the nodes as its watcher sees
//! them. Counters count from the process's start (a scraper handles resets).

use std::fmt::Write as _;

use axum::extract::State;
use axum::response::IntoResponse;
use dsec_edge::metrics::{EdgeMetrics, CREATE_MS_BUCKETS};

use crate::auth::Admin;
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
    out.histogram(
        "dsec_sandbox_create_seconds",
        "Time from accepted request to running sandbox.",
        node,
        &CREATE_MS_BUCKETS.map(|b| b as f64 / 1000.0),
        &c.create_ms_buckets,
        c.create_us_sum as f64 / 1e6,
    );
}

/// A text exposition being written: each family's HELP and TYPE once,
/// before its first sample.
#[derive(Default)]
struct Exposition {
    text: String,
    declared: std::collections::HashSet<&'static str>,
}

impl Exposition {
    fn declare(&mut self, name: &'static str, help: &str, kind: &str) {
        if self.declared.insert(name) {
            let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape(v));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    fn gauge(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.declare(name, help, "gauge");
        self.sample(name, labels, value);
    }

    fn counter(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.declare(name, help, "counter");
        self.sample(name, labels, value);
    }

    /// `counts` has one more entry than `bounds` (the overflow bucket) and
    /// is not cumulative; the exposition's buckets are.
    fn histogram(&mut self, name: &'static str, help: &str, node: &str, bounds: &[f64], counts: &[u64], sum: f64) {
        self.declare(name, help, "histogram");
        let mut cumulative = 0u64;
        let bucket = format!("{name}_bucket");
        for (i, count) in counts.iter().enumerate() {
            cumulative += count;
            let le = bounds.get(i).map(|b| b.to_string()).unwrap_or_else(|| "+Inf".into());
            self.sample(&bucket, &[("node", node), ("le", &le)], cumulative as f64);
        }
        self.sample(&format!("{name}_sum"), &[("node", node)], sum);
        self.sample(&format!("{name}_count"), &[("node", node)], cumulative as f64);
    }

    fn finish(self) -> String {
        self.text
    }
}

/// A label value as the format wants it: backslash, quote and newline
/// escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_declared_once_and_histograms_are_cumulative() {
        let mut e = Exposition::default();
        e.gauge("g", "A gauge.", &[("node", "a\"b")], 1.0);
        e.gauge("g", "A gauge.", &[("node", "c")], 2.5);
        e.histogram("h", "A histogram.", "a", &[0.001, 0.01], &[1, 2, 3], 0.5);
        let t = e.finish();
        assert_eq!(t.matches("# TYPE g gauge").count(), 1);
        assert!(t.contains("g{node=\"a\\\"b\"} 1\n"), "{t}");
        assert!(t.contains("g{node=\"c\"} 2.5\n"));
        assert!(t.contains("h_bucket{node=\"a\",le=\"0.001\"} 1\n"));
        assert!(t.contains("h_bucket{node=\"a\",le=\"0.01\"} 3\n"));
        assert!(t.contains("h_bucket{node=\"a\",le=\"+Inf\"} 6\n"));
        assert!(t.contains("h_count{node=\"a\"} 6\n") && t.contains("h_sum{node=\"a\"} 0.5\n"));
    }
}
