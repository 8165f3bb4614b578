//! Benchmark 5: M create/destroy cycles must leave nothing behind. Counts
//! processes, mounts, cgroups, namespaces, files and the dsec process's fds
//! before and after.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use super::*;
use crate::host::{self, CpuMark};
use crate::runner::{progress, run as run_load};
use crate::stats::{f, print_table, summarize};
use crate::Common;

#[derive(Args, Debug)]
pub struct ChurnArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, default_value_t = 10_000)]
    pub cycles: usize,
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Run `true` in each sandbox before deleting it.
    #[arg(long)]
    pub exec: bool,
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long)]
    pub node: Option<String>,
}

pub async fn run(a: ChurnArgs) -> anyhow::Result<()> {
    let pid = a.common.dsec_pid.context("churn needs --dsec-pid")?;
    let cl = client(&a.common)?;
    cl.health().await.context("the platform does not answer")?;
    // One sandbox first so every lazy, once-per-node resource (layer mounts,
    // the node's cgroup parents, database pages, and with an exec the
    // trajectory journal's files) exists before counting.
    let warm = cl.create(&create_request(&a.common)).await?;
    if a.exec {
        dsec_exec_true(&cl, &warm.id, &exec_true()).await?;
    }
    cl.delete(&warm.id).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let count = || host::counts(Some(pid), a.data_dir.as_deref(), a.node.as_deref());
    let before = count();

    let req = Arc::new(create_request(&a.common));
    let ex = Arc::new(exec_true());
    // The load runs on its own connection pool, closed before counting
    // again, so the API's keep-alive sockets do not show up as fds.
    let (c1, do_exec) = (client(&a.common)?, a.exec);
    let m0 = CpuMark::now(Some(pid));
    let out = run_load(a.cycles, a.concurrency, progress(a.cycles, "churn", true), move |_| {
        let (c, r, ex) = (c1.clone(), req.clone(), ex.clone());
        async move {
            let id = c.create(&r).await?.id;
            let e = if do_exec { dsec_exec_true(&c, &id, &ex).await } else { Ok(()) };
            c.delete(&id).await?;
            e
        }
    })
    .await;
    let m1 = CpuMark::now(Some(pid));
    let errors = out.errors();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Deletion returns once the sandbox is stopped and forgotten; let any
    // asynchronous kernel cleanup (namespaces) finish before counting.
    let t0 = Instant::now();
    let mut after = count();
    while t0.elapsed() < Duration::from_secs(30) && (after.own() != before.own() || after.net_namespaces > before.net_namespaces) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        after = count();
    }
    let settle_s = t0.elapsed().as_secs_f64();
    let remaining = cl.list(&[]).await.map(|l| l.sandboxes.len()).unwrap_or(usize::MAX);

    let b = serde_json::to_value(&before)?;
    let af = serde_json::to_value(&after)?;
    let keys: Vec<String> = b.as_object().unwrap().keys().cloned().collect();
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|k| {
            let (x, y) = (b[k].as_i64().unwrap_or(0), af[k].as_i64().unwrap_or(0));
            vec![k.clone(), x.to_string(), y.to_string(), format!("{:+}", y - x)]
        })
        .collect();
    let v = json!({
        "benchmark": "churn",
        "environment": environment(&a.common, false),
        "cycles": a.cycles,
        "concurrency": a.concurrency,
        "exec_each": a.exec,
        "ok": out.done.len() - errors.len(),
        "errors": errors.len(),
        "first_errors": errors.iter().take(5).collect::<Vec<_>>(),
        "wall_s": out.wall.as_secs_f64(),
        "cycles_per_s": out.rate(),
        "cycle_latency_ms": summarize(&out.latencies()),
        "cpu": m0.per_op(&m1, a.cycles),
        "settle_s": settle_s,
        "records_left": remaining,
        "before": before,
        "after": after,
    });
    write_out(a.common.out.as_deref(), &v)?;
    println!(
        "\n{} cycles at {} workers: {:.0} cycles/s, {} errors, cycle p50 {} ms; records left: {remaining}",
        a.cycles,
        a.concurrency,
        out.rate(),
        errors.len(),
        f(summarize(&out.latencies()).p50_ms, 2)
    );
    print_table("left behind (before -> after)", &["", "before", "after", "delta"], &rows);
    Ok(())
}
