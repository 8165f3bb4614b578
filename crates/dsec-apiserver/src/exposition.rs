//! The Prometheus text exposition format (version 0.0.4), written by hand:
//! `/metrics` reports snapshots the edges, FnCall and the HTTP layer take
//! of their own atomics, so a registry of live metric objects (what the
//! `prometheus` crates offer) would only be a second copy of them.

use std::collections::HashSet;
use std::fmt::Write as _;

use dsec_edge::histogram::HistogramSnapshot;

/// A text exposition being written: each family's HELP and TYPE once,
/// before its first sample.
#[derive(Default)]
pub(crate) struct Exposition {
    text: String,
    declared: HashSet<&'static str>,
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
        let _ = writeln!(self.text, " {}", number(value));
    }

    pub(crate) fn gauge(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.declare(name, help, "gauge");
        self.sample(name, labels, value);
    }

    pub(crate) fn counter(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.declare(name, help, "counter");
        self.sample(name, labels, value);
    }

    /// One labelled series of a histogram family: cumulative buckets (the
    /// snapshot's are not), `+Inf`, sum and count.
    pub(crate) fn histogram(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        self.declare(name, help, "histogram");
        let mut cumulative = 0u64;
        let bucket = format!("{name}_bucket");
        for (i, count) in h.counts.iter().enumerate() {
            cumulative += count;
            let le = h.bounds.get(i).map(|&b| number(b)).unwrap_or_else(|| "+Inf".into());
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", &le));
            self.sample(&bucket, &with_le, cumulative as f64);
        }
        self.sample(&format!("{name}_sum"), labels, h.sum_seconds);
        self.sample(&format!("{name}_count"), labels, cumulative as f64);
    }

    pub(crate) fn finish(self) -> String {
        self.text
    }
}

/// A sample value or bound as the format spells it (Go's float syntax:
/// `+Inf`, `-Inf`, `NaN`; Rust's shortest round-trip form otherwise).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        v.to_string()
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
        e.gauge("inf", "Unbounded.", &[], f64::INFINITY);
        let h = HistogramSnapshot { bounds: &[0.001, 0.01], counts: vec![1, 2, 3], sum_seconds: 0.5 };
        e.histogram("h", "A histogram.", &[("node", "a"), ("backend", "vm")], &h);
        let t = e.finish();
        assert_eq!(t.matches("# TYPE g gauge").count(), 1);
        assert!(t.contains("g{node=\"a\\\"b\"} 1\n"), "{t}");
        assert!(t.contains("g{node=\"c\"} 2.5\n"));
        assert!(t.contains("inf +Inf\n"));
        assert!(t.contains("h_bucket{node=\"a\",backend=\"vm\",le=\"0.001\"} 1\n"), "{t}");
        assert!(t.contains("h_bucket{node=\"a\",backend=\"vm\",le=\"0.01\"} 3\n"));
        assert!(t.contains("h_bucket{node=\"a\",backend=\"vm\",le=\"+Inf\"} 6\n"));
        assert!(t.contains("h_count{node=\"a\",backend=\"vm\"} 6\n") && t.contains("h_sum{node=\"a\",backend=\"vm\"} 0.5\n"));
    }
}
