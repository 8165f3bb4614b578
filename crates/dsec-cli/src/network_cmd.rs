//! `dsec network ID KEY=BOOL...`: replace a running sandbox's network rules.

use std::collections::BTreeMap;

use clap::Args;
use dsec_api as api;

use crate::connect::ConnectArgs;

#[derive(Args, Debug)]
pub struct NetworkArgs {
    pub id: String,
    /// Rules as KEY=true|false: a service (`pypi`), an IPv4 prefix with
    /// optional protocol and ports (`tcp:198.18.0.0/24:443`), or a domain
    /// (`*.example.org`). The set replaces the sandbox's rules whole; none
    /// given: nothing is allowed any more.
    #[arg(value_parser = parse_rule)]
    pub rules: Vec<(String, bool)>,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

pub(crate) fn parse_rule(s: &str) -> Result<(String, bool), String> {
    match s.rsplit_once('=') {
        Some((k, "true")) => Ok((k.to_string(), true)),
        Some((k, "false")) => Ok((k.to_string(), false)),
        _ => Err(format!("expected KEY=true or KEY=false, got {s:?}")),
    }
}

pub async fn run(a: NetworkArgs) -> anyhow::Result<u8> {
    let client = a.conn.client()?;
    let req = api::NetworkRules { network_rules: a.rules.into_iter().collect::<BTreeMap<_, _>>() };
    let out = client.set_network_rules(&a.id, &req).await?;
    for (k, v) in out.network_rules {
        println!("{k}={v}");
    }
    Ok(0)
}
