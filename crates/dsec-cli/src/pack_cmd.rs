//! `dsec pack ID NAME`: a sandbox's changes as a new image.

use clap::Args;
use dsec_api as api;

use crate::connect::ConnectArgs;

#[derive(Args, Debug)]
pub struct PackArgs {
    /// The sandbox to pack.
    pub id: String,
    /// `name[:tag]` of the image to write.
    pub name: String,
    /// Leave paths matching this pattern out of the layer (absolute, `*`
    /// within one component; repeatable). Replaces the default residue list.
    #[arg(long = "scrub")]
    pub scrub: Vec<String>,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

pub async fn run(a: PackArgs) -> anyhow::Result<u8> {
    let client = a.conn.client()?;
    let req = api::PackRequest { name: a.name, scrub: (!a.scrub.is_empty()).then_some(a.scrub) };
    let r = client.pack(&a.id, &req).await?;
    eprintln!(
        "{} {} layer {} ({} entries, {} bytes, {} deletions, {} scrubbed; frozen {:.1} ms, built in {:.1} ms)",
        if r.incremental { "incremental pack:" } else { "pack:" },
        r.image,
        &r.layer[..r.layer.len().min(19)],
        r.entries,
        r.bytes,
        r.whiteouts,
        r.scrubbed,
        r.frozen_ms,
        r.build_ms
    );
    println!("{}", r.image);
    Ok(0)
}
