//! Benchmark 2: sustained creation rate with 8 to 32 concurrent creators.
//!
//! For each concurrency C and each side (alternating which goes first):
//!   burst   create N sandboxes (nothing deleted meanwhile): N / wall time
//!   delete  delete those N with C workers
//!   cycles  M create+delete cycles with C workers: M / wall time (the rate
//!           a node can sustain without growing)
//! CPU time of the server, the generator, crun processes and the whole host
//! is recorded per operation.

use std::sync::Arc;

use clap::Args;
use serde_json::{json, Value};

use super::*;
use crate::host::CpuMark;
use crate::runner::{progress, run as run_load, RunOutput};
use crate::stats::{f, print_table, summarize};
use crate::{Common, CrunOpts};

#[derive(Args, Debug)]
pub struct ThroughputArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub crun: CrunOpts,
    /// Concurrent creators, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32")]
    pub concurrency: Vec<usize>,
    /// Sandboxes per creation burst.
    #[arg(long, default_value_t = 1000)]
    pub burst: usize,
    /// Create+delete cycles per concurrency.
    #[arg(long, default_value_t = 1000)]
    pub cycles: usize,
}

fn phase<T>(o: &RunOutput<T>, before: &CpuMark, after: &CpuMark) -> Value {
    let errs = o.errors();
    json!({
        "ops": o.done.len(),
        "ok": o.done.len() - errs.len(),
        "errors": errs.len(),
        "first_errors": errs.iter().take(3).collect::<Vec<_>>(),
        "wall_s": o.wall.as_secs_f64(),
        "rate_per_s": o.rate(),
        "latency_ms": summarize(&o.latencies()),
        "cpu": before.per_op(after, o.done.len()),
    })
}

pub async fn run(a: ThroughputArgs) -> anyhow::Result<()> {
    let cl = client(&a.common)?;
    cl.health().await.context("the platform does not answer")?;
    let crun = crun_setup(&a.common, &a.crun).await?;
    let result = measure(&a, crun.clone()).await;
    if let Some(cr) = &crun {
        cr.teardown().await;
    }
    let levels = result?;
    let out = json!({
        "benchmark": "throughput",
        "environment": environment(&a.common, crun.is_some()),
        "burst": a.burst,
        "cycles": a.cycles,
        "levels": levels,
    });
    write_out(a.common.out.as_deref(), &out)?;

    let mut rows = Vec::new();
    for l in &levels {
        for side in ["dsec", "crun"] {
            let Some(s) = l.get(side) else { continue };
            let g = |p: &str, k: &str| s[p][k].as_f64().unwrap_or(f64::NAN);
            let lat = |p: &str, k: &str| s[p]["latency_ms"][k].as_f64().unwrap_or(f64::NAN);
            rows.push(vec![
                l["concurrency"].to_string(),
                side.to_string(),
                f(g("burst", "rate_per_s"), 0),
                f(lat("burst", "p50_ms"), 1),
                f(lat("burst", "p99_ms"), 1),
                f(g("delete", "rate_per_s"), 0),
                f(g("cycles", "rate_per_s"), 0),
                f(lat("cycles", "p50_ms"), 1),
                f(s["burst"]["cpu"]["host_busy_cpu_ms_per_op"].as_f64().unwrap_or(f64::NAN), 2),
                (s["burst"]["errors"].as_u64().unwrap_or(0) + s["cycles"]["errors"].as_u64().unwrap_or(0)).to_string(),
            ]);
        }
    }
    print_table(
        &format!("creation throughput (burst of {}, {} create+delete cycles)", a.burst, a.cycles),
        &["C", "side", "create/s", "p50 ms", "p99 ms", "delete/s", "cycles/s", "cyc p50", "cpu ms/create", "errors"],
        &rows,
    );
    Ok(())
}

async fn measure(a: &ThroughputArgs, crun: Option<Arc<Crun>>) -> anyhow::Result<Vec<Value>> {
    let req = Arc::new(create_request(&a.common));
    let pid = a.common.dsec_pid;
    // Several endpoints (replicas): creation i goes through replica i mod n.
    let replicas = Arc::new(client_per_endpoint(&a.common)?);
    let mut levels = Vec::new();
    for (li, &conc) in a.concurrency.iter().enumerate() {
        let mut level = json!({"concurrency": conc});
        let order: [bool; 2] = if li % 2 == 0 { [true, false] } else { [false, true] };
        for is_dsec in order {
            if is_dsec {
                // Burst of creations.
                let (c1, r1) = (replicas.clone(), req.clone());
                let m0 = CpuMark::now(pid);
                let burst = run_load(a.burst, conc, progress(a.burst, &format!("dsec c={conc}"), a.common.progress), move |i| {
                    let (c, r) = (c1[i % c1.len()].clone(), r1.clone());
                    async move { Ok(c.create(&r).await?.id) }
                })
                .await;
                let m1 = CpuMark::now(pid);
                let ids: Arc<Vec<String>> = Arc::new(burst.ok().map(|(_, id)| id.clone()).collect());
                let c2 = replicas.clone();
                let ids2 = ids.clone();
                let del = run_load(ids.len(), conc, progress(ids.len(), "dsec delete", a.common.progress), move |i| {
                    let (c, ids) = (c2[i % c2.len()].clone(), ids2.clone());
                    async move { Ok(c.delete(&ids[i]).await?) }
                })
                .await;
                let m2 = CpuMark::now(pid);
                let (c3, r3) = (replicas.clone(), req.clone());
                let cycles = run_load(a.cycles, conc, progress(a.cycles, "dsec cycles", a.common.progress), move |i| {
                    let (c, r) = (c3[i % c3.len()].clone(), r3.clone());
                    async move {
                        let id = c.create(&r).await?.id;
                        c.delete(&id).await?;
                        Ok(())
                    }
                })
                .await;
                let m3 = CpuMark::now(pid);
                level["dsec"] = json!({
                    "burst": phase(&burst, &m0, &m1),
                    "delete": phase(&del, &m1, &m2),
                    "cycles": phase(&cycles, &m2, &m3),
                });
            } else if let Some(cr) = &crun {
                let cr1 = cr.clone();
                let m0 = CpuMark::now(pid);
                let burst = run_load(a.burst, conc, progress(a.burst, &format!("crun c={conc}"), a.common.progress), move |i| {
                    let cr = cr1.clone();
                    async move {
                        let id = format!("b{conc}-{i}");
                        cr.create(&id).await?;
                        Ok(id)
                    }
                })
                .await;
                let m1 = CpuMark::now(pid);
                let ids: Arc<Vec<String>> = Arc::new(burst.ok().map(|(_, id)| id.clone()).collect());
                let (cr2, ids2) = (cr.clone(), ids.clone());
                let del = run_load(ids.len(), conc, progress(ids.len(), "crun delete", a.common.progress), move |i| {
                    let (cr, ids) = (cr2.clone(), ids2.clone());
                    async move { cr.delete(&ids[i]).await.map(|_| ()) }
                })
                .await;
                let m2 = CpuMark::now(pid);
                let cr3 = cr.clone();
                let cycles = run_load(a.cycles, conc, progress(a.cycles, "crun cycles", a.common.progress), move |i| {
                    let cr = cr3.clone();
                    async move {
                        let id = format!("y{conc}-{i}");
                        let r = cr.create(&id).await;
                        let d = cr.delete(&id).await;
                        r?;
                        d.map(|_| ())
                    }
                })
                .await;
                let m3 = CpuMark::now(pid);
                level["crun"] = json!({
                    "burst": phase(&burst, &m0, &m1),
                    "delete": phase(&del, &m1, &m2),
                    "cycles": phase(&cycles, &m2, &m3),
                });
            }
        }
        if level.get("crun").is_some() {
            let r = |p: &str| {
                level["dsec"][p]["rate_per_s"].as_f64().unwrap_or(0.0) / level["crun"][p]["rate_per_s"].as_f64().unwrap_or(f64::NAN)
            };
            let (rb, rc) = (r("burst"), r("cycles"));
            level["ratio_burst"] = json!(rb);
            level["ratio_cycles"] = json!(rc);
        }
        levels.push(level);
    }
    Ok(levels)
}
