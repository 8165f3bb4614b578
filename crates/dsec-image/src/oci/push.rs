//! Push a dsec image to an OCI registry as an ordinary OCI image: one
//! `tar+gzip` layer per dsec layer (`export`), a config carrying the
//! image's env, workdir and user, and an OCI manifest under a tag. What
//! `dsec image pull`, `docker pull` or `skopeo copy` read back.
//!
//! Order, as the distribution API wants it: layers, then the config, then
//! the manifest, so a tag never names a blob the registry lacks. A blob the
//! registry already holds (a second push, a base shared with another
//! image) is not sent again.

use std::io::{self, Read};

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::client::{Client, RegistryOptions};
use super::export::{export_layer, ExportedLayer};
use super::registry::{RegistryError, RegistryRef};
use super::spec::{host_platform, MEDIA_OCI_MANIFEST};
use crate::digest::Digest;
use crate::manifest::LayerKind;
use crate::progress::{Progress, Unit};
use crate::store::{ImageError, ImageStore, ResolvedImage};

pub const MEDIA_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// Layer annotation recording the dsec layer kind (base, workspace, toolkit).
pub const ANNOTATION_LAYER_KIND: &str = "io.dsec.layer.kind";

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] ImageError),
    #[error("layer {layer}: making its OCI tar: {source}")]
    Export {
        layer: String,
        #[source]
        source: io::Error,
    },
}

/// What a push did.
#[derive(Debug, Clone)]
pub struct Pushed {
    /// `registry/repository:tag@sha256:...` of the pushed manifest.
    pub pushed: String,
    pub manifest_digest: Digest,
    pub layers_uploaded: usize,
    /// Layers the registry held already.
    pub layers_present: usize,
    /// Bytes sent (compressed layers and the config).
    pub bytes_uploaded: u64,
}

/// Pushes the image `image` of `store` to `destination`
/// (`[registry/]repository[:tag]`).
pub fn push(
    store: &ImageStore,
    image: &str,
    destination: &str,
    options: &RegistryOptions,
    progress: &dyn Progress,
) -> Result<Pushed, PushError> {
    let r = RegistryRef::parse(destination)?;
    if r.reference.starts_with("sha256:") {
        return Err(RegistryError::BadReference {
            reference: destination.to_string(),
            reason: "push to a tag (`repository:tag`), not to a digest".into(),
        }
        .into());
    }
    let resolved = store.resolve(image)?;
    let client = Client::new(&r, options);
    progress.stage(&format!("checking {}", r.registry));
    client.ping()?;

    let mut pushed =
        Pushed { pushed: String::new(), manifest_digest: Digest::of_bytes(b""), layers_uploaded: 0, layers_present: 0, bytes_uploaded: 0 };
    let count = resolved.layers.len();
    let mut layers = Vec::with_capacity(count);
    for (i, layer) in resolved.layers.iter().enumerate() {
        let label = format!("layer {}/{count} {}", i + 1, short(&layer.digest));
        if let Some(known) = ExportRecord::read(store, &layer.digest) {
            if client.has_blob(&known.digest.to_string())? {
                progress.stage(&format!("{label}: already in the registry"));
                pushed.layers_present += 1;
                layers.push((layer.kind, known.digest, known.size, known.diff_id));
                continue;
            }
        }
        progress.stage(&format!("{label}: packing"));
        let exported =
            export_layer(store, &layer.path, progress).map_err(|source| PushError::Export { layer: layer.digest.to_string(), source })?;
        progress.stage(&format!(
            "{label}: uploading {} bytes ({} entries, {} whiteouts, {} opaque directories)",
            exported.size, exported.stats.entries, exported.stats.whiteouts, exported.stats.opaque_dirs
        ));
        ExportRecord { digest: exported.digest, size: exported.size, diff_id: exported.diff_id }.write(store, &layer.digest);
        let sent = upload_blob(&client, &exported, progress)?;
        if sent {
            pushed.layers_uploaded += 1;
            pushed.bytes_uploaded += exported.size;
        } else {
            pushed.layers_present += 1;
        }
        layers.push((layer.kind, exported.digest, exported.size, exported.diff_id));
        // `exported` drops here: its temp file goes before the next layer's.
    }

    let config = config_json(&resolved, &layers);
    let config_digest = Digest::of_bytes(&config);
    progress.stage("uploading the config");
    if upload_bytes(&client, &config, &config_digest)? {
        pushed.bytes_uploaded += config.len() as u64;
    }
    let manifest = manifest_json(&config, &config_digest, &layers);
    let manifest_digest = Digest::of_bytes(&manifest);
    progress.stage(&format!("tagging {}", r.reference));
    let body = manifest.clone();
    let make = move || -> io::Result<(Box<dyn Read + Send>, u64)> { Ok((Box::new(io::Cursor::new(body.clone())), body.len() as u64)) };
    client.send("PUT", &client.url_manifest(&r.reference), &[("Content-Type", MEDIA_OCI_MANIFEST)], Some(&make))?;
    pushed.manifest_digest = manifest_digest;
    pushed.pushed = format!("{}/{}:{}@{manifest_digest}", r.registry, r.repository, r.reference);
    Ok(pushed)
}

/// What a layer became the last time it was packed (the export is
/// deterministic, so it becomes the same again): kept beside its blob so a
/// later push asks the registry first and packs nothing it holds already.
#[derive(Debug, Serialize, Deserialize)]
struct ExportRecord {
    digest: Digest,
    size: u64,
    diff_id: Digest,
}

impl ExportRecord {
    fn read(store: &ImageStore, layer: &Digest) -> Option<ExportRecord> {
        let bytes = std::fs::read(store.export_record_path(layer)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Best effort: without the record the next push packs the layer again.
    fn write(&self, store: &ImageStore, layer: &Digest) {
        let bytes = serde_json::to_vec(self).expect("a record serialises");
        if let Err(e) = store.put_export_record(layer, &bytes) {
            tracing::warn!(layer = %layer, error = %e, "could not keep the layer's OCI export record");
        }
    }
}

/// Uploads an exported layer unless the registry has it. Returns whether
/// it was sent.
fn upload_blob(client: &Client, layer: &ExportedLayer, progress: &dyn Progress) -> Result<bool, RegistryError> {
    let path = layer.file.path().to_path_buf();
    let size = layer.size;
    let make = move || -> io::Result<(Box<dyn Read + Send + '_>, u64)> {
        let file = std::fs::File::open(&path)?;
        Ok((Box::new(Counted { inner: io::BufReader::with_capacity(1 << 20, file), done: 0, total: size, progress }), size))
    };
    upload(client, &layer.digest, &make)
}

fn upload_bytes(client: &Client, bytes: &[u8], digest: &Digest) -> Result<bool, RegistryError> {
    let make = || -> io::Result<(Box<dyn Read + Send + '_>, u64)> { Ok((Box::new(io::Cursor::new(bytes.to_vec())), bytes.len() as u64)) };
    upload(client, digest, &make)
}

/// HEAD the blob; if absent, open an upload session (POST) and complete it
/// in one PUT carrying the whole blob and its digest (the registry checks
/// the digest before accepting it).
fn upload(client: &Client, digest: &Digest, body: super::client::Body<'_>) -> Result<bool, RegistryError> {
    let digest = digest.to_string();
    if client.has_blob(&digest)? {
        return Ok(false);
    }
    let uploads = client.url_uploads();
    let started = client.send("POST", &uploads, &[("Content-Length", "0")], None)?;
    let location = started.header("location").map(|l| client.absolute(l)).ok_or_else(|| RegistryError::Protocol {
        url: uploads.clone(),
        message: format!("upload started ({}) without a Location", started.status()),
    })?;
    let separator = if location.contains('?') { '&' } else { '?' };
    let url = format!("{location}{separator}digest={digest}");
    client.send("PUT", &url, &[("Content-Type", "application/octet-stream")], Some(body))?;
    Ok(true)
}

/// The OCI image config: the image's defaults and the layers' diff_ids.
fn config_json(image: &ResolvedImage, layers: &[(LayerKind, Digest, u64, Digest)]) -> Vec<u8> {
    let platform = host_platform();
    let manifest = &image.manifest;
    let value = json!({
        "created": manifest.created_at,
        "architecture": platform.architecture,
        "os": platform.os,
        "config": run_config(&manifest.config),
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|l| l.3.to_string()).collect::<Vec<_>>(),
        },
        "history": image.layers.iter().map(|l| json!({
            "created": manifest.created_at,
            "created_by": format!("dsec {} layer {}", l.kind.name(), l.digest),
        })).collect::<Vec<_>>(),
    });
    serde_json::to_vec(&value).expect("a JSON value serialises")
}

/// The OCI `config` object: what dsec records of an image's defaults,
/// in the names Docker and OCI use.
fn run_config(c: &crate::ImageConfig) -> serde_json::Value {
    let mut v = json!({ "Env": c.env, "WorkingDir": c.workdir, "User": c.user });
    let set = |v: &mut serde_json::Value, key: &str, value: serde_json::Value| {
        v[key] = value;
    };
    if let Some(e) = &c.entrypoint {
        set(&mut v, "Entrypoint", json!(e));
    }
    if let Some(cmd) = &c.cmd {
        set(&mut v, "Cmd", json!(cmd));
    }
    if !c.labels.is_empty() {
        set(&mut v, "Labels", json!(c.labels));
    }
    let keys = |list: &[String]| serde_json::Value::Object(list.iter().map(|k| (k.clone(), json!({}))).collect());
    if !c.exposed_ports.is_empty() {
        set(&mut v, "ExposedPorts", keys(&c.exposed_ports));
    }
    if !c.volumes.is_empty() {
        set(&mut v, "Volumes", keys(&c.volumes));
    }
    if let Some(s) = &c.stop_signal {
        set(&mut v, "StopSignal", json!(s));
    }
    if let Some(s) = &c.shell {
        set(&mut v, "Shell", json!(s));
    }
    if let Some(h) = &c.healthcheck {
        set(
            &mut v,
            "Healthcheck",
            json!({
                "Test": h.test,
                "Interval": h.interval_ns,
                "Timeout": h.timeout_ns,
                "StartPeriod": h.start_period_ns,
                "StartInterval": h.start_interval_ns,
                "Retries": h.retries,
            }),
        );
    }
    v
}

fn manifest_json(config: &[u8], config_digest: &Digest, layers: &[(LayerKind, Digest, u64, Digest)]) -> Vec<u8> {
    let value = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_OCI_MANIFEST,
        "config": {
            "mediaType": MEDIA_OCI_CONFIG,
            "digest": config_digest.to_string(),
            "size": config.len(),
        },
        "layers": layers.iter().map(|(kind, digest, size, _)| json!({
            "mediaType": MEDIA_OCI_LAYER_GZIP,
            "digest": digest.to_string(),
            "size": size,
            "annotations": { ANNOTATION_LAYER_KIND: kind.name() },
        })).collect::<Vec<_>>(),
    });
    serde_json::to_vec(&value).expect("a JSON value serialises")
}

fn short(d: &Digest) -> String {
    format!("sha256:{}", &d.hex()[..12])
}

/// Reports upload progress as the HTTP client reads the body.
struct Counted<'p, R> {
    inner: R,
    done: u64,
    total: u64,
    progress: &'p dyn Progress,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        self.progress.advance(self.done, Some(self.total), Unit::Bytes);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_name_config_and_layers() {
        let config = br#"{"x":1}"#;
        let cd = Digest::of_bytes(config);
        let l = Digest::of_bytes(b"layer");
        let m = manifest_json(config, &cd, &[(LayerKind::Toolkit, l, 5, Digest::of_bytes(b"tar"))]);
        let v: serde_json::Value = serde_json::from_slice(&m).unwrap();
        assert_eq!(v["schemaVersion"], 2);
        assert_eq!(v["config"]["digest"], cd.to_string());
        assert_eq!(v["config"]["size"], config.len());
        assert_eq!(v["layers"][0]["digest"], l.to_string());
        assert_eq!(v["layers"][0]["mediaType"], MEDIA_OCI_LAYER_GZIP);
        assert_eq!(v["layers"][0]["annotations"][ANNOTATION_LAYER_KIND], "toolkit");
        // What the import side reads parses it.
        let parsed: super::super::spec::ImageManifest = serde_json::from_slice(&m).unwrap();
        assert_eq!(parsed.layers[0].size, 5);
    }
}
