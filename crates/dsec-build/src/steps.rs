//! The steps that change the filesystem (RUN, COPY, ADD, and the creation
//! of a pending WORKDIR): each looked up in the step cache, else carried
//! out in a sandbox of the stage so far and packed into a layer.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Arc;

use dsec_edge::agent::FileKind;
use dsec_edge::{Caller, Edge, PackRequest};
use dsec_image::oci::registry::{pull, RegistryOptions};
use dsec_image::oci::{derive_reference, ImportOptions};
use dsec_image::{BuildOptions, ImageConfig, Manifest, NoProgress, Reference, ResolvedImage};

use crate::agent_io::{self, Exec};
use crate::blocking;
use crate::cache::{digest_path, Key, CACHE_REPOSITORY};
use crate::context::Source;
use crate::copy::{parse_chmod, resolve_owner, ArchiveOut, Layout, Owner};
use crate::dockerfile::{CopySpec, Instruction, Step};
use crate::engine::Run;
use crate::error::BuildError;
use crate::ignore::has_wildcards;
use crate::stage::{resolve_in, StageState};

/// A tar archive with no entries: extracting it creates the target
/// directory (a pending WORKDIR) and nothing else.
const EMPTY_TAR: [u8; 1024] = [0; 1024];

/// A URL that `ADD` downloads is at most this large.
const MAX_DOWNLOAD: u64 = 4 << 30;

/// Carries out a filesystem step (RUN, COPY, ADD, or the creation of a
/// pending WORKDIR); returns whether its result came from the cache.
pub(crate) async fn filesystem(run: &Run<'_>, state: &mut StageState, step: &Step) -> Result<bool, BuildError> {
    let fail = |message: String| BuildError::Step { line: step.line, text: step.text.clone(), message };
    let word = |raw: &str| state.expand(raw, run.escape).map_err(|source| BuildError::Word { line: step.line, source });
    // What the step is, for its cache key, and what it needs to run.
    let (descriptor, action) = match &step.instruction {
        Instruction::Run { command, network } => {
            let argv = state.argv(command);
            let rules = match network.as_deref() {
                None | Some("default") => None,
                Some("none") => Some(BTreeMap::new()),
                Some(other) => return Err(fail(format!("RUN --network={other} is not supported (none or default)"))),
            };
            let d = format!(
                "RUN {argv:?}\nenv {:?}\nuser {}\ncwd {}\nnetwork {:?}",
                state.run_env(),
                state.config.user,
                state.config.workdir,
                network
            );
            (d, Action::Run { argv, rules })
        }
        Instruction::Copy(spec) => {
            let plan = CopyPlan::new(run, state, spec, &word, &fail).await?;
            (plan.descriptor(), Action::Copy(Box::new(plan)))
        }
        Instruction::Workdir(_) => (format!("WORKDIR-CREATE {}", state.config.workdir), Action::Nothing),
        _ => return Err(fail("not a filesystem step".into())),
    };
    let key = state.key.then(&descriptor);
    let reference = key.reference();
    let store = run.builder.store().clone();
    if !run.req.no_cache {
        if let Some(found) = blocking(move || store.resolve(&reference).ok()).await? {
            adopt(state, key, &found);
            return Ok(true);
        }
    }

    let network = match &action {
        Action::Run { rules, .. } => rules.clone(),
        _ => Some(BTreeMap::new()),
    };
    let t0 = std::time::Instant::now();
    let sandbox = StepSandbox::create(run, &state.image, network, step).await?;
    let created = t0.elapsed();
    let edge_err = |source| BuildError::Edge { line: step.line, text: step.text.clone(), source };
    if state.workdir_pending {
        agent_io::tar_in(run.builder.edge(), run.caller, &sandbox.id, &state.config.workdir, &EMPTY_TAR).await.map_err(edge_err)?;
    }
    match action {
        Action::Run { argv, .. } => {
            let e = Exec {
                argv,
                env: state.run_env(),
                cwd: &state.config.workdir,
                user: &state.config.user,
                timeout_ms: run.req.step_timeout_s.map(|s| s * 1000),
            };
            let r = agent_io::exec(run.builder.edge(), run.caller, &sandbox.id, e).await.map_err(edge_err)?;
            if r.exit_code != Some(0) {
                let how = match (r.exit_code, r.signal, r.timed_out) {
                    (_, _, true) => "timed out".to_string(),
                    (Some(c), _, _) => format!("exited with status {c}"),
                    (None, Some(s), _) => format!("was killed by signal {s}"),
                    (None, None, _) => "failed".to_string(),
                };
                let output = tail(&r.stdout, &r.stderr);
                return Err(BuildError::RunFailed { line: step.line, text: step.text.clone(), how, output });
            }
        }
        Action::Copy(plan) => plan.apply(run, &sandbox.id, step).await?,
        Action::Nothing => {}
    }
    let reference = key.reference();
    let pack = PackRequest { name: reference.clone(), scrub: Some(vec![]) };
    let ran = t0.elapsed();
    let packed = run.builder.edge().pack_diff(run.caller, &sandbox.id, pack).await.map_err(edge_err)?;
    let t_pack = t0.elapsed();
    sandbox.remove().await;
    tracing::debug!(
        build = %run.build_id, line = step.line, create_ms = created.as_millis() as u64, step_ms = (ran - created).as_millis() as u64,
        pack_copy_ms = packed.copy_ms as u64, pack_build_ms = packed.build_ms as u64, pack_ms = (t_pack - ran).as_millis() as u64,
        delete_ms = (t0.elapsed() - t_pack).as_millis() as u64, entries = packed.stats.entries, bytes = packed.stats.bytes,
        "build step"
    );
    // The step's image carries the config as of this step.
    let (store, config) = (run.builder.store().clone(), state.config.clone());
    let found = blocking(move || -> Result<Arc<ResolvedImage>, String> {
        let r: Reference = reference.parse().map_err(|e: dsec_image::ReferenceError| e.to_string())?;
        let mut m = store.stored_manifest(&r).map_err(|e| e.to_string())?;
        m.config = config;
        store.put_image(&r, &m).map_err(|e| e.to_string())?;
        store.resolve_ref(&r).map_err(|e| e.to_string())
    })
    .await?
    .map_err(BuildError::Store)?;
    adopt(state, key, &found);
    Ok(false)
}

fn adopt(state: &mut StageState, key: Key, found: &ResolvedImage) {
    state.layers = found.manifest.layers.clone();
    state.image = found.reference.to_string();
    state.key = key;
    state.workdir_pending = false;
}

enum Action {
    Run { argv: Vec<String>, rules: Option<BTreeMap<String, bool>> },
    Copy(Box<CopyPlan>),
    Nothing,
}

/// The last few KiB a failing command printed, for its error message.
fn tail(stdout: &[u8], stderr: &[u8]) -> String {
    const KEEP: usize = 4096;
    let mut out = String::new();
    for (name, data) in [("stdout", stdout), ("stderr", stderr)] {
        if data.is_empty() {
            continue;
        }
        let start = data.len().saturating_sub(KEEP);
        let text = String::from_utf8_lossy(&data[start..]);
        out.push_str(&format!("\n--- {name}{} ---\n{}", if start > 0 { " (end)" } else { "" }, text.trim_end()));
    }
    out
}

/// A sandbox of one step, deleted when the step is done with it, and also
/// if the build is dropped half-way (a cancelled request).
pub(crate) struct StepSandbox {
    edge: Edge,
    caller: Caller,
    pub id: String,
    removed: bool,
}

impl StepSandbox {
    pub async fn create(
        run: &Run<'_>,
        image: &str,
        network: Option<BTreeMap<String, bool>>,
        step: &Step,
    ) -> Result<StepSandbox, BuildError> {
        let req = run.sandbox_request(image, network);
        let (edge, caller) = (run.builder.edge().clone(), run.caller.clone());
        // The creation runs on its own: if the build is dropped while it
        // runs, nobody takes the sandbox, and the task deletes it.
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let created = edge.create(&caller, req).await;
            if let Err(Ok(unclaimed)) = tx.send(created) {
                if let Err(e) = edge.delete(&caller, &unclaimed.id).await {
                    tracing::warn!(sandbox = %unclaimed.id, error = %e, "deleting a cancelled build step's sandbox failed");
                }
            }
        });
        let created = rx.await.map_err(|_| BuildError::Store("a sandbox creation task ended without an answer".into()))?;
        let record = created.map_err(|source| BuildError::Edge { line: step.line, text: step.text.clone(), source })?;
        Ok(StepSandbox { edge: run.builder.edge().clone(), caller: run.caller.clone(), id: record.id, removed: false })
    }

    pub async fn remove(mut self) {
        self.removed = true;
        if let Err(e) = self.edge.delete(&self.caller, &self.id).await {
            tracing::warn!(sandbox = %self.id, error = %e, "deleting a build step's sandbox failed");
        }
    }
}

impl Drop for StepSandbox {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let (edge, caller, id) = (self.edge.clone(), self.caller.clone(), std::mem::take(&mut self.id));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = edge.delete(&caller, &id).await {
                    tracing::warn!(sandbox = %id, error = %e, "deleting a cancelled build step's sandbox failed");
                }
            });
        }
    }
}

/// The image of `FROM scratch`: one empty layer (a sandbox needs a root to
/// overlay), made once per node.
pub(crate) async fn scratch_image(builder: &crate::engine::Builder) -> Result<String, BuildError> {
    let store = builder.store().clone();
    let scratch = builder.scratch().to_path_buf();
    blocking(move || -> Result<String, String> {
        let r: Reference = format!("{CACHE_REPOSITORY}/scratch:latest").parse().map_err(|e: dsec_image::ReferenceError| e.to_string())?;
        if store.contains(&r) {
            return Ok(r.to_string());
        }
        std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
        let empty = tempfile::tempdir_in(&scratch).map_err(|e| e.to_string())?;
        let _lock = store.write_lock().map_err(|e| e.to_string())?;
        let layer = dsec_image::build::build_layer_from_dir(&store, empty.path(), &BuildOptions::default(), &NoProgress)
            .map_err(|e| e.to_string())?;
        let desc = dsec_image::LayerDescriptor { digest: layer.digest, kind: dsec_image::LayerKind::Base, size: layer.size };
        let mut config = ImageConfig::default();
        config.env.retain(|e| e.starts_with("PATH="));
        store.put_image(&r, &Manifest::new(vec![desc], config)).map_err(|e| e.to_string())?;
        Ok(r.to_string())
    })
    .await?
    .map_err(BuildError::Store)
}

/// A `FROM` or `COPY --from` image: this node's, else pulled from its
/// registry under the same name.
pub(crate) async fn resolve_image(builder: &crate::engine::Builder, name: &str, line: usize) -> Result<Arc<ResolvedImage>, BuildError> {
    let store = builder.store().clone();
    let name = name.to_string();
    blocking(move || {
        if let Ok(found) = store.resolve(&name) {
            return Ok(found);
        }
        let local = name.parse::<Reference>().ok().or_else(|| derive_reference(&name).ok());
        let options = ImportOptions { reference: local, ..ImportOptions::default() };
        match pull(&store, &name, &RegistryOptions::default(), &options, &NoProgress) {
            Ok(imported) => Ok(imported.image),
            Err(e) => Err(BuildError::Step {
                line,
                text: format!("FROM {name}"),
                message: format!("{name} is not an image of this node, and pulling it failed: {e}"),
            }),
        }
    })
    .await?
}

/// What a COPY or ADD copies, resolved before its cache lookup.
pub(crate) struct CopyPlan {
    add: bool,
    dest_raw: String,
    dest: String,
    owner_spec: Option<String>,
    chmod: Option<u32>,
    sources: Sources,
}

enum Sources {
    /// Context entries (and downloads of ADD), each with its digest.
    Context(Vec<(Source, String)>),
    /// Paths of an earlier stage's (or an image's) filesystem.
    Image { image: String, identity: String, paths: Vec<String> },
}

impl CopyPlan {
    async fn new(
        run: &Run<'_>,
        state: &StageState,
        spec: &CopySpec,
        word: &(dyn Fn(&str) -> Result<String, BuildError> + Sync),
        fail: &(dyn Fn(String) -> BuildError + Sync),
    ) -> Result<CopyPlan, BuildError> {
        let what = if spec.add { "ADD" } else { "COPY" };
        let dest_raw = word(&spec.dest)?;
        let dest = resolve_in(&state.config.workdir, &dest_raw);
        let owner_spec = spec.chown.as_deref().map(word).transpose()?;
        let chmod = spec.chmod.as_deref().map(|c| word(c).and_then(|c| parse_chmod(&c).map_err(fail))).transpose()?;
        let words: Vec<String> = spec.sources.iter().map(|s| word(s)).collect::<Result<_, _>>()?;
        let sources = match spec.from.as_deref() {
            None => {
                let mut found = Vec::new();
                for w in &words {
                    if spec.add && (w.starts_with("http://") || w.starts_with("https://")) {
                        let source = download(run, w).await.map_err(|e| fail(format!("ADD {w}: {e}")))?;
                        found.push(source);
                        continue;
                    }
                    if w.starts_with("http://") || w.starts_with("https://") {
                        return Err(fail(format!("COPY cannot fetch {w}: use ADD for URLs")));
                    }
                    found.extend(run.ctx.sources(w).map_err(|e| fail(format!("{what}: {e}")))?);
                }
                let mut with_digests = Vec::new();
                for s in found {
                    let path = s.path.clone();
                    let digest = blocking(move || digest_path(&path)).await??;
                    with_digests.push((s, digest));
                }
                if with_digests.len() > 1 && !says_dir(&dest_raw) {
                    return Err(fail(format!("{what} with more than one source needs a destination directory ending in '/'")));
                }
                Sources::Context(with_digests)
            }
            Some(from) => {
                let (image, identity) = from_image(run, from, fail).await?;
                let mut paths = Vec::new();
                for w in &words {
                    if has_wildcards(w) {
                        return Err(fail(format!("{what} --from: wildcards in {w:?} are not supported; name the path")));
                    }
                    paths.push(resolve_in("/", w));
                }
                if paths.len() > 1 && !says_dir(&dest_raw) {
                    return Err(fail(format!("{what} with more than one source needs a destination directory ending in '/'")));
                }
                Sources::Image { image, identity, paths }
            }
        };
        Ok(CopyPlan { add: spec.add, dest_raw, dest, owner_spec, chmod, sources })
    }

    fn descriptor(&self) -> String {
        let sources = match &self.sources {
            Sources::Context(list) => list.iter().map(|(s, d)| format!("{} {d}", s.rel)).collect::<Vec<_>>().join("\n"),
            Sources::Image { identity, paths, .. } => format!("from {identity}\n{}", paths.join("\n")),
        };
        format!(
            "COPY add={} dest={} as {} owner={:?} chmod={:?}\n{sources}",
            self.add, self.dest_raw, self.dest, self.owner_spec, self.chmod
        )
    }

    async fn apply(self, run: &Run<'_>, id: &str, step: &Step) -> Result<(), BuildError> {
        let edge = run.builder.edge();
        let edge_err = |source| BuildError::Edge { line: step.line, text: step.text.clone(), source };
        let fail = |message: String| BuildError::Step { line: step.line, text: step.text.clone(), message };
        let owner = match &self.owner_spec {
            None => Owner::default(),
            Some(spec) => {
                let read = |p: &'static str| async move {
                    agent_io::read_small(edge, run.caller, id, p)
                        .await
                        .map(|b| b.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default())
                };
                let (passwd, group) = (read("/etc/passwd").await.map_err(edge_err)?, read("/etc/group").await.map_err(edge_err)?);
                resolve_owner(spec, &passwd, &group).map_err(fail)?
            }
        };
        let existing = agent_io::stat(edge, run.caller, id, &self.dest).await.map_err(edge_err)?;
        let dest_is_dir = matches!(existing.as_ref().map(|s| s.kind), Some(FileKind::Dir));
        let mut out = ArchiveOut::new(owner, self.chmod);
        match &self.sources {
            Sources::Context(list) => {
                let archive_source = |s: &Source| self.add && !s.is_dir && is_local_archive(&s.path);
                let into_dir =
                    says_dir(&self.dest_raw) || dest_is_dir || list.len() > 1 || list.iter().any(|(s, _)| s.is_dir || archive_source(s));
                let layout = Layout::new(&self.dest, into_dir);
                if into_dir && existing.is_none() && !layout.prefix.is_empty() {
                    out.dir(&layout.prefix, 0o755)?;
                }
                for (s, _) in list {
                    if s.is_dir {
                        out.add_contents(&layout.prefix, &s.path)?;
                    } else if archive_source(s) {
                        let bytes = decompressed(&s.path).map_err(|e| fail(format!("ADD {}: {e}", s.rel)))?;
                        out.add_archive(&bytes, &|inner| layout.inside(inner))?;
                    } else {
                        let base = s.rel.rsplit('/').next().unwrap_or(&s.rel);
                        out.add_path(&layout.name(false, base, ""), &s.path)?;
                    }
                }
                let archive = out.finish()?;
                agent_io::tar_in(edge, run.caller, id, &layout.target, &archive).await.map_err(edge_err)?;
            }
            Sources::Image { image, paths, .. } => {
                let source = StepSandbox::create(run, image, Some(BTreeMap::new()), step).await?;
                let mut kinds = Vec::new();
                for p in paths {
                    let st = agent_io::stat(edge, run.caller, &source.id, p).await.map_err(edge_err)?;
                    let Some(st) = st else { return Err(fail(format!("{p} does not exist in the --from stage or image"))) };
                    kinds.push(st.kind == FileKind::Dir);
                }
                let into_dir = says_dir(&self.dest_raw) || dest_is_dir || paths.len() > 1 || kinds.iter().any(|d| *d);
                let layout = Layout::new(&self.dest, into_dir);
                if into_dir && existing.is_none() && !layout.prefix.is_empty() {
                    out.dir(&layout.prefix, 0o755)?;
                }
                for (p, is_dir) in paths.iter().zip(kinds) {
                    let archive = agent_io::tar_out(edge, run.caller, &source.id, p).await.map_err(edge_err)?;
                    let base = p.rsplit('/').next().unwrap_or(p).to_string();
                    let rename = |inner: &str| if is_dir { layout.inside(inner) } else { layout.name(false, &base, "") };
                    out.add_archive(&archive, &rename)?;
                }
                source.remove().await;
                let archive = out.finish()?;
                agent_io::tar_in(edge, run.caller, id, &layout.target, &archive).await.map_err(edge_err)?;
            }
        }
        Ok(())
    }
}

/// A destination written as a directory.
fn says_dir(dest: &str) -> bool {
    dest.ends_with('/') || dest == "." || dest.ends_with("/.")
}

/// The image a `COPY --from` reads: an earlier stage's state, or an image.
async fn from_image(run: &Run<'_>, from: &str, fail: &(dyn Fn(String) -> BuildError + Sync)) -> Result<(String, String), BuildError> {
    let lower = from.to_ascii_lowercase();
    let stage = run
        .file
        .stages
        .iter()
        .position(|s| s.name.as_deref() == Some(lower.as_str()))
        .or_else(|| from.parse::<usize>().ok().filter(|i| *i < run.file.stages.len()));
    if let Some(i) = stage {
        let built = run.built.get(&i).ok_or_else(|| fail(format!("--from={from} names a stage that is not built before this one")))?;
        return Ok((built.image.clone(), built.key.0.clone()));
    }
    let image = resolve_image(run.builder, from, 0).await?;
    let identity = serde_json::to_string(&image.manifest.layers).unwrap_or_default();
    Ok((image.reference.to_string(), identity))
}

/// A tar archive, plain or gzip-compressed, that `ADD` unpacks.
fn is_local_archive(path: &std::path::Path) -> bool {
    let mut head = [0u8; 512];
    let Ok(mut f) = std::fs::File::open(path) else { return false };
    let n = f.read(&mut head).unwrap_or(0);
    if n >= 2 && head[..2] == [0x1f, 0x8b] {
        return true;
    }
    n >= 262 && &head[257..262] == b"ustar"
}

fn decompressed(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let bytes = std::fs::read(path)?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut out)?;
        return Ok(out);
    }
    Ok(bytes)
}

/// Downloads an `ADD` URL into the build's scratch directory (mode 0600,
/// as Docker gives it).
async fn download(run: &Run<'_>, url: &str) -> Result<Source, String> {
    let name = url.split(['?', '#']).next().unwrap_or(url).rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or("download").to_string();
    // Removed with the build's download directory when the build ends.
    let dir = tempfile::tempdir_in(run.downloads.path()).map_err(|e| e.to_string())?.keep();
    let path = dir.join(&name);
    let (url, dest) = (url.to_string(), path.clone());
    blocking(move || -> Result<(), String> {
        let resp = ureq::get(&url).call().map_err(|e| e.to_string())?;
        let mut file = std::fs::File::create(&dest).map_err(|e| e.to_string())?;
        let n = std::io::copy(&mut resp.into_reader().take(MAX_DOWNLOAD + 1), &mut file).map_err(|e| e.to_string())?;
        if n > MAX_DOWNLOAD {
            return Err(format!("larger than {MAX_DOWNLOAD} bytes"));
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600)).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())??;
    Ok(Source { rel: name, path, is_dir: false })
}
