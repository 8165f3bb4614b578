//! `dsec snapshot ID NAME` (take one), `dsec snapshot ls` and
//! `dsec snapshot rm NAME...`: microVM disk snapshots.

use clap::{Args, Subcommand};

use crate::connect::ConnectArgs;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    pub cmd: Option<SnapshotCmd>,
    /// The microVM to snapshot.
    #[arg(required = true)]
    pub id: Option<String>,
    /// The snapshot's name.
    #[arg(required = true)]
    pub name: Option<String>,
    /// A retry with the same key returns the first snapshot.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// List your snapshots: name, id, size, parent, source sandbox.
    Ls,
    /// Delete snapshots (refused while a snapshot chains onto one or a
    /// sandbox started from it is not stopped).
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

pub async fn run(a: SnapshotArgs) -> anyhow::Result<u8> {
    let client = a.conn.client()?;
    match (a.cmd, a.id, a.name) {
        (Some(SnapshotCmd::Ls), ..) => {
            let list = client.snapshots().await?;
            println!("{:<32} {:<18} {:>10} {:<18} SOURCE", "NAME", "ID", "SIZE", "PARENT");
            for s in list.snapshots {
                let size = crate::image_cmd::human_bytes(s.bytes);
                println!("{:<32} {:<18} {:>10} {:<18} {}", s.name, s.id, size, s.parent.as_deref().unwrap_or("-"), s.source);
            }
            Ok(0)
        }
        (Some(SnapshotCmd::Rm { names }), ..) => {
            let mut failed = 0u8;
            for name in names {
                match client.delete_snapshot(&name).await {
                    Ok(()) => println!("removed {name}"),
                    Err(e) => {
                        eprintln!("{name}: {e}");
                        failed = 1;
                    }
                }
            }
            Ok(failed)
        }
        (None, Some(id), Some(name)) => {
            let s = client.snapshot(&id, &name, a.idempotency_key.as_deref()).await?;
            println!(
                "{} {} from {} ({:.1} MiB, vCPUs stopped {:.1} ms){}",
                s.name,
                s.id,
                s.source,
                s.bytes as f64 / (1u64 << 20) as f64,
                s.frozen_ms,
                if s.created { "" } else { " (existing, same idempotency key)" }
            );
            Ok(0)
        }
        (None, ..) => anyhow::bail!("usage: dsec snapshot ID NAME | dsec snapshot ls | dsec snapshot rm NAME..."),
    }
}
