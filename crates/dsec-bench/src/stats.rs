//! Latency summaries (nearest-rank percentiles) and small table printing.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub n: usize,
    pub min_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// Nearest-rank percentile of an ascending slice.
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(v: &[f64]) -> Summary {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    let mean = if n == 0 { f64::NAN } else { s.iter().sum::<f64>() / n as f64 };
    Summary {
        n,
        min_ms: s.first().copied().unwrap_or(f64::NAN),
        p50_ms: pct(&s, 50.0),
        p90_ms: pct(&s, 90.0),
        p99_ms: pct(&s, 99.0),
        max_ms: s.last().copied().unwrap_or(f64::NAN),
        mean_ms: mean,
    }
}

/// Milliseconds, rounded for JSON.
pub fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

pub fn median(v: &[f64]) -> f64 {
    summarize(v).p50_ms
}

/// Prints rows of cells as an aligned plain-text table.
pub fn print_table(title: &str, header: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    println!("\n{title}");
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:>width$}", width = w[i])).collect();
        println!("  {}", s.join("  "));
    };
    line(header.iter().map(|h| h.to_string()).collect());
    line(w.iter().map(|n| "-".repeat(*n)).collect());
    for r in rows {
        line(r.clone());
    }
}

/// Prints label/value pairs, labels right-aligned, values as they are.
pub fn print_kv(title: &str, rows: &[(String, String)]) {
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    println!("\n{title}");
    for (k, v) in rows {
        println!("  {k:>w$}  {v}");
    }
}

pub fn f(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "-".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        let s = summarize(&v);
        assert_eq!(s.p50_ms, 50.0);
        assert_eq!(s.p99_ms, 99.0);
        assert_eq!(s.max_ms, 100.0);
        assert_eq!(pct(&[3.0], 99.0), 3.0);
    }
}
