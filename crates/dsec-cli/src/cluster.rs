//! The cluster shape: `dsec edge` serves one node to apiservers;
//! `dsec apiserver` is the stateless front that routes to many edges.
//! The same libraries as `dsec up`; only the wiring differs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use dsec_apiserver::auth::{Authenticator, TokenStore};
use dsec_apiserver::nodes::{Node, Nodes, PlacementConfig};
use dsec_apiserver::registry::WatcherClient;
use dsec_apiserver::remote::RemoteNode;
use dsec_apiserver::watcher::Watcher;
use dsec_apiserver::{ApiLimits, AppState, FnCallBackend};
use dsec_store::Database;

use crate::image_cmd::Catalog;
use crate::tls_args::{Bound, ClusterCaArgs, ServeTlsArgs};
use crate::up::{serve, EdgeArgs};

#[derive(Args, Debug)]
pub struct EdgeCmdArgs {
    #[command(flatten)]
    pub edge: EdgeArgs,
    /// Address apiservers reach this edge at.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub tls: ServeTlsArgs,
    #[command(flatten)]
    pub ca: ClusterCaArgs,
    /// The secret apiservers present; created (mode 0600) if missing.
    #[arg(long)]
    pub cluster_secret_file: PathBuf,
    /// Largest file or archive upload, in MiB.
    #[arg(long, default_value_t = 4096)]
    pub max_upload_mb: u64,
    /// Join the cluster through this apiserver (`https://HOST:PORT`, or
    /// `http://` in a cluster without a CA): the node registers its URL,
    /// backends, labels and capacity.
    #[arg(long, requires = "join_token")]
    pub join: Option<String>,
    /// The join token an admin made (`dsec node join-token`).
    #[arg(long, env = "DSEC_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// The URL apiservers reach this edge at; default: https://LISTEN with
    /// --tls-cert, else http://LISTEN (LISTEN must then not be a wildcard
    /// address).
    #[arg(long)]
    pub advertise_url: Option<String>,
    /// An operator label KEY=VALUE for placement (`--label zone=a`,
    /// repeatable); `kvm` and `arch` are added from the hardware.
    #[arg(long = "label", value_parser = crate::join::parse_label)]
    pub labels: Vec<(String, String)>,
    /// The node's placement pool.
    #[arg(long, default_value = "primary")]
    pub pool: String,
}

#[derive(Args, Debug)]
pub struct WatcherArgs {
    /// The shared state apiservers use (`postgres://...`): the node registry
    /// and the admin tokens apiservers present.
    #[arg(long, env = "DSEC_DATABASE", value_parser = parse_database)]
    pub database: Database,
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub tls: ServeTlsArgs,
    #[command(flatten)]
    pub ca: ClusterCaArgs,
    /// How often each edge is probed, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub period_ms: u64,
}

#[derive(Args, Debug)]
pub struct ApiserverArgs {
    /// Where the apiserver keeps its admin token (and, without --database,
    /// its SQLite database).
    #[arg(long, env = "DSEC_DATA_DIR", default_value = crate::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// The shared state: `postgres://USER@HOST/DB` for any number of
    /// apiservers on one PostgreSQL database; default `sqlite:DATA_DIR/apiserver.db`
    /// (one apiserver).
    #[arg(long, env = "DSEC_DATABASE", value_parser = parse_database)]
    pub database: Option<Database>,
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub tls: ServeTlsArgs,
    #[command(flatten)]
    pub ca: ClusterCaArgs,
    /// An edge as NAME=URL (repeatable), e.g. node1=http://10.0.0.5:8081;
    /// edges may also join while it runs (`dsec edge --join`).
    #[arg(long = "edge", value_parser = parse_edge, requires = "cluster_secret_file")]
    pub edges: Vec<(String, String)>,
    /// The secret the --edge edges expect (see `dsec edge`); edges that
    /// join bring their own.
    #[arg(long)]
    pub cluster_secret_file: Option<PathBuf>,
    /// Read the nodes' load from this `dsec watcher` (`https://HOST:PORT`,
    /// or `http://` without --cluster-ca);
    /// default: probe every node itself (and whenever the watcher does not
    /// answer).
    #[arg(long, env = "DSEC_WATCHER")]
    pub watcher: Option<String>,
    /// Nodes sampled per placement (power of k choices).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub placement_k: u64,
    /// Nodes a creation tries before it fails (each refusal moves on).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub placement_attempts: u64,
    /// Serve SandboxFusion's `/run_code` without credentials (see `dsec up`).
    #[arg(long)]
    pub sandboxfusion_open: bool,
    /// Serve sandbox ports by host name `PORT-ID.DOMAIN` (see `dsec up`).
    #[arg(long, value_parser = crate::up::parse_sandbox_domain)]
    pub sandbox_domain: Option<String>,
}

fn parse_edge(s: &str) -> Result<(String, String), String> {
    let (name, url) = s.split_once('=').ok_or_else(|| format!("expected NAME=URL, got {s:?}"))?;
    dsec_edge::ids::validate_node_name(name)?;
    Ok((name.to_string(), url.to_string()))
}

fn parse_database(s: &str) -> Result<Database, String> {
    Database::parse(s).map_err(|e| e.to_string())
}

fn read_secret(path: &Path, create: bool) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
        _ if create => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut bytes = [0u8; 32];
            std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
            let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating {}", path.display()))?;
            f.write_all(secret.as_bytes())?;
            Ok(secret)
        }
        _ => anyhow::bail!("cluster secret file {} is missing or empty", path.display()),
    }
}

pub async fn edge(a: EdgeCmdArgs) -> anyhow::Result<u8> {
    let secret = read_secret(&a.cluster_secret_file, true)?;
    let server_tls = a.tls.server_config()?;
    if a.ca.cluster_ca.is_some() && server_tls.is_none() {
        anyhow::bail!("--cluster-ca needs --tls-cert and --tls-key: apiservers of a cluster with a CA reach its edges over HTTPS");
    }
    let scheme = if server_tls.is_some() { "https" } else { "http" };
    let advertise = match (&a.advertise_url, a.listen.ip().is_unspecified()) {
        (Some(u), _) => u.trim_end_matches('/').to_string(),
        (None, false) => format!("{scheme}://{}", a.listen),
        (None, true) if a.join.is_some() => anyhow::bail!("--listen {} is a wildcard address: give --advertise-url", a.listen),
        (None, true) => String::new(),
    };
    let started = a.edge.start().await?;
    // Bound before joining: the apiserver probes a node as soon as it
    // joins, and that probe waits in the backlog until serving starts
    // instead of being refused (which would mark the node unreachable).
    let listener = match Bound::bind(a.listen, server_tls).await {
        Ok(l) => l,
        Err(e) => {
            started.shutdown().await;
            return Err(e);
        }
    };
    if let (Some(url), Some(token)) = (&a.join, &a.join_token) {
        let mut labels = crate::join::hardware_labels();
        labels.extend(a.labels.iter().cloned());
        let spec = crate::join::JoinSpec {
            apiserver: url,
            token,
            cluster_ca: a.ca.cluster_ca.as_deref(),
            url: advertise,
            secret: secret.clone(),
            labels,
            pool: a.pool.clone(),
        };
        match crate::join::join(&started.edge, spec).await {
            Ok(answer) => {
                eprintln!("node {} {} the cluster at {url}", answer.node, if answer.rejoined { "rejoined" } else { "joined" })
            }
            Err(e) => {
                started.shutdown().await;
                return Err(e);
            }
        }
    }
    let state = AppState {
        auth: Arc::new(Authenticator::cluster(&secret)),
        nodes: Arc::new(Nodes::new(vec![Node::Local(started.edge.clone())])),
        images: Some(Arc::new(Catalog::open(&started.images_dir)?)),
        limits: Arc::new(ApiLimits { max_upload_bytes: a.max_upload_mb << 20 }),
        fncall: started.fncall_backend(),
        sandboxfusion_open: false,
        http_metrics: Default::default(),
        sandbox_domain: None,
        builder: Some(started.builder()?),
    };
    crate::up::serve_on(listener, state, &format!("edge of node {}", started.edge.node()), Some(started.edge.clone())).await?;
    started.shutdown().await;
    Ok(0)
}

pub async fn apiserver(a: ApiserverArgs) -> anyhow::Result<u8> {
    let secret = match &a.cluster_secret_file {
        Some(f) => read_secret(f, false)?,
        None => String::new(),
    };
    std::fs::create_dir_all(&a.data_dir).with_context(|| format!("creating {}", a.data_dir.display()))?;
    let database = a.database.clone().unwrap_or_else(|| Database::Sqlite(a.data_dir.join("apiserver.db")));
    let tokens = TokenStore::open(&database, &a.data_dir.join("admin-token")).await.with_context(|| format!("opening {database}"))?;
    let server_tls = a.tls.server_config()?;
    let peers = a.ca.peers()?;
    let mut nodes = Vec::new();
    for (name, url) in &a.edges {
        nodes.push(Node::Remote(Arc::new(RemoteNode::new(name, url, &secret, &peers).map_err(anyhow::Error::msg)?)));
    }
    let config = PlacementConfig { k: a.placement_k as usize, max_attempts: a.placement_attempts as usize };
    let nodes = Arc::new(Nodes::with_placement(nodes, config).with_tls(peers.clone()));
    let auth = Arc::new(Authenticator::Tokens(tokens));
    if let Some(store) = auth.tokens().map(|t| t.store()) {
        dsec_apiserver::registry::sync_once(&nodes, store).await.context("reading the node registry")?;
    }
    nodes.poll_remotes().await;
    let watcher = match &a.watcher {
        Some(url) => {
            let token = std::fs::read_to_string(a.data_dir.join("admin-token")).context("reading the admin token for the watcher")?;
            Some(WatcherClient::new(url, token.trim(), &peers).map_err(anyhow::Error::msg)?)
        }
        None => None,
    };
    dsec_apiserver::registry::follow(nodes.clone(), auth.clone(), watcher);
    let state = AppState {
        auth,
        nodes,
        images: None,
        limits: Arc::new(ApiLimits::default()),
        fncall: Some(Arc::new(FnCallBackend::Remote(Default::default()))),
        sandboxfusion_open: a.sandboxfusion_open,
        http_metrics: Default::default(),
        sandbox_domain: a.sandbox_domain.clone(),
        builder: None,
    };
    let what = format!(
        "apiserver for {} edge(s) and those that join, on {database}; admin token in {}",
        a.edges.len(),
        a.data_dir.join("admin-token").display()
    );
    serve(a.listen, server_tls, state, &what, None).await?;
    Ok(0)
}

pub async fn watcher(a: WatcherArgs) -> anyhow::Result<u8> {
    if a.period_ms < 50 {
        anyhow::bail!("--period-ms must be at least 50");
    }
    let server_tls = a.tls.server_config()?;
    let peers = a.ca.peers()?;
    let w = Watcher::open(&a.database, std::time::Duration::from_millis(a.period_ms), peers)
        .await
        .with_context(|| format!("opening {}", a.database))?;
    w.spawn();
    let listener = Bound::bind(a.listen, server_tls).await?;
    eprintln!("dsec is up at {} (watcher on {}, probing every {} ms)", listener.url()?, a.database, a.period_ms);
    listener.serve(w.router(), crate::up::shutdown_signal()).await.context("serving the watcher")?;
    Ok(0)
}
