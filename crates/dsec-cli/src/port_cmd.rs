//! `dsec port ID PORT`: print a signed URL reaching a TCP port inside a
//! sandbox through the API (and its host name, when the API serves a
//! sandbox domain).

use clap::Args;
use dsec_api as api;

use crate::connect::ConnectArgs;

#[derive(Args, Debug)]
pub struct PortArgs {
    pub id: String,
    /// The TCP port a server in the sandbox listens on.
    #[arg(value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// How long the URL works without a token, in seconds (at most a week).
    #[arg(long, default_value_t = 3600)]
    pub ttl: u64,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

pub async fn run(a: PortArgs) -> anyhow::Result<u8> {
    let client = a.conn.client()?;
    let out = client.expose(&a.id, &api::ExposeRequest { port: a.port, ttl_s: Some(a.ttl) }).await?;
    println!("{}", out.url);
    if let Some(host) = out.host {
        eprintln!("host: {host} (with the token, or the URL's query)");
    }
    Ok(0)
}
