//! `dsec image build NAME -f Dockerfile [CONTEXT]`: sends the context as a
//! tar stream to `POST /v1/images/build` and shows each step as the
//! platform reports it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use http_body_util::BodyExt;
use indicatif::{ProgressBar, ProgressStyle};

use crate::image_cmd::BuildArgs;

/// Where the Dockerfile goes in the context when it lives outside it.
const OUTSIDE_DOCKERFILE: &str = ".dsec-build.Dockerfile";

pub async fn build(a: BuildArgs) -> anyhow::Result<u8> {
    let dockerfile = a.dockerfile.clone().context("-f names the Dockerfile")?;
    let context = a.context.clone().unwrap_or_else(|| PathBuf::from("."));
    if !context.is_dir() {
        bail!("the build context {} is not a directory", context.display());
    }
    let (in_context, extra) = dockerfile_in_context(&dockerfile, &context)?;
    let mut query: Vec<(&str, String)> = vec![("name", a.name.clone()), ("dockerfile", in_context)];
    for b in &a.build_args {
        if !b.contains('=') {
            bail!("--build-arg {b:?} is not KEY=VALUE");
        }
        query.push(("build_arg", b.clone()));
    }
    if let Some(t) = &a.target {
        query.push(("target", t.clone()));
    }
    if a.no_cache {
        query.push(("no_cache", "true".into()));
    }
    if let Some(n) = &a.network {
        query.push(("network", n.clone()));
    }
    let q: String = form_urlencoded::Serializer::new(String::new()).extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str()))).finish();
    let client = a.conn.client()?;

    let upload =
        ProgressBar::no_length().with_style(ProgressStyle::with_template("{spinner} sending the context {bytes}").expect("valid template"));
    let extra = extra.map(|path| (path, OUTSIDE_DOCKERFILE));
    let (chunks, packer) = crate::cp_cmd::tar_stream(context.clone(), extra, upload.clone());
    let started = Instant::now();
    let body = client.post_stream(&format!("/v1/images/build?{q}"), "application/x-tar", chunks).await;
    upload.finish_and_clear();
    packer.await??;
    let mut body = body?;
    let mut pending = Vec::new();
    let mut step = ProgressBar::hidden();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.context("the build's answer was cut")?.into_data() else { continue };
        pending.extend_from_slice(&data);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if line.iter().all(u8::is_ascii_whitespace) {
                continue; // a heartbeat
            }
            let event: serde_json::Value = serde_json::from_slice(&line).context("a progress line is not JSON")?;
            match event["type"].as_str() {
                Some("step") => {
                    step = ProgressBar::new_spinner()
                        .with_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("valid template"));
                    step.enable_steady_tick(std::time::Duration::from_millis(120));
                    step.set_message(format!("[{}/{}] {}", event["step"], event["steps"], event["text"].as_str().unwrap_or("")));
                }
                Some("step_done") => {
                    let how = if event["cached"].as_bool() == Some(true) {
                        "cached".to_string()
                    } else {
                        format!("{:.1} s", event["ms"].as_f64().unwrap_or(0.0) / 1e3)
                    };
                    step.finish_with_message(format!("{} ({how})", step.message()));
                }
                Some("done") => {
                    step.finish_and_clear();
                    println!(
                        "built {} in {:.1} s: {} layers, {}, {} of {} steps cached",
                        event["image"].as_str().unwrap_or(""),
                        started.elapsed().as_secs_f64(),
                        event["layers"],
                        crate::image_cmd::human_bytes(event["size_bytes"].as_u64().unwrap_or(0)),
                        event["cached_steps"],
                        event["steps"],
                    );
                    return Ok(0);
                }
                Some("error") => {
                    step.abandon();
                    bail!("{} ({})", event["message"].as_str().unwrap_or("the build failed"), event["code"].as_str().unwrap_or(""));
                }
                _ => {}
            }
        }
    }
    std::io::stdout().flush().ok();
    bail!("the build's answer ended without a result")
}

/// The Dockerfile's path inside the context, or (when it lives outside)
/// the name it is sent under and the file to add.
fn dockerfile_in_context(dockerfile: &Path, context: &Path) -> anyhow::Result<(String, Option<PathBuf>)> {
    let file = dockerfile.canonicalize().with_context(|| format!("{}", dockerfile.display()))?;
    let root = context.canonicalize().with_context(|| format!("{}", context.display()))?;
    match file.strip_prefix(&root) {
        Ok(rel) => Ok((rel.to_string_lossy().into_owned(), None)),
        Err(_) => Ok((OUTSIDE_DOCKERFILE.to_string(), Some(file))),
    }
}
