//! The duration of every HTTP request the apiserver answers, by route
//! class (the route's template, `/v1/sandboxes/{id}/exec`: never the
//! concrete path, so sandbox ids do not become label values), method and
//! status class, for `/metrics`.
//!
//! The label set is bounded whatever clients send: unknown methods count
//! as `OTHER`, paths no route matches as `unmatched`. A WebSocket route's
//! duration is that of its upgrade answer, not of the stream.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use dsec_edge::histogram::{Histogram, HistogramSnapshot, REQUEST_BOUNDS};

use crate::state::AppState;

/// (route template, method, status class such as `2xx`).
pub type SeriesKey = (String, &'static str, &'static str);

#[derive(Default)]
pub struct HttpMetrics {
    series: RwLock<BTreeMap<SeriesKey, Arc<Histogram>>>,
}

impl HttpMetrics {
    pub fn observe(&self, key: SeriesKey, took: std::time::Duration) {
        let found = self.series.read().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
        let h = match found {
            Some(h) => h,
            None => self
                .series
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .entry(key)
                .or_insert_with(|| Arc::new(Histogram::new(REQUEST_BOUNDS)))
                .clone(),
        };
        h.observe(took);
    }

    /// Every series observed so far, in label order.
    pub fn snapshot(&self) -> Vec<(SeriesKey, HistogramSnapshot)> {
        self.series.read().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, h)| (k.clone(), h.snapshot())).collect()
    }
}

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// The middleware: times the request to its answer's head.
pub async fn observe(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_else(|| "unmatched".into());
    let method = method_label(req.method());
    let t0 = Instant::now();
    let resp = next.run(req).await;
    st.http_metrics.observe((route, method, status_class(resp.status().as_u16())), t0.elapsed());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn series_are_kept_per_route_method_and_class() {
        let m = HttpMetrics::default();
        m.observe(("/v1/sandboxes/{id}".into(), "GET", "2xx"), Duration::from_micros(50));
        m.observe(("/v1/sandboxes/{id}".into(), "GET", "2xx"), Duration::from_millis(2));
        m.observe(("unmatched".into(), "OTHER", "4xx"), Duration::from_micros(10));
        let s = m.snapshot();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].0, ("/v1/sandboxes/{id}".to_string(), "GET", "2xx"));
        assert_eq!(s[0].1.count(), 2);
        assert_eq!(s[1].1.count(), 1);
    }

    #[test]
    fn labels_stay_bounded() {
        assert_eq!(method_label(&Method::from_bytes(b"BREW").unwrap()), "OTHER");
        assert_eq!(status_class(101), "1xx");
        assert_eq!(status_class(503), "5xx");
        assert_eq!(status_class(404), "4xx");
    }
}
