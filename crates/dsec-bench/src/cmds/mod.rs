//! The benchmarks, one module each, and what they share.

pub mod churn;
pub mod cluster_failure;
pub mod cluster_job;
pub mod density;
pub mod exec;
mod fake_edges;
pub mod fncall_baseline;
pub mod latency;
pub mod placement;
pub mod policy;
pub mod quota_check;
pub mod store_grant;
pub mod throughput;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use dsec_api as api;
use dsec_client::Client;
use serde_json::{json, Value};

use crate::crun::{self, Crun};
use crate::{Common, CrunOpts};

pub fn client(c: &Common) -> anyhow::Result<Client> {
    Ok(Client::with_ca(&c.endpoint, c.token.as_deref(), c.ca_cert.as_deref())?)
}

/// One client per endpoint of `c`: load spread over apiserver replicas
/// (one `Client` keeps to the replica that answered last).
pub fn client_per_endpoint(c: &Common) -> anyhow::Result<Vec<Client>> {
    let all = client(c)?;
    all.endpoints().iter().map(|e| Ok(Client::with_ca(e, c.token.as_deref(), c.ca_cert.as_deref())?)).collect()
}

/// The creation request every benchmark sends (limits from the command line).
pub fn create_request(c: &Common) -> api::CreateSandboxRequest {
    api::CreateSandboxRequest {
        backend: api::Backend::Container,
        image: c.image.clone(),
        workspace: None,
        toolkits: vec![],
        memory_limit_mb: Some(c.memory_mb),
        cpu_cores_limit: Some(c.cpu),
        disk_limit_mb: Some(c.disk_mb),
        pids_limit: Some(c.pids),
        qos_class: None,
        // Idle sandboxes of a benchmark that died stop on their own.
        ttl_running_stop: Some(900),
        max_lifetime_s: None,
        network_rules: BTreeMap::new(),
        init_user: None,
        env: BTreeMap::new(),
        workdir: None,
        labels: BTreeMap::from([("bench".to_string(), "dsec-bench".to_string())]),
        node_selector: BTreeMap::new(),
        job: Some("dsec-bench".into()),
        snapshot: None,
        volumes: Default::default(),
        first_exec: None,
    }
}

pub fn exec_true() -> api::ExecRequest {
    api::ExecRequest { argv: Some(vec!["true".into()]), ..Default::default() }
}

/// Runs `true` and checks it succeeded.
pub async fn dsec_exec_true(cl: &Client, id: &str, req: &api::ExecRequest) -> anyhow::Result<()> {
    let r = cl.exec(id, req).await?;
    if r.exit_code != 0 {
        bail!("exec true in {id}: exit {} ({})", r.exit_code, r.stderr.trim());
    }
    Ok(())
}

pub async fn crun_setup(c: &Common, o: &CrunOpts) -> anyhow::Result<Option<Arc<Crun>>> {
    let Some(work) = &o.crun_work else {
        return Ok(None);
    };
    let blob = crun::image_blob(&o.images_dir, &c.image)?;
    let limits = crun::Limits { memory_mb: c.memory_mb, cpu_cores: c.cpu, disk_mb: c.disk_mb, pids: c.pids };
    Ok(Some(Arc::new(Crun::setup(work, &blob, limits, &["sleep", "2147483647"])?)))
}

/// Facts about the run that go into every results file.
pub fn environment(c: &Common, crun_on: bool) -> Value {
    let (cpus, mem) = {
        let m = crate::host::meminfo();
        (std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), m.get("MemTotal").copied().unwrap_or(0))
    };
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    json!({
        "endpoint": c.endpoint,
        "image": c.image,
        "limits": {"memory_mb": c.memory_mb, "cpu_cores": c.cpu, "disk_mb": c.disk_mb, "pids": c.pids},
        "cpus": cpus,
        "mem_total_kb": mem,
        "kernel": kernel,
        "loadavg_at_start": crate::START_LOADAVG.get(),
        "background_busy_cores_before": crate::BACKGROUND_BUSY.get(),
        "loadavg_at_end": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "crun": if crun_on { json!(crun::version()) } else { Value::Null },
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    })
}

pub fn write_out(path: Option<&Path>, v: &Value) -> anyhow::Result<()> {
    if let Some(p) = path {
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(p, serde_json::to_vec_pretty(v)?).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("results written to {}", p.display());
    }
    Ok(())
}

pub fn round3(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| (x * 1000.0).round() / 1000.0).collect()
}
