//! `dsec node`: the cluster's nodes (admin).

use axum::http::Method;
use clap::{Args, Subcommand};
use dsec_api as api;

use crate::connect::ConnectArgs;

#[derive(Subcommand, Debug)]
pub enum NodeCmd {
    /// List the nodes: state, backends, labels, capacity and load.
    Ls(LsArgs),
    /// Stop placing new sandboxes on a node (what runs there goes on).
    Drain(NameArgs),
    /// Place new sandboxes on a drained node again.
    Undrain(NameArgs),
    /// Remove a node from the registry (it left the cluster).
    Rm(NameArgs),
    /// Make a token that lets an edge join (`dsec edge --join URL --join-token T`).
    JoinToken(JoinTokenArgs),
}

#[derive(Args, Debug)]
pub struct LsArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Print the JSON answer.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct NameArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    pub node: String,
}

#[derive(Args, Debug)]
pub struct JoinTokenArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Seconds until the token stops admitting edges (default: never).
    #[arg(long)]
    pub ttl: Option<u64>,
}

fn labels(l: &std::collections::BTreeMap<String, String>) -> String {
    if l.is_empty() {
        return "-".into();
    }
    l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

pub async fn run(cmd: NodeCmd) -> anyhow::Result<u8> {
    match cmd {
        NodeCmd::Ls(a) => {
            let (_, bytes) = a.connect.client()?.raw(Method::GET, "/v1/nodes", None, "application/json").await?;
            let nodes: Vec<api::NodeStatus> = serde_json::from_slice(&bytes)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&nodes)?);
                return Ok(0);
            }
            println!("{:<20} {:<12} {:<22} {:>9} {:>13} {:>11}  LABELS", "NAME", "STATE", "BACKENDS", "CPU", "MEMORY MB", "SANDBOXES");
            for n in nodes {
                println!(
                    "{:<20} {:<12} {:<22} {:>9} {:>13} {:>11}  {}",
                    n.name,
                    n.state,
                    n.backends.join(","),
                    format!("{:.1}/{:.0}", n.cpu_reserved, n.cpu_capacity),
                    format!("{}/{}", n.memory_reserved_mb, n.memory_capacity_mb),
                    format!("{}/{}", n.slots_used, n.slots_capacity),
                    labels(&n.labels),
                );
            }
            Ok(0)
        }
        NodeCmd::Drain(a) => node_action(&a, Method::POST, "drain", "draining").await,
        NodeCmd::Undrain(a) => node_action(&a, Method::POST, "undrain", "ready").await,
        NodeCmd::Rm(a) => node_action(&a, Method::DELETE, "", "removed").await,
        NodeCmd::JoinToken(a) => {
            let body = serde_json::to_vec(&api::CreateJoinTokenRequest { ttl_s: a.ttl })?;
            let (_, bytes) = a.connect.client()?.raw(Method::POST, "/v1/cluster/join-tokens", Some(body), "application/json").await?;
            let t: api::JoinTokenInfo = serde_json::from_slice(&bytes)?;
            println!("{}", t.token);
            Ok(0)
        }
    }
}

async fn node_action(a: &NameArgs, method: Method, verb: &str, done: &str) -> anyhow::Result<u8> {
    dsec_edge::ids::validate_node_name(&a.node).map_err(anyhow::Error::msg)?;
    let path = if verb.is_empty() { format!("/v1/nodes/{}", a.node) } else { format!("/v1/nodes/{}/{verb}", a.node) };
    a.connect.client()?.raw(method, &path, None, "application/json").await?;
    println!("{} {done}", a.node);
    Ok(0)
}
