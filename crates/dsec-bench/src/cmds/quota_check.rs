//! The authorization and quota check a creation makes, at a project tree
//! depth (default 8): the token's grant (SQLite: the in-memory index) and
//! the ledger's reserve in the project and every ancestor, each with a
//! quota, then its release; beside the grant alone, alternating in one run
//! so both see the same host.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use dsec_apiserver::auth::TokenStore;
use dsec_apiserver::quota::Held;
use dsec_store::{Database, NewToken, Principal, Quota, Role, Store};
use serde_json::json;

use crate::stats::{f, pct, print_table};

#[derive(Args, Debug)]
pub struct QuotaCheckArgs {
    /// Depth of the project the token belongs to (each level has a quota).
    #[arg(long, default_value_t = 8)]
    pub depth: usize,
    #[arg(long, default_value_t = 200_000)]
    pub iterations: usize,
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub async fn run(a: QuotaCheckArgs) -> anyhow::Result<()> {
    anyhow::ensure!((1..=16).contains(&a.depth), "--depth must be 1-16");
    let dir = tempfile::tempdir()?;
    let tokens = TokenStore::open(&Database::Sqlite(dir.path().join("api.db")), &dir.path().join("admin-token")).await?;
    let store = tokens.store();
    let quota = Quota {
        sandboxes: Some(1 << 40),
        cpu_millis: Some(1 << 50),
        memory_mb: Some(1 << 50),
        disk_mb: Some(1 << 50),
        creations_per_s: Some(1 << 40),
        fncall_per_s: None,
        overcommit: false,
    };
    let mut path = String::new();
    for level in 0..a.depth {
        if level > 0 {
            path.push('/');
        }
        path.push_str(&format!("p{level}"));
        store.create_principal(&Principal::project(&path, 0), None).await?;
        store.set_quota(&path, Some(quota)).await?;
        tokens.ledger().set_limits(&path, Some(quota));
    }
    let secret = "dsec_bench_quota_check";
    // The store keys tokens by their SHA-256, as a request's lookup does.
    let hash = sha256(secret);
    store.issue_token(&path, NewToken { hash, created_at_ms: 0, expires_at_ms: None }, Role::Solver, None).await?;
    let demand = Held::sandbox(1.0, 512, 1024);

    let (mut grant_us, mut quota_us) = (Vec::with_capacity(a.iterations), Vec::with_capacity(a.iterations));
    for _ in 0..a.iterations {
        let t = Instant::now();
        let g = tokens.grant(secret).await?;
        grant_us.push(t.elapsed().as_secs_f64() * 1e6);
        anyhow::ensure!(g.is_some());

        let t = Instant::now();
        let (g, _) = tokens.grant(secret).await?.expect("granted");
        let r = tokens.ledger().reserve(&g.principal.name, demand, Instant::now())?;
        tokens.ledger().release(r);
        quota_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    grant_us.sort_by(|x, y| x.total_cmp(y));
    quota_us.sort_by(|x, y| x.total_cmp(y));
    let row =
        |name: &str, v: &[f64]| vec![name.to_string(), f(pct(v, 50.0), 2), f(pct(v, 99.0), 2), f(v.last().copied().unwrap_or(0.0), 1)];
    print_table(
        &format!("authorization per creation, depth {}", a.depth),
        &["check", "p50 us", "p99 us", "max us"],
        &[row("grant only", &grant_us), row("grant + quota", &quota_us)],
    );
    let v = json!({
        "depth": a.depth,
        "iterations": a.iterations,
        "grant_only_us": {"p50": pct(&grant_us, 50.0), "p99": pct(&grant_us, 99.0)},
        "grant_and_quota_us": {"p50": pct(&quota_us, 50.0), "p99": pct(&quota_us, 99.0)},
        "loadavg_at_end": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    });
    super::write_out(a.out.as_deref(), &v)
}

fn sha256(s: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(s.as_bytes()).into()
}
