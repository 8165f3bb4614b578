//! `dsec port ID PORT`: print a signed URL reaching a TCP port inside a
//! sandbox through the API (and its host name, when the API serves a
//! sandbox domain); with `--tcp`, publish the port as a plain `HOST:PORT`
//! of the sandbox's node instead and print that.

use clap::Args;
use dsec_api as api;

use crate::connect::ConnectArgs;

#[derive(Args, Debug)]
pub struct PortArgs {
    pub id: String,
    /// The TCP port a server in the sandbox listens on.
    #[arg(value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// How long the URL works without a token (or the TCP forward stays
    /// open), in seconds (at most a week).
    #[arg(long, default_value_t = 3600)]
    pub ttl: u64,
    /// A plain TCP forward on the node (for clients that do not speak HTTP
    /// or cannot add a header): prints `HOST:PORT`.
    #[arg(long)]
    pub tcp: bool,
    /// With --tcp: accept connections only from this address or prefix
    /// (repeatable).
    #[arg(long = "allow-from", requires = "tcp")]
    pub allow_from: Vec<String>,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

pub async fn run(a: PortArgs) -> anyhow::Result<u8> {
    let client = a.conn.client()?;
    if a.tcp {
        let req = api::CreateForwardRequest { port: a.port, ttl_s: Some(a.ttl), allow_from: a.allow_from };
        let f = client.forward_tcp(&a.id, &req).await?;
        println!("{}", f.address);
        eprintln!("open until {} (Unix seconds) or until the sandbox stops", f.expires_at);
        return Ok(0);
    }
    let out = client.expose(&a.id, &api::ExposeRequest { port: a.port, ttl_s: Some(a.ttl) }).await?;
    println!("{}", out.url);
    if let Some(host) = out.host {
        eprintln!("host: {host} (with the token, or the URL's query)");
    }
    Ok(0)
}
