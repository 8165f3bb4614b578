//! `dsec-bench`: the compiled load generator of the dsec benchmarks
//! (docs/benchmarks.md), with crun measured side by side in the same run.
//!
//! Subcommands (each writes one JSON document to --out and prints a table):
//!   latency     create -> first exec answered, dsec vs crun, interleaved
//!   throughput  creation bursts and create+delete cycles at 8/16/32 creators
//!   exec        exec round trip of `true` (compiled client) vs `crun exec`
//!   density     N idle sandboxes: memory per sandbox, creation time vs index
//!   churn       M create/destroy cycles, then counts of what is left behind
//!   policy      creation and exec with vs without the system-call filter
//!   counts      the leak counts alone (processes, mounts, cgroups, ...)
//!   store-grant the token check per request on a shared-store engine
//!   fncall-baseline  a subprocess-per-call code runner (the FnCall
//!                    benchmark's baseline), serving until killed
//!
//! The bench/*.sh scripts start the platform, run these and clean up.

mod cmds;
mod crun;
mod host;
mod runner;
mod stats;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "dsec-bench", about = "Load generator for the dsec benchmarks (docs/benchmarks.md)")]
struct Cli {
    /// Tokio worker threads of the generator.
    #[arg(long, global = true, default_value_t = 2)]
    threads: usize,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create -> first exec answered, dsec vs crun, interleaved.
    Latency(cmds::latency::LatencyArgs),
    /// Create bursts and create+delete cycles at several concurrencies.
    Throughput(cmds::throughput::ThroughputArgs),
    /// Exec round trip of `true`: compiled client and crun exec.
    Exec(cmds::exec::ExecArgs),
    /// Many idle sandboxes: memory per sandbox, creation time vs index.
    Density(cmds::density::DensityArgs),
    /// Create/destroy cycles, then what is left behind.
    Churn(cmds::churn::ChurnArgs),
    /// Print the leak counts as JSON.
    Counts(CountsArgs),
    /// Serve a subprocess-per-call code runner (the FnCall baseline).
    FncallBaseline(cmds::fncall_baseline::BaselineArgs),
    /// Creation and exec latency with vs without the system-call filter.
    Policy(cmds::policy::PolicyArgs),
    /// The token check per request (`Store::grant`) on one engine.
    StoreGrant(cmds::store_grant::StoreGrantArgs),
    /// The authorization and quota check per creation at a tree depth,
    /// beside the check without quotas.
    QuotaCheck(cmds::quota_check::QuotaCheckArgs),
    /// Placement decisions per second over simulated nodes, by k and node count.
    Placement(cmds::placement::PlacementArgs),
    /// A large job through the apiserver's creation path against simulated edges, with one and two replicas.
    ClusterJob(cmds::cluster_job::ClusterJobArgs),
    /// From an edge's death (crash, partition) to `unknown` and to placement avoiding it.
    ClusterFailure(cmds::cluster_failure::ClusterFailureArgs),
}

/// Where the platform is and what the sandboxes look like.
#[derive(Args, Debug, Clone)]
pub struct Common {
    #[arg(long, env = "DSEC_ENDPOINT", default_value = "http://127.0.0.1:8080")]
    pub endpoint: String,
    #[arg(long, env = "DSEC_TOKEN")]
    pub token: Option<String>,
    /// The CA `https://` endpoints' certificates chain to (a cluster's).
    #[arg(long, env = "DSEC_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// Pid of the `dsec up` process (for its CPU time, fds, children).
    #[arg(long)]
    pub dsec_pid: Option<i32>,
    #[arg(long, default_value = "busybox")]
    pub image: String,
    #[arg(long, default_value_t = 64)]
    pub memory_mb: u64,
    #[arg(long, default_value_t = 0.5)]
    pub cpu: f64,
    #[arg(long, default_value_t = 64)]
    pub disk_mb: u64,
    #[arg(long, default_value_t = 64)]
    pub pids: u64,
    /// Write the results here (JSON).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Show progress bars (on stderr, when it is a terminal).
    #[arg(long)]
    pub progress: bool,
}

/// The crun side.
#[derive(Args, Debug, Clone)]
pub struct CrunOpts {
    /// Measure crun too, with its bundles, state and mounts under this
    /// (empty or missing) directory. Without it only dsec is measured.
    #[arg(long)]
    pub crun_work: Option<PathBuf>,
    /// The dsec image store (the crun side mounts the same EROFS blob).
    #[arg(long, default_value = "/var/lib/dsec/images")]
    pub images_dir: PathBuf,
}

#[derive(Args, Debug)]
struct CountsArgs {
    #[arg(long)]
    dsec_pid: Option<i32>,
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long)]
    node: Option<String>,
}

/// /proc/loadavg when the generator started (for the results' environment).
pub static START_LOADAVG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
/// Busy cores of the host during the second before the run (other users of
/// a shared machine show up here).
pub static BACKGROUND_BUSY: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    START_LOADAVG.get_or_init(|| std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string());
    if !matches!(cli.cmd, Cmd::Counts(_) | Cmd::FncallBaseline(_)) {
        let (b0, _) = host::host_cpu_ms();
        std::thread::sleep(std::time::Duration::from_secs(1));
        let (b1, _) = host::host_cpu_ms();
        BACKGROUND_BUSY.get_or_init(|| (b1 - b0) / 1000.0);
    }
    // The crun side mounts per container; doing it in a private mount
    // namespace keeps the host's table clean and frees everything if we
    // die. unshare(CLONE_NEWNS) needs a single-threaded process: before
    // the runtime starts.
    let crun_work = match &cli.cmd {
        Cmd::Latency(a) => a.crun.crun_work.clone(),
        Cmd::Throughput(a) => a.crun.crun_work.clone(),
        Cmd::Exec(a) => a.crun.crun_work.clone(),
        _ => None,
    };
    if crun_work.is_some() {
        crun::private_mount_namespace()?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(cli.threads.max(1)).enable_all().build()?;
    rt.block_on(async move {
        match cli.cmd {
            Cmd::Latency(a) => cmds::latency::run(a).await,
            Cmd::Throughput(a) => cmds::throughput::run(a).await,
            Cmd::Exec(a) => cmds::exec::run(a).await,
            Cmd::Density(a) => cmds::density::run(a).await,
            Cmd::Churn(a) => cmds::churn::run(a).await,
            Cmd::FncallBaseline(a) => cmds::fncall_baseline::run(a).await,
            Cmd::Policy(a) => cmds::policy::run(a).await,
            Cmd::StoreGrant(a) => cmds::store_grant::run(a).await,
            Cmd::QuotaCheck(a) => cmds::quota_check::run(a).await,
            Cmd::Placement(a) => cmds::placement::run(a).await,
            Cmd::ClusterJob(a) => cmds::cluster_job::run(a).await,
            Cmd::ClusterFailure(a) => cmds::cluster_failure::run(a).await,
            Cmd::Counts(a) => {
                let c = host::counts(a.dsec_pid, a.data_dir.as_deref(), a.node.as_deref());
                println!("{}", serde_json::to_string_pretty(&c)?);
                Ok(())
            }
        }
    })
}
