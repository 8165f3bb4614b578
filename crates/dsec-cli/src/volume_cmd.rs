//! `dsec volume create NAME [--size MB]`, `dsec volume ls` and
//! `dsec volume rm NAME...`: named volumes on the node's disk.

use clap::{Args, Subcommand};

use crate::connect::ConnectArgs;

#[derive(Args)]
pub struct VolumeArgs {
    #[command(subcommand)]
    pub cmd: VolumeCmd,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Subcommand)]
pub enum VolumeCmd {
    /// Make a volume (mount it with `run --volume PATH=NAME[:ro]`).
    Create {
        name: String,
        /// What it may hold, in MiB (default 1024).
        #[arg(long)]
        size: Option<u64>,
    },
    /// List your volumes: size, use and the sandboxes mounting each.
    Ls,
    /// Remove volumes and their files (refused while a sandbox that is not
    /// stopped mounts one).
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

pub async fn run(a: VolumeArgs) -> anyhow::Result<u8> {
    let client = a.conn.client()?;
    match a.cmd {
        VolumeCmd::Create { name, size } => {
            let v = client.create_volume(&name, size).await?;
            println!("{} ({} MiB)", v.name, v.size_mb);
            Ok(0)
        }
        VolumeCmd::Ls => {
            let list = client.volumes().await?;
            println!("{:<32} {:>10} {:>10} SANDBOXES", "NAME", "SIZE", "USED");
            for v in list.volumes {
                let users = if v.sandboxes.is_empty() { "-".to_string() } else { v.sandboxes.join(",") };
                let size = format!("{} MiB", v.size_mb);
                println!("{:<32} {:>10} {:>10} {}", v.name, size, crate::image_cmd::human_bytes(v.used_bytes), users);
            }
            Ok(0)
        }
        VolumeCmd::Rm { names } => {
            let mut failed = 0u8;
            for name in names {
                match client.delete_volume(&name).await {
                    Ok(()) => println!("removed {name}"),
                    Err(e) => {
                        eprintln!("{name}: {e}");
                        failed = 1;
                    }
                }
            }
            Ok(failed)
        }
    }
}
