//! `dsec network-config init`: writes the node's default network
//! configuration, whose named services are the host's own package indexes
//! (dsec-net's `defaults`), where `dsec up` finds it.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum NetworkConfigCmd {
    /// Write the default configuration (pypi, npm, debian: the indexes and
    /// mirrors this host uses) unless one is there.
    Init(InitArgs),
}

#[derive(Args, Debug)]
pub struct InitArgs {
    /// The data dir of `dsec up`: the file goes to `<data-dir>/network.json`,
    /// which `dsec up` loads when no `--network-config` is given.
    #[arg(long, default_value = crate::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Write here instead.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace an existing file.
    #[arg(long)]
    pub force: bool,
    /// Print the configuration instead of writing it.
    #[arg(long)]
    pub print: bool,
}

pub fn run(cmd: NetworkConfigCmd) -> anyhow::Result<u8> {
    match cmd {
        NetworkConfigCmd::Init(a) => init(a),
    }
}

fn init(a: InitArgs) -> anyhow::Result<u8> {
    let services = dsec_net::defaults::discover(&dsec_net::defaults::Host::this());
    let text = serde_json::to_string_pretty(&dsec_net::defaults::config_json(&services))? + "\n";
    // What is written must load: check it the way the edge will.
    dsec_net::NetConfig::parse(&text).map_err(|e| anyhow::anyhow!("the default configuration does not parse: {e}"))?;
    if a.print {
        print!("{text}");
        return Ok(0);
    }
    let path = a.out.unwrap_or_else(|| dsec_net::defaults::path_in(&a.data_dir));
    if path.exists() && !a.force {
        println!("{} exists; kept (--force replaces it)", path.display());
        return Ok(0);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // Beside, then rename: a reader never sees half a file.
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, &text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("renaming to {}", path.display()))?;
    let summary: Vec<String> = services
        .iter()
        .map(|(name, idx)| format!("{name}: {}", idx.iter().map(|i| format!("{}:{}", i.host, i.port)).collect::<Vec<_>>().join(", ")))
        .collect();
    println!("wrote {} ({})", path.display(), summary.join("; "));
    Ok(0)
}
