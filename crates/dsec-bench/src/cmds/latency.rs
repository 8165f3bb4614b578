//! Benchmark 1: create -> first exec answered.
//!
//! dsec: POST /v1/sandboxes, then POST .../exec {"argv": ["true"]}, timed
//! until the exec answer is in; `create_ms` of the returned record is the
//! server's own create time. crun: tmpfs + overlay + config.json, `crun run
//! -d`, `crun exec ID true`. One at a time, alternating which side goes
//! first, each sandbox/container deleted (timed separately) before the next
//! iteration, so both sides see the same machine state and noise.

use std::time::Instant;

use clap::Args;
use serde_json::json;

use super::*;
use crate::stats::{f, ms, print_table, summarize};
use crate::{Common, CrunOpts};

#[derive(Args, Debug)]
pub struct LatencyArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub crun: CrunOpts,
    #[arg(long, default_value_t = 300)]
    pub iterations: usize,
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
}

#[derive(Default)]
struct Series {
    total: Vec<f64>,
    create: Vec<f64>,
    exec: Vec<f64>,
    server_create: Vec<f64>,
    prep: Vec<f64>,
    delete: Vec<f64>,
}

pub async fn run(a: LatencyArgs) -> anyhow::Result<()> {
    let cl = client(&a.common)?;
    cl.health().await.context("the platform does not answer")?;
    let crun = crun_setup(&a.common, &a.crun).await?;
    let req = create_request(&a.common);
    let ex = exec_true();
    let (mut d, mut c) = (Series::default(), Series::default());
    let m0 = crate::host::CpuMark::now(a.common.dsec_pid);
    let result = async {
        for i in 0..(a.warmup + a.iterations) {
            let keep = i >= a.warmup;
            let dsec_first = i % 2 == 0;
            for side in 0..2 {
                let is_dsec = (side == 0) == dsec_first;
                if is_dsec {
                    let t0 = Instant::now();
                    let sb = cl.create(&req).await?;
                    let t1 = Instant::now();
                    dsec_exec_true(&cl, &sb.id, &ex).await?;
                    let t2 = Instant::now();
                    cl.delete(&sb.id).await?;
                    let t3 = Instant::now();
                    if keep {
                        d.total.push(ms(t2 - t0));
                        d.create.push(ms(t1 - t0));
                        d.exec.push(ms(t2 - t1));
                        d.server_create.push(sb.create_ms.unwrap_or(f64::NAN));
                        d.delete.push(ms(t3 - t2));
                    }
                } else if let Some(cr) = &crun {
                    let id = format!("lat{i}");
                    let t0 = Instant::now();
                    let ct = cr.create(&id).await?;
                    let t1 = Instant::now();
                    cr.exec(&id, &["true"]).await?;
                    let t2 = Instant::now();
                    let del = cr.delete(&id).await?;
                    if keep {
                        c.total.push(ms(t2 - t0));
                        c.create.push(ms(t1 - t0));
                        c.exec.push(ms(t2 - t1));
                        c.prep.push(ms(ct.prep));
                        c.server_create.push(ms(ct.run));
                        c.delete.push(ms(del));
                    }
                }
            }
        }
        anyhow::Ok(())
    }
    .await;
    let m1 = crate::host::CpuMark::now(a.common.dsec_pid);
    if let Some(cr) = &crun {
        cr.teardown().await;
    }
    result?;
    let cpu = m0.per_op(&m1, 1);

    let sd = |s: &Series| {
        json!({
            "create_to_first_exec_ms": summarize(&s.total),
            "create_ms": summarize(&s.create),
            "first_exec_ms": summarize(&s.exec),
            "delete_ms": summarize(&s.delete),
            "samples": {"create_to_first_exec_ms": round3(&s.total), "create_ms": round3(&s.create), "first_exec_ms": round3(&s.exec)},
        })
    };
    let mut dsec = sd(&d);
    dsec["server_create_ms"] = json!(summarize(&d.server_create));
    dsec["samples"]["server_create_ms"] = json!(round3(&d.server_create));
    let mut out = json!({
        "benchmark": "create_to_first_exec",
        "environment": environment(&a.common, crun.is_some()),
        "iterations": a.iterations,
        "warmup": a.warmup,
        "dsec": dsec,
        // Busy cores of the whole host during the run.
        "host_busy_cores": cpu.host_busy_cores,
    });
    if crun.is_some() {
        let mut cj = sd(&c);
        cj["prep_ms"] = json!(summarize(&c.prep));
        cj["crun_run_d_ms"] = json!(summarize(&c.server_create));
        let (dp, cp) = (summarize(&d.total), summarize(&c.total));
        out["crun"] = cj;
        out["ratio_p50"] = json!(cp.p50_ms / dp.p50_ms);
        out["ratio_p99"] = json!(cp.p99_ms / dp.p99_ms);
    }
    write_out(a.common.out.as_deref(), &out)?;

    let row = |name: &str, v: &[f64]| {
        let s = summarize(v);
        vec![name.to_string(), f(s.p50_ms, 2), f(s.p90_ms, 2), f(s.p99_ms, 2), f(s.max_ms, 2), s.n.to_string()]
    };
    let mut rows = vec![
        row("dsec create->exec answered", &d.total),
        row("  dsec create (client)", &d.create),
        row("  dsec create_ms (server)", &d.server_create),
        row("  dsec first exec", &d.exec),
        row("  dsec delete", &d.delete),
    ];
    if crun.is_some() {
        rows.extend([
            row("crun run -d + exec", &c.total),
            row("  overlay+config prep", &c.prep),
            row("  crun run -d", &c.server_create),
            row("  crun exec", &c.exec),
            row("  crun delete -f + umount", &c.delete),
        ]);
    }
    print_table("create -> first exec answered (ms)", &["", "p50", "p90", "p99", "max", "n"], &rows);
    if crun.is_some() {
        println!(
            "  ratio crun/dsec: p50 {:.2}x, p99 {:.2}x",
            summarize(&c.total).p50_ms / summarize(&d.total).p50_ms,
            summarize(&c.total).p99_ms / summarize(&d.total).p99_ms
        );
    }
    Ok(())
}
