//! The cluster shape: `dsec edge` serves one node to apiservers;
//! `dsec apiserver` is the stateless front that routes to many edges.
//! The same libraries as `dsec up`; only the wiring differs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use dsec_apiserver::auth::{Authenticator, TokenStore};
use dsec_apiserver::nodes::{Node, Nodes};
use dsec_apiserver::remote::RemoteNode;
use dsec_apiserver::{ApiLimits, AppState, FnCallBackend};
use dsec_store::Database;

use crate::image_cmd::Catalog;
use crate::up::{serve, EdgeArgs};

#[derive(Args, Debug)]
pub struct EdgeCmdArgs {
    #[command(flatten)]
    pub edge: EdgeArgs,
    /// Address apiservers reach this edge at.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    /// The secret apiservers present; created (mode 0600) if missing.
    #[arg(long)]
    pub cluster_secret_file: PathBuf,
    /// Largest file or archive upload, in MiB.
    #[arg(long, default_value_t = 4096)]
    pub max_upload_mb: u64,
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
    /// An edge as NAME=URL (repeatable), e.g. node1=http://10.0.0.5:8081.
    #[arg(long = "edge", required = true, value_parser = parse_edge)]
    pub edges: Vec<(String, String)>,
    /// The secret the edges expect (see `dsec edge`).
    #[arg(long)]
    pub cluster_secret_file: PathBuf,
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
    let started = a.edge.start().await?;
    let state = AppState {
        auth: Arc::new(Authenticator::cluster(&secret)),
        nodes: Arc::new(Nodes::new(vec![Node::Local(started.edge.clone())])),
        images: Some(Arc::new(Catalog::open(&started.images_dir)?)),
        limits: Arc::new(ApiLimits { max_upload_bytes: a.max_upload_mb << 20 }),
        fncall: started.fncall_backend(),
        sandboxfusion_open: false,
        http_metrics: Default::default(),
        sandbox_domain: None,
    };
    serve(a.listen, state, &format!("edge of node {}", started.edge.node()), Some(started.edge.clone())).await?;
    started.shutdown().await;
    Ok(0)
}

pub async fn apiserver(a: ApiserverArgs) -> anyhow::Result<u8> {
    let secret = read_secret(&a.cluster_secret_file, false)?;
    std::fs::create_dir_all(&a.data_dir).with_context(|| format!("creating {}", a.data_dir.display()))?;
    let database = a.database.clone().unwrap_or_else(|| Database::Sqlite(a.data_dir.join("apiserver.db")));
    let tokens = TokenStore::open(&database, &a.data_dir.join("admin-token")).await.with_context(|| format!("opening {database}"))?;
    let mut nodes = Vec::new();
    for (name, url) in &a.edges {
        nodes.push(Node::Remote(Arc::new(RemoteNode::new(name, url, &secret).map_err(anyhow::Error::msg)?)));
    }
    let nodes = Arc::new(Nodes::new(nodes));
    for r in nodes.remotes() {
        r.poll().await;
    }
    nodes.spawn_watcher();
    let state = AppState {
        auth: Arc::new(Authenticator::Tokens(tokens)),
        nodes,
        images: None,
        limits: Arc::new(ApiLimits::default()),
        fncall: Some(Arc::new(FnCallBackend::Remote(Default::default()))),
        sandboxfusion_open: a.sandboxfusion_open,
        http_metrics: Default::default(),
        sandbox_domain: a.sandbox_domain.clone(),
    };
    let what =
        format!("apiserver for {} edge(s) on {database}; admin token in {}", a.edges.len(), a.data_dir.join("admin-token").display());
    serve(a.listen, state, &what, None).await?;
    Ok(0)
}
