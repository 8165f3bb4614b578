//! `dsec layer ls|inspect|rm`: the node's layer blobs themselves, with the
//! images that name them (an image is a manifest over shared layers, so
//! one layer may serve many images).

use std::collections::BTreeMap;

use clap::Subcommand;
use dsec_image::{Digest, ImageStore, LayerKind};

use crate::image_cmd::{human_bytes, StoreArgs};

#[derive(Subcommand, Debug)]
pub enum LayerCmd {
    /// List layer blobs: digest, size, kind and how many images name each.
    Ls(StoreArgs),
    /// Show one layer: size, kind, and every image that names it.
    Inspect {
        /// `sha256:<hex>`, or a unique prefix of the hex digits.
        digest: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete layer blobs no image names (refused for one that is named).
    Rm {
        #[arg(required = true)]
        digests: Vec<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
}

/// Each blob with its size and the images (reference, kind) naming it.
struct Usage {
    size: u64,
    images: Vec<(String, LayerKind)>,
}

fn usage(store: &ImageStore) -> anyhow::Result<BTreeMap<Digest, Usage>> {
    let mut out: BTreeMap<Digest, Usage> = store.blobs()?.into_iter().map(|(d, size)| (d, Usage { size, images: Vec::new() })).collect();
    for image in store.list()? {
        for layer in &image.manifest.layers {
            if let Some(u) = out.get_mut(&layer.digest) {
                u.images.push((image.reference.to_string(), layer.kind));
            }
        }
    }
    Ok(out)
}

/// Resolves a full digest or a unique hex prefix among the store's blobs.
fn find(all: &BTreeMap<Digest, Usage>, given: &str) -> anyhow::Result<Digest> {
    let hex = given.strip_prefix("sha256:").unwrap_or(given);
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        anyhow::bail!("invalid layer digest {given:?}: expected sha256:<hex> or a hex prefix");
    }
    let matches: Vec<&Digest> = all.keys().filter(|d| d.hex().starts_with(&hex.to_ascii_lowercase())).collect();
    match matches.as_slice() {
        [one] => Ok(**one),
        [] => anyhow::bail!("layer {given} not found in this store"),
        many => anyhow::bail!("layer prefix {given} is ambiguous ({} layers match)", many.len()),
    }
}

pub async fn run(cmd: LayerCmd) -> anyhow::Result<u8> {
    tokio::task::spawn_blocking(move || run_blocking(cmd)).await?
}

fn run_blocking(cmd: LayerCmd) -> anyhow::Result<u8> {
    match cmd {
        LayerCmd::Ls(s) => {
            let store = s.open()?;
            println!("{:<19} {:>10} {:<10} IMAGES", "LAYER", "SIZE", "KIND");
            for (digest, u) in usage(&store)? {
                let kind = u.images.first().map_or("-", |(_, k)| k.name());
                println!("{:<19} {:>10} {:<10} {}", &digest.to_string()[..19], human_bytes(u.size), kind, u.images.len());
            }
            Ok(0)
        }
        LayerCmd::Inspect { digest, store } => {
            let store = store.open()?;
            let all = usage(&store)?;
            let d = find(&all, &digest)?;
            let u = &all[&d];
            println!("layer:  {d}\nsize:   {} ({} bytes)\npath:   {}", human_bytes(u.size), u.size, store.blob_path(&d).display());
            if u.images.is_empty() {
                println!("images: none (`dsec image gc` or `dsec layer rm` deletes it)");
            }
            for (reference, kind) in &u.images {
                println!("image:  {reference} ({})", kind.name());
            }
            Ok(0)
        }
        LayerCmd::Rm { digests, store } => {
            let store = store.open()?;
            let all = usage(&store)?;
            let found: Vec<Digest> = digests.iter().map(|g| find(&all, g)).collect::<anyhow::Result<_>>()?;
            for d in &found {
                let names: Vec<&str> = all[d].images.iter().map(|(r, _)| r.as_str()).collect();
                if !names.is_empty() {
                    anyhow::bail!("layer {d} is used by {}: remove those images first", names.join(", "));
                }
            }
            for d in found {
                store.remove_blob(&d)?;
                println!("removed {d}");
            }
            Ok(0)
        }
    }
}
