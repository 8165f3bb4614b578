//! Issue 7: the cost of the system-call filter (seccomp with audited
//! refusals + no_new_privs), side by side. Two platforms run at once, one
//! started with `--no-syscall-filter`; each iteration creates a sandbox on
//! both (alternating which goes first), runs `true` a few times and one
//! system-call-heavy command in each, and deletes them. Every other layer
//! (namespaces, cgroups, masks, capabilities) is on for both.

use std::time::Instant;

use clap::Args;
use dsec_api as api;
use dsec_client::Client;
use serde_json::json;

use super::*;
use crate::stats::{f, ms, print_table, summarize};
use crate::Common;

#[derive(Args, Debug)]
pub struct PolicyArgs {
    /// The platform with the filter is --endpoint/--token.
    #[command(flatten)]
    pub common: Common,
    /// The platform started with `--no-syscall-filter`.
    #[arg(long)]
    pub off_endpoint: String,
    #[arg(long)]
    pub off_token: Option<String>,
    #[arg(long, default_value_t = 200)]
    pub iterations: usize,
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
    /// Execs of `true` per sandbox.
    #[arg(long, default_value_t = 5)]
    pub execs: usize,
}

#[derive(Default)]
struct Series {
    create: Vec<f64>,
    server_create: Vec<f64>,
    exec: Vec<f64>,
    /// `dd bs=1 count=100000`: 200,000 system calls through the filter.
    syscalls: Vec<f64>,
}

/// 100,000 one-byte reads and writes: every one passes the filter.
fn syscall_heavy() -> api::ExecRequest {
    api::ExecRequest {
        argv: Some(["dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=100000"].map(String::from).to_vec()),
        ..Default::default()
    }
}

async fn one(cl: &Client, req: &api::CreateSandboxRequest, execs: usize, s: &mut Series, keep: bool) -> anyhow::Result<()> {
    let ex = exec_true();
    let heavy = syscall_heavy();
    let t0 = Instant::now();
    let sb = cl.create(req).await?;
    let create = ms(t0.elapsed());
    let mut exec = Vec::with_capacity(execs);
    for _ in 0..execs {
        let t = Instant::now();
        dsec_exec_true(cl, &sb.id, &ex).await?;
        exec.push(ms(t.elapsed()));
    }
    let t = Instant::now();
    let r = cl.exec(&sb.id, &heavy).await?;
    let heavy_ms = ms(t.elapsed());
    cl.delete(&sb.id).await?;
    anyhow::ensure!(r.exit_code == 0, "dd in {}: exit {} ({})", sb.id, r.exit_code, r.stderr.trim());
    if keep {
        s.create.push(create);
        s.server_create.push(sb.create_ms.unwrap_or(f64::NAN));
        s.exec.extend(exec);
        s.syscalls.push(heavy_ms);
    }
    Ok(())
}

pub async fn run(a: PolicyArgs) -> anyhow::Result<()> {
    let on = client(&a.common)?;
    let off = Client::new(&a.off_endpoint, a.off_token.as_deref())?;
    on.health().await.context("the platform with the filter does not answer")?;
    off.health().await.context("the platform without the filter does not answer")?;
    let req = create_request(&a.common);
    let (mut s_on, mut s_off) = (Series::default(), Series::default());
    for i in 0..(a.warmup + a.iterations) {
        let keep = i >= a.warmup;
        if i % 2 == 0 {
            one(&on, &req, a.execs, &mut s_on, keep).await?;
            one(&off, &req, a.execs, &mut s_off, keep).await?;
        } else {
            one(&off, &req, a.execs, &mut s_off, keep).await?;
            one(&on, &req, a.execs, &mut s_on, keep).await?;
        }
    }
    let rows: Vec<(&str, &Vec<f64>, &Vec<f64>)> = vec![
        ("create (client)", &s_on.create, &s_off.create),
        ("create (server create_ms)", &s_on.server_create, &s_off.server_create),
        ("exec true", &s_on.exec, &s_off.exec),
        ("exec dd, 200k syscalls", &s_on.syscalls, &s_off.syscalls),
    ];
    let mut table = Vec::new();
    let mut out = serde_json::Map::new();
    for (name, v_on, v_off) in &rows {
        let (x, y) = (summarize(v_on), summarize(v_off));
        table.push(vec![
            name.to_string(),
            format!("{} / {}", f(x.p50_ms, 2), f(x.p99_ms, 2)),
            format!("{} / {}", f(y.p50_ms, 2), f(y.p99_ms, 2)),
            format!("{}x", f(x.p50_ms / y.p50_ms, 3)),
        ]);
        out.insert(name.to_string(), json!({"filter": x, "no_filter": y, "ratio_p50": x.p50_ms / y.p50_ms}));
    }
    print_table(
        &format!("system-call filter on vs off, {} iterations, p50 / p99 ms", a.iterations),
        &["measure", "filter on", "filter off", "on / off p50"],
        &table,
    );
    let doc = json!({
        "benchmark": "policy_cost",
        "environment": environment(&a.common, false),
        "iterations": a.iterations,
        "execs_per_sandbox": a.execs,
        "results": out,
    });
    write_out(a.common.out.as_deref(), &doc)
}
