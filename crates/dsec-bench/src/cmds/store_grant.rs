//! The token check of every API request, on each engine of the shared
//! store: `Store::grant` (SQLite: the in-memory index; PostgreSQL: one
//! indexed query over the pool), sequential latency, then the rate of C
//! concurrent callers in a closed loop.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use dsec_store::{AnyStore, Database, NewToken, Principal, Store, TokenHash};
use serde_json::json;

use crate::stats::{f, pct, print_table};

#[derive(Args, Debug)]
pub struct StoreGrantArgs {
    /// `sqlite:PATH` or `postgres://...`, empty (the benchmark adds its
    /// principals and tokens).
    #[arg(long)]
    pub database: String,
    /// Principals, one token each.
    #[arg(long, default_value_t = 1000)]
    pub tokens: usize,
    #[arg(long, default_value_t = 20000)]
    pub iterations: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub concurrency: Vec<usize>,
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    #[arg(long)]
    pub out: Option<PathBuf>,
}

fn token_hash(i: usize) -> TokenHash {
    let mut h = [0x5a; 32];
    h[..8].copy_from_slice(&(i as u64).to_le_bytes());
    h
}

const NOW_MS: u64 = 1_700_000_000_000;

pub async fn run(a: StoreGrantArgs) -> anyhow::Result<()> {
    let db = Database::parse(&a.database)?;
    let store = Arc::new(AnyStore::open(&db).await.with_context(|| format!("opening {db}"))?);
    for i in 0..a.tokens {
        let p = Principal::tenant(&format!("bench-{i}"), false, NOW_MS);
        store.create_principal(&p, Some(NewToken { hash: token_hash(i), created_at_ms: NOW_MS, expires_at_ms: None })).await?;
    }
    let n = a.tokens.max(1);

    let mut us = Vec::with_capacity(a.iterations);
    for k in 0..a.iterations {
        let started = Instant::now();
        let g = store.grant(&token_hash(k % n), NOW_MS).await?;
        us.push(started.elapsed().as_secs_f64() * 1e6);
        anyhow::ensure!(g.is_some(), "token {k} not granted");
    }
    us.sort_by(|x, y| x.total_cmp(y));
    let (p50, p99) = (pct(&us, 50.0), pct(&us, 99.0));

    let mut rates = Vec::new();
    for &c in a.concurrency.iter().filter(|&&c| c > 0) {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..c)
            .map(|w| {
                let (store, stop, done) = (store.clone(), stop.clone(), done.clone());
                tokio::spawn(async move {
                    let mut k = w;
                    while !stop.load(Ordering::Relaxed) {
                        store.grant(&token_hash(k % n), NOW_MS).await?;
                        done.fetch_add(1, Ordering::Relaxed);
                        k += c;
                        // SQLite's grant never waits: yield now and then,
                        // or spinning callers starve the timer.
                        if k % (64 * c) < c {
                            tokio::task::yield_now().await;
                        }
                    }
                    anyhow::Ok(())
                })
            })
            .collect();
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(a.seconds)).await;
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.await??;
        }
        rates.push((c, done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()));
    }

    let engine = match db {
        Database::Sqlite(_) => "sqlite",
        Database::Postgres(_) => "postgres",
    };
    let mut rows = vec![vec!["sequential".to_string(), format!("p50 {} us / p99 {} us", f(p50, 2), f(p99, 2))]];
    rows.extend(rates.iter().map(|(c, r)| vec![format!("{c} callers"), format!("{} grants/s", f(*r, 0))]));
    print_table(&format!("Store::grant on {engine}, {} tokens", a.tokens), &["figure", "value"], &rows);
    let v = json!({
        "engine": engine,
        "tokens": a.tokens,
        "iterations": a.iterations,
        "sequential_us": {"p50": p50, "p99": p99, "max": us.last().copied().unwrap_or(f64::NAN)},
        "closed_loop": rates.iter().map(|(c, r)| json!({"callers": c, "grants_per_s": r})).collect::<Vec<_>>(),
        "loadavg_at_end": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    });
    super::write_out(a.out.as_deref(), &v)
}
