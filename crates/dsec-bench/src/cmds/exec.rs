//! Benchmark 3 (compiled side): the round trip of `true`.
//!
//! Sequential: N execs of argv ["true"] in one sandbox through the compiled
//! client, and N `crun exec ID true` in one container, interleaved in
//! blocks. Closed loop: C workers, each with its own sandbox, exec as fast as
//! they can for a few seconds (server capacity through the compiled client;
//! bench/exec_rtt.sh adds wrk and the Python SDK).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use super::*;
use crate::host::CpuMark;
use crate::stats::{f, ms, print_table, summarize};
use crate::{Common, CrunOpts};

#[derive(Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub crun: CrunOpts,
    #[arg(long, default_value_t = 2000)]
    pub iterations: usize,
    /// crun exec iterations (each spawns crun: slower).
    #[arg(long, default_value_t = 500)]
    pub crun_iterations: usize,
    /// Closed-loop concurrencies for the capacity runs (0 to skip).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub concurrency: Vec<usize>,
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
}

pub async fn run(a: ExecArgs) -> anyhow::Result<()> {
    let cl = client(&a.common)?;
    cl.health().await.context("the platform does not answer")?;
    let crun = crun_setup(&a.common, &a.crun).await?;
    let req = create_request(&a.common);
    let ex = exec_true();
    let mut created: Vec<String> = Vec::new();
    let result = async {
        let sb = cl.create(&req).await?;
        created.push(sb.id.clone());
        if let Some(cr) = &crun {
            cr.create("rtt").await?;
        }
        // Warm-up both, then interleave blocks of 100.
        for _ in 0..50 {
            dsec_exec_true(&cl, &sb.id, &ex).await?;
        }
        if let Some(cr) = &crun {
            for _ in 0..10 {
                cr.exec("rtt", &["true"]).await?;
            }
        }
        let (mut d, mut c) = (Vec::with_capacity(a.iterations), Vec::with_capacity(a.crun_iterations));
        while d.len() < a.iterations || (crun.is_some() && c.len() < a.crun_iterations) {
            for _ in 0..100 {
                if d.len() < a.iterations {
                    let t0 = Instant::now();
                    dsec_exec_true(&cl, &sb.id, &ex).await?;
                    d.push(ms(t0.elapsed()));
                }
            }
            if let Some(cr) = &crun {
                for _ in 0..25 {
                    if c.len() < a.crun_iterations {
                        c.push(ms(cr.exec("rtt", &["true"]).await?));
                    }
                }
            }
        }
        // Closed loop, one sandbox per worker.
        let mut loops = Vec::new();
        for &conc in a.concurrency.iter().filter(|c| **c > 0) {
            while created.len() < conc {
                created.push(cl.create(&req).await?.id);
            }
            let ids: Arc<Vec<String>> = Arc::new(created[..conc].to_vec());
            let stop = Arc::new(AtomicBool::new(false));
            let count = Arc::new(AtomicUsize::new(0));
            let errors = Arc::new(AtomicUsize::new(0));
            let lats = Arc::new(Mutex::new(Vec::new()));
            let m0 = CpuMark::now(a.common.dsec_pid);
            let mut tasks = Vec::new();
            for w in 0..conc {
                let (cl, ids, stop, count, errors, lats, ex) =
                    (cl.clone(), ids.clone(), stop.clone(), count.clone(), errors.clone(), lats.clone(), ex.clone());
                tasks.push(tokio::spawn(async move {
                    let mut mine = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let t0 = Instant::now();
                        match dsec_exec_true(&cl, &ids[w], &ex).await {
                            Ok(()) => {
                                mine.push(ms(t0.elapsed()));
                                count.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    lats.lock().unwrap().extend(mine);
                }));
            }
            tokio::time::sleep(Duration::from_secs_f64(a.seconds)).await;
            stop.store(true, Ordering::Relaxed);
            for t in tasks {
                let _ = t.await;
            }
            let m1 = CpuMark::now(a.common.dsec_pid);
            let n = count.load(Ordering::Relaxed);
            let cpu = m0.per_op(&m1, n);
            loops.push(json!({
                "concurrency": conc,
                "requests": n,
                "errors": errors.load(Ordering::Relaxed),
                "req_per_s": n as f64 / (cpu.wall_ms / 1000.0),
                "latency_ms": summarize(&lats.lock().unwrap()),
                "cpu": cpu,
            }));
        }
        anyhow::Ok((d, c, loops))
    }
    .await;
    for id in &created {
        let _ = cl.delete(id).await;
    }
    if let Some(cr) = &crun {
        cr.teardown().await;
    }
    let (d, c, loops) = result?;

    let mut out = json!({
        "benchmark": "exec_rtt",
        "environment": environment(&a.common, crun.is_some()),
        "compiled_client": {"sequential_ms": summarize(&d), "samples": round3(&d)},
        "closed_loop": loops,
    });
    let mut rows = vec![{
        let s = summarize(&d);
        vec!["dsec, compiled client".into(), f(s.p50_ms, 3), f(s.p90_ms, 3), f(s.p99_ms, 3), s.n.to_string()]
    }];
    if crun.is_some() {
        out["crun_exec"] = json!({"sequential_ms": summarize(&c), "samples": round3(&c)});
        out["ratio_p50"] = json!(summarize(&c).p50_ms / summarize(&d).p50_ms);
        let s = summarize(&c);
        rows.push(vec!["crun exec".into(), f(s.p50_ms, 3), f(s.p90_ms, 3), f(s.p99_ms, 3), s.n.to_string()]);
    }
    write_out(a.common.out.as_deref(), &out)?;
    print_table("exec round trip of `true`, sequential (ms)", &["", "p50", "p90", "p99", "n"], &rows);
    let rows: Vec<Vec<String>> = loops
        .iter()
        .map(|l| {
            vec![
                l["concurrency"].to_string(),
                f(l["req_per_s"].as_f64().unwrap_or(f64::NAN), 0),
                f(l["latency_ms"]["p50_ms"].as_f64().unwrap_or(f64::NAN), 2),
                f(l["latency_ms"]["p99_ms"].as_f64().unwrap_or(f64::NAN), 2),
                f(l["cpu"]["server_cpu_ms_per_op"].as_f64().unwrap_or(f64::NAN), 3),
                f(l["cpu"]["host_busy_cores"].as_f64().unwrap_or(f64::NAN), 2),
                l["errors"].to_string(),
            ]
        })
        .collect();
    print_table(
        "exec capacity, compiled client, closed loop (one sandbox per worker)",
        &["C", "req/s", "p50 ms", "p99 ms", "server cpu ms/req", "busy cores", "errors"],
        &rows,
    );
    Ok(())
}
