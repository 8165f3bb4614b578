//! `dsec cluster init` and `dsec cluster cert`: the cluster CA and the
//! certificates of its edges, apiservers and watcher.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Make the cluster CA (`ca.pem`, and `ca-key.pem` readable by root
    /// alone) in DIR; every node trusts `ca.pem` (--cluster-ca).
    Init(InitArgs),
    /// Issue a node (edge, apiserver or watcher) a certificate for the
    /// addresses it is reached at: NAME.pem and NAME-key.pem, for its
    /// --tls-cert and --tls-key.
    Cert(CertArgs),
}

#[derive(Args, Debug)]
pub struct InitArgs {
    /// Where the CA is kept.
    #[arg(long)]
    pub dir: PathBuf,
    /// The CA's common name.
    #[arg(long, default_value = "dsec cluster CA")]
    pub name: String,
}

#[derive(Args, Debug)]
pub struct CertArgs {
    /// The directory `dsec cluster init` made.
    #[arg(long)]
    pub ca_dir: PathBuf,
    /// The node's name (the certificate's common name and file names).
    #[arg(long)]
    pub name: String,
    /// An IP address or DNS name the node is reached at (repeatable; at
    /// least one): peers check the URL's host against these.
    #[arg(long = "host", required = true)]
    pub hosts: Vec<String>,
    /// Days the certificate is valid.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub days: u32,
    /// Where NAME.pem and NAME-key.pem are written; default: the CA's directory.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

pub fn run(cmd: ClusterCmd) -> anyhow::Result<u8> {
    match cmd {
        ClusterCmd::Init(a) => {
            let files = dsec_tls::init_ca(&a.dir, &a.name).context("making the cluster CA")?;
            println!("cluster CA: {} (give it to every node: --cluster-ca)", files.cert.display());
            println!("its key:    {} (keep it here; only `dsec cluster cert` reads it)", files.key.display());
        }
        ClusterCmd::Cert(a) => {
            let out = a.out_dir.as_deref().unwrap_or(&a.ca_dir);
            let issued = dsec_tls::issue(&a.ca_dir, &a.name, &a.hosts, a.days, out)
                .with_context(|| format!("issuing a certificate for {}", a.name))?;
            println!("--tls-cert {} --tls-key {}", issued.cert.display(), issued.key.display());
        }
    }
    Ok(0)
}
