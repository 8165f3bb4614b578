//! run, ps, exec, stop, rm, pause, resume, job pause|resume.

use std::collections::BTreeMap;
use std::io::Write;

use clap::Args;
use dsec_api as api;

use crate::connect::ConnectArgs;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Image name, e.g. python or busybox.
    pub image: String,
    #[arg(long)]
    pub memory_mb: Option<u64>,
    #[arg(long)]
    pub cpus: Option<f64>,
    #[arg(long)]
    pub disk_mb: Option<u64>,
    /// Idle seconds before the sandbox is stopped (0: never).
    #[arg(long)]
    pub ttl: Option<u64>,
    #[arg(long)]
    pub user: Option<String>,
    #[arg(long)]
    pub workspace: Option<String>,
    #[arg(long = "toolkit")]
    pub toolkits: Vec<String>,
    /// Labels as key=value.
    #[arg(long = "label", value_parser = parse_kv)]
    pub labels: Vec<(String, String)>,
    /// Place only on nodes with this label KEY=VALUE (repeatable), e.g.
    /// `--node-selector kvm=true`.
    #[arg(long = "node-selector", value_parser = parse_kv)]
    pub node_selector: Vec<(String, String)>,
    /// The training job the sandbox belongs to (for `dsec job pause|resume`).
    #[arg(long)]
    pub job: Option<String>,
    /// `container`, `microvm` or `vm`.
    #[arg(long, default_value = "container")]
    pub backend: String,
    /// Start a VM from this snapshot (`dsec snapshot`; its backend).
    #[arg(long)]
    pub snapshot: Option<String>,
    /// CPU QoS class: `latency_sensitive` or `best_effort` (default per
    /// backend; `dsec qos` changes it later).
    #[arg(long, value_parser = parse_qos)]
    pub qos: Option<api::QosClass>,
    /// Keep the sandbox after CMD finishes.
    #[arg(long)]
    pub keep: bool,
    /// A network rule, KEY=true|false (repeatable): any rule gives the
    /// sandbox a network (`dsec network` changes them later).
    #[arg(long = "net", value_parser = crate::network_cmd::parse_rule)]
    pub net: Vec<(String, bool)>,
    /// A named volume to mount, PATH=NAME or PATH=NAME:ro (repeatable;
    /// `dsec volume create` makes one).
    #[arg(long = "volume", value_parser = parse_volume)]
    pub volumes: Vec<(String, api::VolumeMount)>,
    #[command(flatten)]
    pub conn: ConnectArgs,
    /// Command to run (after `--`).
    #[arg(last = true)]
    pub cmd: Vec<String>,
}

fn parse_volume(s: &str) -> Result<(String, api::VolumeMount), String> {
    let (path, name) = s.split_once('=').ok_or_else(|| format!("expected PATH=NAME[:ro], got {s:?}"))?;
    let mount = match name.strip_suffix(":ro") {
        Some(n) => api::VolumeMount::Options(api::VolumeMountOptions { name: n.to_string(), read_only: true }),
        None => api::VolumeMount::Name(name.to_string()),
    };
    Ok((path.to_string(), mount))
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("expected key=value, got {s:?}"))
}

pub async fn run(a: RunArgs) -> anyhow::Result<u8> {
    let client = a.conn.client()?;
    let backend = match (a.backend.as_str(), &a.snapshot) {
        // A sandbox started from a snapshot is of the snapshot's backend.
        (_, Some(name)) => {
            let snaps = client.snapshots().await?.snapshots;
            snaps.into_iter().find(|s| &s.name == name).map_or(api::Backend::Microvm, |s| s.backend)
        }
        ("microvm", _) => api::Backend::Microvm,
        ("vm", _) => api::Backend::Vm,
        ("container", _) => api::Backend::Container,
        (other, _) => anyhow::bail!("--backend must be container, microvm or vm, not {other:?}"),
    };
    let req = api::CreateSandboxRequest {
        backend,
        image: a.image,
        workspace: a.workspace,
        toolkits: a.toolkits,
        memory_limit_mb: a.memory_mb,
        cpu_cores_limit: a.cpus,
        disk_limit_mb: a.disk_mb,
        pids_limit: None,
        qos_class: a.qos,
        ttl_running_stop: a.ttl,
        max_lifetime_s: None,
        network_rules: a.net.into_iter().collect(),
        init_user: a.user,
        env: BTreeMap::new(),
        workdir: None,
        labels: a.labels.into_iter().collect(),
        node_selector: a.node_selector.into_iter().collect(),
        job: a.job,
        snapshot: a.snapshot,
        volumes: a.volumes.into_iter().collect(),
        first_exec: None,
    };
    let sb = client.create(&req).await?;
    if a.cmd.is_empty() {
        println!("{}", sb.id);
        return Ok(0);
    }
    let result = client.exec(&sb.id, &api::ExecRequest { argv: Some(a.cmd), ..Default::default() }).await;
    if !a.keep {
        client.delete(&sb.id).await?;
    } else {
        eprintln!("sandbox {} kept", sb.id);
    }
    Ok(print_result(result?))
}

fn print_result(r: api::ExecResponse) -> u8 {
    let _ = std::io::stdout().write_all(r.stdout.as_bytes());
    let _ = std::io::stderr().write_all(r.stderr.as_bytes());
    if r.truncated {
        eprintln!("[output truncated]");
    }
    if r.timed_out {
        eprintln!("[timed out]");
    }
    r.exit_code.clamp(0, 255) as u8
}

#[derive(Args, Debug)]
pub struct PsArgs {
    /// Include stopped and failed sandboxes (default: live ones, paused
    /// and queued included).
    #[arg(short, long)]
    pub all: bool,
    #[arg(long = "label", value_parser = parse_kv)]
    pub labels: Vec<(String, String)>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

pub async fn ps(a: PsArgs) -> anyhow::Result<u8> {
    let client = a.conn.client()?;
    let labels: Vec<String> = a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let q: Vec<(&str, &str)> = labels.iter().map(|l| ("label", l.as_str())).collect();
    let mut list = client.list(&q).await?;
    if !a.all {
        list.sandboxes.retain(|s| !s.state.is_terminal());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&list.sandboxes)?);
        return Ok(0);
    }
    println!("{:<28} {:<10} {:<10} {:>7} {:>6}  {:<24} REASON", "ID", "IMAGE", "STATE", "MEM_MB", "CPUS", "CREATED");
    for s in list.sandboxes {
        println!(
            "{:<28} {:<10} {:<10} {:>7} {:>6}  {:<24} {}",
            s.id,
            s.image,
            s.state.as_str(),
            s.limits.memory_limit_mb,
            s.limits.cpu_cores_limit,
            s.created_at,
            s.state_reason.unwrap_or_default()
        );
    }
    Ok(0)
}

#[derive(Args, Debug)]
pub struct ExecArgs {
    pub id: String,
    /// Seconds before the command is killed.
    #[arg(long)]
    pub timeout: Option<f64>,
    #[arg(long)]
    pub user: Option<String>,
    #[arg(long)]
    pub cwd: Option<String>,
    /// Log the command under this step id in the sandbox's trajectory log;
    /// if the id is already logged, print the recorded result instead of
    /// running the command again.
    #[arg(long)]
    pub step_id: Option<String>,
    #[command(flatten)]
    pub conn: ConnectArgs,
    /// Command and arguments (after `--`).
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

pub async fn exec(a: ExecArgs) -> anyhow::Result<u8> {
    let client = a.conn.client()?;
    let req = api::ExecRequest { argv: Some(a.cmd), timeout: a.timeout, user: a.user, cwd: a.cwd, ..Default::default() };
    let result = match &a.step_id {
        Some(step) => client.exec_step(&a.id, &req, step).await?,
        None => client.exec(&a.id, &req).await?,
    };
    Ok(print_result(result))
}

#[derive(Args, Debug)]
pub struct IdsArgs {
    #[arg(required = true)]
    pub ids: Vec<String>,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// Runs `op` on each id, printing its line or its error; exit 1 if any failed.
async fn each_id<F, Fut>(a: IdsArgs, op: F) -> anyhow::Result<u8>
where
    F: Fn(dsec_client::Client, String) -> Fut,
    Fut: std::future::Future<Output = Result<String, dsec_client::ClientError>>,
{
    let client = a.conn.client()?;
    let mut failed = 0u8;
    for id in a.ids {
        match op(client.clone(), id.clone()).await {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("{id}: {e}");
                failed = 1;
            }
        }
    }
    Ok(failed)
}

/// `ID SEQ TIME_MS PID KIND DETAIL` per event, then a summary line.
pub async fn audit(a: IdsArgs) -> anyhow::Result<u8> {
    each_id(a, |c, id| async move {
        let mut lines = Vec::new();
        let mut after = 0;
        loop {
            let page = c.audit(&id, after).await?;
            for e in &page.events {
                lines.push(format!("{id} {} {} {} {} {}", e.seq, e.time_ms, e.pid, e.kind, e.detail));
            }
            match page.events.last() {
                Some(last) => after = last.seq,
                None => {
                    lines.push(format!("{id}: {} events, {} dropped", page.total, page.dropped));
                    return Ok(lines.join("\n"));
                }
            }
        }
    })
    .await
}

pub async fn stop(a: IdsArgs) -> anyhow::Result<u8> {
    each_id(a, |c, id| async move { c.stop(&id).await.map(|s| format!("{} {}", s.id, s.state.as_str())) }).await
}

fn parse_qos(s: &str) -> Result<api::QosClass, String> {
    match s {
        "latency_sensitive" => Ok(api::QosClass::LatencySensitive),
        "best_effort" => Ok(api::QosClass::BestEffort),
        other => Err(format!("the QoS class must be latency_sensitive or best_effort, not {other:?}")),
    }
}

#[derive(clap::Args)]
pub struct QosArgs {
    /// `latency_sensitive` or `best_effort`.
    #[arg(value_parser = parse_qos)]
    pub class: api::QosClass,
    #[command(flatten)]
    pub ids: IdsArgs,
}

/// Changes running sandboxes' QoS class; prints each id with its class.
pub async fn qos(a: QosArgs) -> anyhow::Result<u8> {
    let req = api::UpdateSandboxRequest { qos_class: Some(a.class) };
    each_id(a.ids, |c, id| {
        let req = req.clone();
        async move { c.update(&id, &req).await.map(|s| format!("{} {}", s.id, qos_name(s.qos_class))) }
    })
    .await
}

fn qos_name(q: api::QosClass) -> &'static str {
    match q {
        api::QosClass::LatencySensitive => "latency_sensitive",
        api::QosClass::BestEffort => "best_effort",
    }
}

pub async fn rm(a: IdsArgs) -> anyhow::Result<u8> {
    each_id(a, |c, id| async move { c.delete(&id).await.map(|()| id) }).await
}

#[derive(clap::Args)]
pub struct PauseArgs {
    /// `auto` (microVMs suspend to disk, containers freeze), `freeze` or
    /// `suspend`.
    #[arg(long, default_value = "auto")]
    pub mode: String,
    #[command(flatten)]
    pub ids: IdsArgs,
}

pub async fn pause(a: PauseArgs) -> anyhow::Result<u8> {
    let mode = a.mode;
    each_id(a.ids, |c, id| {
        let mode = mode.clone();
        async move {
            c.pause_mode(&id, &mode).await.map(|p| {
                let how = if p.suspended {
                    format!(" suspended, {:.1} MiB on disk,", p.disk_bytes as f64 / (1u64 << 20) as f64)
                } else {
                    String::new()
                };
                format!(
                    "{} {}{how} freed {:.1} MiB in {:.1} ms{}",
                    p.sandbox.id,
                    p.sandbox.state.as_str(),
                    p.memory_freed_bytes as f64 / (1u64 << 20) as f64,
                    p.duration_ms,
                    if p.changed { "" } else { " (already paused)" }
                )
            })
        }
    })
    .await
}

pub async fn resume(a: IdsArgs) -> anyhow::Result<u8> {
    each_id(a, |c, id| async move {
        c.resume(&id).await.map(|r| {
            let note = if r.changed { "" } else { " (already running)" };
            format!("{} {} in {:.1} ms{note}", r.sandbox.id, r.sandbox.state.as_str(), r.duration_ms)
        })
    })
    .await
}

#[derive(clap::Subcommand, Debug)]
pub enum JobCmd {
    /// Pause every sandbox of a job.
    Pause(JobArgs),
    /// Resume every sandbox of a job.
    Resume(JobArgs),
}

#[derive(Args, Debug)]
pub struct JobArgs {
    pub job: String,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

pub async fn job(cmd: JobCmd) -> anyhow::Result<u8> {
    let (a, verb) = match cmd {
        JobCmd::Pause(a) => (a, "pause"),
        JobCmd::Resume(a) => (a, "resume"),
    };
    let r = a.conn.client()?.job_action(&a.job, verb).await?;
    println!(
        "job {}: {} sandboxes, {} {verb}d, {} unchanged, {} ended, {} failed; freed {:.1} MiB in {:.1} ms",
        r.job,
        r.matched,
        r.changed,
        r.unchanged,
        r.ended,
        r.failed.len(),
        r.memory_freed_bytes as f64 / (1u64 << 20) as f64,
        r.duration_ms
    );
    for f in &r.failed {
        eprintln!("{}: {}: {}", f.id, f.code, f.message);
    }
    Ok(u8::from(!r.failed.is_empty()))
}
