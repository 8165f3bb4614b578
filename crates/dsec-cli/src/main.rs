//! `dsec`: runs the platform (`dsec up`) and talks to it.

mod cluster;
mod cluster_ca_cmd;
mod connect;
mod cp_cmd;
mod dockerfile_cmd;
mod fncall_cmd;
mod image_cmd;
mod join;
mod layer_cmd;
mod network_cmd;
mod network_config_cmd;
mod node_cmd;
mod pack_cmd;
mod port_cmd;
mod project_cmd;
mod sandbox_cmd;
mod shell;
mod snapshot_cmd;
mod tls_args;
mod trajectory_cmd;
mod up;
mod volume_cmd;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "dsec", version, about = "Sandboxes for agentic RL: run the platform and use it")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the single-node platform (apiserver + placement + edge) in one process.
    Up(up::UpArgs),
    /// Run one node's edge for apiservers (the cluster shape).
    Edge(cluster::EdgeCmdArgs),
    /// Run a stateless apiserver in front of `dsec edge` nodes.
    Apiserver(cluster::ApiserverArgs),
    /// Run the cluster's watcher: probes every registered edge and serves
    /// the view apiservers place by.
    Watcher(cluster::WatcherArgs),
    /// The cluster's TLS: make its CA, issue node certificates.
    #[command(subcommand)]
    Cluster(cluster_ca_cmd::ClusterCmd),
    /// The cluster's nodes: list, drain, undrain, remove, join tokens.
    #[command(subcommand)]
    Node(node_cmd::NodeCmd),
    /// Create a sandbox; with `-- CMD...` run CMD in it, print its output and remove it.
    Run(sandbox_cmd::RunArgs),
    /// List sandboxes.
    Ps(sandbox_cmd::PsArgs),
    /// Run a command in a sandbox.
    Exec(sandbox_cmd::ExecArgs),
    /// Copy a file or directory into or out of a sandbox (`cp ./src ID:/work`,
    /// `cp ID:/work/out.txt .`); the copy is made at the destination.
    Cp(cp_cmd::CpArgs),
    /// Run code once on a warm FnCall runner, or judge it against test cases.
    Fncall(fncall_cmd::FnCallArgs),
    /// Open an interactive terminal in a sandbox.
    Shell(shell::ShellArgs),
    /// Show what a sandbox's processes tried and were refused (blocked
    /// system calls), one event per line.
    Audit(sandbox_cmd::IdsArgs),
    /// Replace a running sandbox's network rules (KEY=true|false ...).
    Network(network_cmd::NetworkArgs),
    /// Print a signed URL that reaches a TCP port inside a sandbox
    /// (`port ID PORT`): HTTP and WebSocket through the API.
    Port(port_cmd::PortArgs),
    /// Write the node's network configuration (the services rules may
    /// allow: the host's own package indexes).
    #[command(subcommand)]
    NetworkConfig(network_config_cmd::NetworkConfigCmd),
    /// Stop sandboxes (their records stay for inspection).
    Stop(sandbox_cmd::IdsArgs),
    /// Change sandboxes' CPU QoS class while they run (`qos CLASS ID...`).
    Qos(sandbox_cmd::QosArgs),
    /// Stop and remove sandboxes.
    Rm(sandbox_cmd::IdsArgs),
    /// Pause sandboxes: suspend microVMs to disk, freeze containers and
    /// push their memory out of RAM (`--mode`).
    Pause(sandbox_cmd::PauseArgs),
    /// Projects (nested, with quotas): create, ls, show, quota, rm.
    Project(project_cmd::ProjectArgs),
    /// Scoped tokens: create (printed once), ls, revoke.
    Token(project_cmd::TokenArgs),
    /// Snapshot a microVM's disk (`snapshot ID NAME`; start microVMs from
    /// it with `run --snapshot`), list (`snapshot ls`) or delete
    /// (`snapshot rm NAME...`) snapshots.
    Snapshot(snapshot_cmd::SnapshotArgs),
    /// Named volumes on the node's disk: create (`--size`), ls (with the
    /// sandboxes using each), rm.
    Volume(volume_cmd::VolumeArgs),
    /// Resume paused sandboxes.
    Resume(sandbox_cmd::IdsArgs),
    /// Pack what a sandbox changed into a new image (pack_diff).
    Pack(pack_cmd::PackArgs),
    /// Show a sandbox's trajectory log: each operation, its result and the
    /// files it changed.
    Trajectory(trajectory_cmd::TrajectoryArgs),
    /// Re-run a sandbox's trajectory log in a fresh sandbox of the same image,
    /// layers and run arguments; report where results diverge (exit 2 if any).
    Replay(trajectory_cmd::ReplayArgs),
    /// Act on every sandbox of a training job.
    #[command(subcommand)]
    Job(sandbox_cmd::JobCmd),
    /// Build, list and remove images.
    #[command(subcommand)]
    Image(image_cmd::ImageCmd),
    /// List, inspect and remove the layers images are made of.
    #[command(subcommand)]
    Layer(layer_cmd::LayerCmd),
    /// Print the OpenAPI document of the HTTP API.
    Openapi,
}

/// Where `dsec up` keeps its state unless told otherwise.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/dsec";

pub fn default_data_dir() -> PathBuf {
    std::env::var_os("DSEC_DATA_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DSEC_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Cmd::Up(a) => up::run(a).await,
            Cmd::Edge(a) => cluster::edge(a).await,
            Cmd::Apiserver(a) => cluster::apiserver(a).await,
            Cmd::Watcher(a) => cluster::watcher(a).await,
            Cmd::Cluster(c) => cluster_ca_cmd::run(c),
            Cmd::Node(c) => node_cmd::run(c).await,
            Cmd::Run(a) => sandbox_cmd::run(a).await,
            Cmd::Ps(a) => sandbox_cmd::ps(a).await,
            Cmd::Exec(a) => sandbox_cmd::exec(a).await,
            Cmd::Cp(a) => cp_cmd::run(a).await,
            Cmd::Fncall(a) => fncall_cmd::run(a).await,
            Cmd::Shell(a) => shell::run(a).await,
            Cmd::Audit(a) => sandbox_cmd::audit(a).await,
            Cmd::Network(a) => network_cmd::run(a).await,
            Cmd::Port(a) => port_cmd::run(a).await,
            Cmd::NetworkConfig(c) => network_config_cmd::run(c),
            Cmd::Stop(a) => sandbox_cmd::stop(a).await,
            Cmd::Qos(a) => sandbox_cmd::qos(a).await,
            Cmd::Rm(a) => sandbox_cmd::rm(a).await,
            Cmd::Pause(a) => sandbox_cmd::pause(a).await,
            Cmd::Snapshot(a) => snapshot_cmd::run(a).await,
            Cmd::Volume(a) => volume_cmd::run(a).await,
            Cmd::Project(a) => project_cmd::project(a).await,
            Cmd::Token(a) => project_cmd::token(a).await,
            Cmd::Resume(a) => sandbox_cmd::resume(a).await,
            Cmd::Pack(a) => pack_cmd::run(a).await,
            Cmd::Job(c) => sandbox_cmd::job(c).await,
            Cmd::Trajectory(a) => trajectory_cmd::show(a).await,
            Cmd::Replay(a) => trajectory_cmd::replay(a).await,
            Cmd::Image(c) => image_cmd::run(c).await,
            Cmd::Layer(c) => layer_cmd::run(c).await,
            Cmd::Openapi => {
                println!("{}", dsec_apiserver::openapi_json());
                Ok(0)
            }
        }
    });
    match result {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
