//! Benchmark 4: density. N idle sandboxes at once: memory per sandbox (host
//! MemAvailable delta / N, with a breakdown) and creation time of the last
//! 100 against the first 100. The sandboxes are left running: the script
//! stops the platform (--stop-sandboxes-on-exit) and checks nothing is left.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use super::*;
use crate::host::{self, CpuMark};
use crate::runner::{progress, run as run_load};
use crate::stats::{f, median, print_kv, summarize};
use crate::Common;

#[derive(Args, Debug)]
pub struct DensityArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, default_value_t = 5000)]
    pub count: usize,
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// The platform's node name (for its memory cgroup totals).
    #[arg(long)]
    pub node: Option<String>,
    /// Seconds to let the node settle before each memory reading.
    #[arg(long, default_value_t = 5.0)]
    pub settle: f64,
    /// Seconds over which idle CPU use is measured with everything running.
    #[arg(long, default_value_t = 10.0)]
    pub idle_seconds: f64,
}

const KEYS: &[&str] = &[
    "MemAvailable",
    "MemFree",
    "Slab",
    "SUnreclaim",
    "SReclaimable",
    "KernelStack",
    "PageTables",
    "Percpu",
    "Shmem",
    "Cached",
    "AnonPages",
];

fn memcg(node: Option<&str>) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    if let Some(n) = node {
        let dir = std::path::Path::new("/sys/fs/cgroup/memory/dsec").join(n);
        for k in ["memory.usage_in_bytes", "memory.kmem.usage_in_bytes"] {
            if let Some(v) = std::fs::read_to_string(dir.join(k)).ok().and_then(|t| t.trim().parse().ok()) {
                m.insert(k.to_string(), v);
            }
        }
    }
    m
}

pub async fn run(a: DensityArgs) -> anyhow::Result<()> {
    let pid = a.common.dsec_pid.context("density needs --dsec-pid")?;
    let cl = client(&a.common)?;
    cl.health().await.context("the platform does not answer")?;
    let req = Arc::new(create_request(&a.common));
    let settle = Duration::from_secs_f64(a.settle);

    tokio::time::sleep(settle).await;
    let mem0 = host::meminfo();
    let rss0 = host::status_kb(pid, "VmRSS").unwrap_or(0);
    let cg0 = memcg(a.node.as_deref());
    let slab0 = host::slab_bytes();

    let c1 = cl.clone();
    let m0 = CpuMark::now(Some(pid));
    let out = run_load(a.count, a.concurrency, progress(a.count, "density", true), move |_| {
        let (c, r) = (c1.clone(), req.clone());
        async move {
            let sb = c.create(&r).await?;
            Ok((sb.id, sb.create_ms.unwrap_or(f64::NAN)))
        }
    })
    .await;
    let m1 = CpuMark::now(Some(pid));
    let errors = out.errors();
    let ok: Vec<(f64, f64, String)> = out.ok().map(|(d, (id, s))| (d.latency_ms, *s, id.clone())).collect();
    let n = ok.len();
    eprintln!("created {n} sandboxes in {:.1} s ({} errors)", out.wall.as_secs_f64(), errors.len());
    if n == 0 {
        anyhow::bail!("no sandbox was created: {:?}", errors.first());
    }

    tokio::time::sleep(settle).await;
    let mem1 = host::meminfo();
    let rss1 = host::status_kb(pid, "VmRSS").unwrap_or(0);
    let cg1 = memcg(a.node.as_deref());
    let slab1 = host::slab_bytes();
    let table = host::process_table();
    let agents: Vec<i32> =
        host::descendants(&table, pid).into_iter().filter(|p| table.get(p).map(|(_, c)| c == "dsec-agent").unwrap_or(false)).collect();
    let mut agent_sum: BTreeMap<String, u64> = BTreeMap::new();
    for p in &agents {
        for (k, v) in host::smaps_rollup(*p) {
            *agent_sum.entry(k).or_default() += v;
        }
    }
    let idle0 = CpuMark::now(Some(pid));
    tokio::time::sleep(Duration::from_secs_f64(a.idle_seconds)).await;
    let idle1 = CpuMark::now(Some(pid));
    let idle = idle0.per_op(&idle1, 1);
    // Every sandbox must still be alive and answering, not just present:
    // exec in the first, the last and a spread in between.
    let ex = exec_true();
    let mut probe_ok = 0;
    let probes: Vec<&String> = ok.iter().step_by((n / 50).max(1)).map(|x| &x.2).chain(ok.last().map(|x| &x.2)).collect();
    for id in &probes {
        if dsec_exec_true(&cl, id, &ex).await.is_ok() {
            probe_ok += 1;
        }
    }
    let listed_running = cl.list(&[("state", "running")]).await.map(|l| l.sandboxes.len()).unwrap_or(0);

    let delta = |k: &str| mem1.get(k).copied().unwrap_or(0) as f64 - mem0.get(k).copied().unwrap_or(0) as f64;
    let per = |kb: f64| kb / n as f64 / 1024.0; // MiB per sandbox
    let used_mib = per(-delta("MemAvailable"));
    let lat: Vec<f64> = ok.iter().map(|x| x.0).collect();
    let srv: Vec<f64> = ok.iter().map(|x| x.1).collect();
    let k = 100.min(n / 2).max(1);
    let (first_c, last_c) = (median(&lat[..k]), median(&lat[n - k..]));
    let (first_s, last_s) = (median(&srv[..k]), median(&srv[n - k..]));
    let mut breakdown = BTreeMap::new();
    for key in ["Rss", "Pss", "Pss_Anon", "Pss_File", "Private_Dirty", "Private_Clean", "Shared_Clean"] {
        if let Some(v) = agent_sum.get(key) {
            breakdown.insert(format!("agent_{key}_mib"), *v as f64 / agents.len().max(1) as f64 / 1024.0);
        }
    }
    for key in ["Slab", "SUnreclaim", "KernelStack", "PageTables", "Percpu", "Shmem", "AnonPages", "Cached"] {
        breakdown.insert(format!("kernel_{key}_delta_mib"), per(delta(key)));
    }
    breakdown.insert("dsec_process_rss_delta_mib".into(), per(rss1 as f64 - rss0 as f64));
    let cgd = |k: &str| (cg1.get(k).copied().unwrap_or(0) as f64 - cg0.get(k).copied().unwrap_or(0) as f64) / n as f64 / (1 << 20) as f64;
    breakdown.insert("memcg_usage_mib".into(), cgd("memory.usage_in_bytes"));
    breakdown.insert("memcg_kmem_usage_mib".into(), cgd("memory.kmem.usage_in_bytes"));

    // The slab caches that grew most, in KiB per sandbox.
    let mut slabs: Vec<(String, f64)> =
        slab1.iter().map(|(k, v)| (k.clone(), (*v as f64 - slab0.get(k).copied().unwrap_or(0) as f64) / n as f64 / 1024.0)).collect();
    slabs.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
    slabs.truncate(15);
    let v = json!({
        "benchmark": "density",
        "environment": environment(&a.common, false),
        "requested": a.count,
        "created": n,
        "errors": errors.len(),
        "first_errors": errors.iter().take(5).collect::<Vec<_>>(),
        "concurrency": a.concurrency,
        "create_wall_s": out.wall.as_secs_f64(),
        "create_rate_per_s": out.rate(),
        "create_cpu": m0.per_op(&m1, n),
        "agents_found": agents.len(),
        "running_listed": listed_running,
        "probe_execs": probes.len(),
        "probe_execs_ok": probe_ok,
        "memory_per_sandbox_mib": used_mib,
        "breakdown_per_sandbox": breakdown,
        "top_slab_caches_kib_per_sandbox": slabs.iter().map(|(k, v)| json!([k, (v * 10.0).round() / 10.0])).collect::<Vec<_>>(),
        "meminfo_before_kb": KEYS.iter().map(|k| (k.to_string(), mem0.get(*k).copied().unwrap_or(0))).collect::<BTreeMap<_, _>>(),
        "meminfo_after_kb": KEYS.iter().map(|k| (k.to_string(), mem1.get(*k).copied().unwrap_or(0))).collect::<BTreeMap<_, _>>(),
        "dsec_rss_kb": {"before": rss0, "after": rss1},
        "idle": {"dsec_cpu_cores": idle.server_cpu_ms_per_op / idle.wall_ms, "host_busy_cores": idle.host_busy_cores},
        "first_k": k,
        "create_ms_client": {"first": first_c, "last": last_c, "ratio": last_c / first_c, "all": summarize(&lat)},
        "create_ms_server": {"first": first_s, "last": last_s, "ratio": last_s / first_s, "all": summarize(&srv)},
        "samples": {"create_ms_client": round3(&lat), "create_ms_server": round3(&srv), "end_ms": round3(&out.ok().map(|(d, _)| d.end_ms).collect::<Vec<_>>())},
    });
    write_out(a.common.out.as_deref(), &v)?;

    let b = |k: &str| v["breakdown_per_sandbox"][k].as_f64().unwrap_or(f64::NAN);
    let rows: Vec<Vec<String>> = vec![
        vec!["sandboxes running".into(), format!("{n} ({} listed, {probe_ok}/{} probe execs ok)", listed_running, probes.len())],
        vec!["create rate".into(), format!("{:.0}/s at {} creators, {:.1} s", out.rate(), a.concurrency, out.wall.as_secs_f64())],
        vec!["host memory per sandbox".into(), format!("{used_mib:.3} MiB (MemAvailable delta / N)")],
        vec!["  agent RSS / PSS".into(), format!("{:.3} / {:.3} MiB", b("agent_Rss_mib"), b("agent_Pss_mib"))],
        vec![
            "  kernel Slab (unreclaimable)".into(),
            format!("{:.3} ({:.3}) MiB", b("kernel_Slab_delta_mib"), b("kernel_SUnreclaim_delta_mib")),
        ],
        vec![
            "  KernelStack + PageTables".into(),
            format!("{:.3} + {:.3} MiB", b("kernel_KernelStack_delta_mib"), b("kernel_PageTables_delta_mib")),
        ],
        vec!["  Percpu".into(), format!("{:.3} MiB", b("kernel_Percpu_delta_mib"))],
        vec!["  Shmem (tmpfs)".into(), format!("{:.3} MiB", b("kernel_Shmem_delta_mib"))],
        vec!["  dsec process RSS".into(), format!("{:.3} MiB", b("dsec_process_rss_delta_mib"))],
        vec!["  memcg usage (kmem)".into(), format!("{:.3} ({:.3}) MiB", b("memcg_usage_mib"), b("memcg_kmem_usage_mib"))],
        vec![
            format!("create p50 first/last {k}"),
            format!(
                "client {} / {} ms ({:.2}x); server {} / {} ms ({:.2}x)",
                f(first_c, 2),
                f(last_c, 2),
                last_c / first_c,
                f(first_s, 2),
                f(last_s, 2),
                last_s / first_s
            ),
        ],
        vec![
            "idle CPU with all running".into(),
            format!("dsec {:.3} cores, host {:.3} cores", idle.server_cpu_ms_per_op / idle.wall_ms, idle.host_busy_cores),
        ],
    ];
    let mut kv: Vec<(String, String)> = rows.into_iter().map(|r| (r[0].clone(), r[1].clone())).collect();
    kv.push((
        "  top slab caches (KiB each)".into(),
        slabs.iter().take(5).map(|(k, v)| format!("{k} {v:.0}")).collect::<Vec<_>>().join(", "),
    ));
    print_kv("density", &kv);
    if !errors.is_empty() {
        println!("  first errors: {:?}", &errors[..errors.len().min(3)]);
    }
    Ok(())
}
