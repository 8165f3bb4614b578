//! The builder: stages in order, each step either found in the step cache
//! or carried out in a fresh container sandbox of the stage so far (RUN
//! executes there, COPY extracts there), whose changes become the step's
//! layer (`pack_diff`). Metadata steps (ENV, USER, LABEL, ...) only change
//! the image config. The sandboxes of a build are deleted when their step
//! ends, whether it succeeded, failed or the build was dropped.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use dsec_edge::model::BackendKind;
use dsec_edge::{Caller, Edge, SandboxRequest};
use dsec_image::{ImageConfig, ImageStore, Manifest, Provenance, Reference};
use tokio::sync::mpsc::UnboundedSender;

use crate::cache::{Key, CACHE_REPOSITORY};
use crate::context::Context;
use crate::dockerfile::{self, Dockerfile, Instruction, Stage, Step};
use crate::error::BuildError;
use crate::stage::StageState;

/// The label every sandbox of a build carries, its value the build's id:
/// what finds a build's sandboxes (and keeps quota accounting from counting
/// them twice: the build holds its project's quota for them).
pub const BUILD_LABEL: &str = "dsec.build";

/// What to build.
#[derive(Debug, Clone, Default)]
pub struct BuildRequest {
    /// `name[:tag]` of the image.
    pub name: String,
    /// `--build-arg`s.
    pub build_args: BTreeMap<String, String>,
    /// The stage to build (name or index); default the last.
    pub target: Option<String>,
    /// Run every step even where the cache holds its result.
    pub no_cache: bool,
    /// Network rules of RUN steps; `None`: the node's named services (so
    /// package managers reach the mirrors the node is configured with).
    pub network_rules: Option<BTreeMap<String, bool>>,
    /// Limits of each step's sandbox; `None`: the node's defaults.
    pub memory_mb: Option<u64>,
    pub cpu_cores: Option<f64>,
    pub disk_mb: Option<u64>,
    /// Longest a RUN step may take.
    pub step_timeout_s: Option<u64>,
}

/// Progress, in order.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BuildEvent {
    /// A step begins. `step` counts from 1 over the steps of the stages
    /// built, `FROM` lines included.
    Step { step: usize, steps: usize, stage: usize, line: usize, text: String },
    /// It ended; `cached`: its result came from the step cache.
    StepDone { step: usize, cached: bool, ms: f64 },
}

/// The finished image.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BuildSummary {
    pub image: String,
    pub layers: usize,
    pub size_bytes: u64,
    pub steps: usize,
    pub cached_steps: usize,
    pub ms: f64,
}

pub struct Builder {
    edge: Edge,
    store: Arc<ImageStore>,
    /// Where contexts are unpacked.
    scratch: PathBuf,
}

/// The steps a build goes through, for numbering progress.
pub(crate) struct Progress<'a> {
    events: &'a UnboundedSender<BuildEvent>,
    pub step: usize,
    pub steps: usize,
    pub cached: usize,
    started: Instant,
}

impl Progress<'_> {
    fn begin(&mut self, stage: usize, line: usize, text: &str) {
        self.step += 1;
        self.started = Instant::now();
        // A heredoc's body stays out of the progress line.
        let text = text.lines().next().unwrap_or("").to_string();
        let _ = self.events.send(BuildEvent::Step { step: self.step, steps: self.steps, stage, line, text });
    }

    fn end(&mut self, cached: bool) {
        if cached {
            self.cached += 1;
        }
        let ms = self.started.elapsed().as_secs_f64() * 1e3;
        let _ = self.events.send(BuildEvent::StepDone { step: self.step, cached, ms });
    }
}

pub(crate) struct Run<'a> {
    pub builder: &'a Builder,
    pub caller: &'a Caller,
    pub req: &'a BuildRequest,
    pub ctx: &'a Context,
    pub file: &'a Dockerfile,
    pub escape: char,
    pub global_args: BTreeMap<String, String>,
    /// Finished stages by index, for `FROM stage` and `COPY --from`.
    pub built: BTreeMap<usize, StageState>,
    pub build_id: String,
    /// Where `ADD` puts what it downloads; removed when the build ends.
    pub downloads: tempfile::TempDir,
}

impl Builder {
    pub fn new(edge: Edge, store: Arc<ImageStore>, scratch: PathBuf) -> Builder {
        Builder { edge, store, scratch }
    }

    pub fn edge(&self) -> &Edge {
        &self.edge
    }

    pub fn store(&self) -> &Arc<ImageStore> {
        &self.store
    }

    pub fn scratch(&self) -> &std::path::Path {
        &self.scratch
    }

    /// Builds `req.name` from `ctx`. Dropping the future cancels the build:
    /// the sandbox of the running step is deleted.
    pub async fn build(
        &self,
        caller: &Caller,
        req: &BuildRequest,
        ctx: &Context,
        events: &UnboundedSender<BuildEvent>,
    ) -> Result<BuildSummary, BuildError> {
        let t0 = Instant::now();
        let reference: Reference = req.name.parse().map_err(|e| BuildError::Invalid(format!("image name {:?}: {e}", req.name)))?;
        if reference.name() == CACHE_REPOSITORY || reference.name().starts_with(&format!("{CACHE_REPOSITORY}/")) {
            return Err(BuildError::Invalid(format!("image names under {CACHE_REPOSITORY}/ belong to the step cache")));
        }
        let file = dockerfile::parse(ctx.dockerfile())?;
        let escape = dockerfile::parse::escape_char(ctx.dockerfile());
        let target = target_stage(&file, req.target.as_deref())?;
        let needed = needed_stages(&file, target);
        let steps = needed.iter().map(|&i| file.stages[i].steps.len() + 1).sum();
        let mut run = Run {
            builder: self,
            caller,
            req,
            ctx,
            file: &file,
            escape,
            global_args: global_args(&file, &req.build_args, escape)?,
            built: BTreeMap::new(),
            // A sandbox id's random part: unique across builds and nodes.
            build_id: dsec_edge::ids::short_id(&dsec_edge::ids::new_sandbox_id("build")).to_string(),
            downloads: downloads_dir(&self.scratch)?,
        };
        let mut progress = Progress { events, step: 0, steps, cached: 0, started: Instant::now() };
        for &i in &needed {
            let state = run.stage(&file.stages[i], &mut progress).await?;
            run.built.insert(i, state);
        }
        let state = run.built.remove(&target).ok_or_else(|| BuildError::Invalid("the target stage was not built".into()))?;
        let mut manifest = Manifest::new(state.layers.clone(), state.config.clone());
        manifest.provenance = Some(Provenance {
            built_by: caller.tenant.clone(),
            sandbox: format!("dockerfile build {}", run.build_id),
            base_image: state.base.clone(),
            previous: None,
            scrubbed: vec![],
        });
        let store = self.store.clone();
        let (r, m) = (reference.clone(), manifest.clone());
        crate::blocking(move || store.put_image(&r, &m)).await?.map_err(|e| BuildError::Store(e.to_string()))?;
        Ok(BuildSummary {
            image: reference.to_string(),
            layers: manifest.layers.len(),
            size_bytes: manifest.size_bytes,
            steps: progress.step,
            cached_steps: progress.cached,
            ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }
}

impl Run<'_> {
    async fn stage(&mut self, stage: &Stage, progress: &mut Progress<'_>) -> Result<StageState, BuildError> {
        progress.begin(stage.index, stage.line, &format!("FROM {}", stage.base));
        let base = crate::dockerfile::words::expand_with(&stage.base, &|n| self.global_args.get(n).cloned(), self.escape)
            .map_err(|source| BuildError::Word { line: stage.line, source })?;
        let mut state = self.base_state(&base, stage).await?;
        progress.end(true);
        for step in &stage.steps {
            progress.begin(stage.index, step.line, &step.text);
            let cached = self.step(&mut state, step).await?;
            progress.end(cached);
        }
        if state.workdir_pending {
            // A WORKDIR that no later step needed still exists in the image.
            let step = Step {
                line: stage.line,
                text: format!("(create WORKDIR {})", state.config.workdir),
                instruction: Instruction::Workdir(String::new()),
            };
            crate::steps::filesystem(self, &mut state, &step).await?;
        }
        Ok(state)
    }

    /// Carries out one step; returns whether its result came from the cache.
    async fn step(&mut self, state: &mut StageState, step: &Step) -> Result<bool, BuildError> {
        let word =
            |state: &StageState, raw: &str| state.expand(raw, self.escape).map_err(|source| BuildError::Word { line: step.line, source });
        let invalid = |message: String| BuildError::Step { line: step.line, text: step.text.clone(), message };
        let fold = |state: &mut StageState, what: String| state.key = state.key.then(&what);
        match &step.instruction {
            Instruction::Env(pairs) => {
                for (k, v) in pairs {
                    let v = word(state, v)?;
                    state.set_env(k, &v);
                    fold(state, format!("ENV {k}={v}"));
                }
            }
            Instruction::Arg(decls) => {
                for d in decls {
                    let value = match (self.req.build_args.get(&d.name), &d.default, self.global_args.get(&d.name)) {
                        (Some(v), _, _) => Some(v.clone()),
                        (None, Some(default), _) => Some(word(state, default)?),
                        (None, None, Some(global)) => Some(global.clone()),
                        (None, None, None) => None,
                    };
                    if let Some(v) = value {
                        fold(state, format!("ARG {}={v}", d.name));
                        state.args.insert(d.name.clone(), v);
                    }
                }
            }
            Instruction::Workdir(raw) => {
                let w = word(state, raw)?;
                state.set_workdir(&w);
                fold(state, format!("WORKDIR {}", state.config.workdir));
            }
            Instruction::User(raw) => {
                let u = word(state, raw)?;
                if u.is_empty() {
                    return Err(invalid("USER needs a user".into()));
                }
                fold(state, format!("USER {u}"));
                state.config.user = u;
            }
            Instruction::Label(pairs) => {
                for (k, v) in pairs {
                    let (k, v) = (word(state, k)?, word(state, v)?);
                    fold(state, format!("LABEL {k}={v}"));
                    state.config.labels.insert(k, v);
                }
            }
            Instruction::Expose(ports) => {
                for p in ports {
                    let p = word(state, p)?;
                    let p = if p.contains('/') { p } else { format!("{p}/tcp") };
                    if !state.config.exposed_ports.contains(&p) {
                        state.config.exposed_ports.push(p.clone());
                    }
                    fold(state, format!("EXPOSE {p}"));
                }
            }
            Instruction::Entrypoint(c) => {
                state.set_entrypoint(c);
                fold(state, format!("ENTRYPOINT {:?}", state.config.entrypoint));
            }
            Instruction::Cmd(c) => {
                state.set_cmd(c);
                fold(state, format!("CMD {:?}", state.config.cmd));
            }
            Instruction::Healthcheck(h) => {
                state.set_healthcheck(h).map_err(invalid)?;
                fold(state, format!("HEALTHCHECK {:?}", state.config.healthcheck));
            }
            Instruction::Shell(s) => {
                if s.is_empty() {
                    return Err(invalid("SHELL needs at least the shell's path".into()));
                }
                state.config.shell = Some(s.clone());
                fold(state, format!("SHELL {s:?}"));
            }
            Instruction::StopSignal(raw) => {
                let s = word(state, raw)?;
                fold(state, format!("STOPSIGNAL {s}"));
                state.config.stop_signal = Some(s);
            }
            Instruction::Volume(paths) => {
                for p in paths {
                    let p = word(state, p)?;
                    fold(state, format!("VOLUME {p}"));
                    if !state.config.volumes.contains(&p) {
                        state.config.volumes.push(p);
                    }
                }
            }
            Instruction::Run { .. } | Instruction::Copy(_) => return crate::steps::filesystem(self, state, step).await,
        }
        Ok(true)
    }

    /// The state a stage starts from.
    async fn base_state(&mut self, base: &str, stage: &Stage) -> Result<StageState, BuildError> {
        let fresh = |layers, config: ImageConfig, image: String, key: Key| StageState {
            layers,
            config,
            image,
            args: BTreeMap::new(),
            key,
            workdir_pending: false,
            cmd_set: false,
            base: base.to_string(),
        };
        let lower = base.to_ascii_lowercase();
        let earlier = self.file.stages[..stage.index].iter().position(|s| s.name.as_deref() == Some(lower.as_str()));
        if let Some(i) = earlier {
            let earlier = self.built.get(&i).ok_or_else(|| BuildError::Invalid(format!("stage {base} was not built")))?;
            let mut s = earlier.clone();
            s.args.clear();
            s.workdir_pending = false;
            s.cmd_set = false;
            s.base = base.to_string();
            return Ok(s);
        }
        if lower == "scratch" {
            let image = crate::steps::scratch_image(self.builder).await?;
            let mut config = ImageConfig::default();
            config.env.retain(|e| e.starts_with("PATH="));
            return Ok(fresh(vec![], config, image, Key::root("scratch")));
        }
        let resolved = crate::steps::resolve_image(self.builder, base, stage.line).await?;
        let what = serde_json::to_string(&(&resolved.manifest.layers, &resolved.manifest.config)).unwrap_or_default();
        Ok(fresh(resolved.manifest.layers.clone(), resolved.manifest.config.clone(), resolved.reference.to_string(), Key::root(&what)))
    }

    /// A sandbox request for a step of this build.
    pub(crate) fn sandbox_request(&self, image: &str, network: Option<BTreeMap<String, bool>>) -> SandboxRequest {
        let rules = network.or_else(|| self.req.network_rules.clone()).unwrap_or_else(|| self.node_services());
        SandboxRequest {
            backend: Some(BackendKind::Container),
            image: image.to_string(),
            memory_mb: self.req.memory_mb,
            cpu_cores: self.req.cpu_cores,
            disk_mb: self.req.disk_mb,
            init_user: Some("root".into()),
            labels: BTreeMap::from([(BUILD_LABEL.to_string(), self.build_id.clone())]),
            network_rules: rules,
            ..Default::default()
        }
    }

    /// The node's named services, all allowed: the default network of a
    /// RUN step.
    fn node_services(&self) -> BTreeMap<String, bool> {
        match &self.builder.edge.config().network {
            Some(n) => n.services.keys().map(|k| (k.clone(), true)).collect(),
            None => BTreeMap::new(),
        }
    }
}

fn downloads_dir(scratch: &std::path::Path) -> Result<tempfile::TempDir, BuildError> {
    std::fs::create_dir_all(scratch).map_err(crate::error::io_err("creating", scratch))?;
    tempfile::Builder::new().prefix("downloads-").tempdir_in(scratch).map_err(crate::error::io_err("creating a directory in", scratch))
}

/// Global `ARG`s: build arguments override their defaults.
fn global_args(file: &Dockerfile, given: &BTreeMap<String, String>, escape: char) -> Result<BTreeMap<String, String>, BuildError> {
    let mut args = BTreeMap::new();
    for d in &file.global_args {
        let value = match (given.get(&d.name), &d.default) {
            (Some(v), _) => Some(v.clone()),
            (None, Some(raw)) => Some(
                crate::dockerfile::words::expand_with(raw, &|n| args.get(n).cloned(), escape)
                    .map_err(|source| BuildError::Word { line: 1, source })?,
            ),
            (None, None) => None,
        };
        if let Some(v) = value {
            args.insert(d.name.clone(), v);
        }
    }
    Ok(args)
}

/// The index of the stage `target` names (by name or index); the last one
/// by default.
fn target_stage(file: &Dockerfile, target: Option<&str>) -> Result<usize, BuildError> {
    let Some(t) = target else { return Ok(file.stages.len() - 1) };
    let lower = t.to_ascii_lowercase();
    file.stages
        .iter()
        .position(|s| s.name.as_deref() == Some(lower.as_str()))
        .or_else(|| t.parse::<usize>().ok().filter(|i| *i < file.stages.len()))
        .ok_or_else(|| BuildError::Invalid(format!("the Dockerfile has no stage {t:?}")))
}

/// The stages `target` needs (through `FROM stage` and `COPY --from`), in
/// order, itself last.
fn needed_stages(file: &Dockerfile, target: usize) -> Vec<usize> {
    let by_ref = |r: &str, before: usize| -> Option<usize> {
        let lower = r.to_ascii_lowercase();
        file.stages[..before]
            .iter()
            .position(|s| s.name.as_deref() == Some(lower.as_str()))
            .or_else(|| r.parse::<usize>().ok().filter(|i| *i < before))
    };
    let mut need = vec![false; file.stages.len()];
    let mut todo = vec![target];
    while let Some(i) = todo.pop() {
        if std::mem::replace(&mut need[i], true) {
            continue;
        }
        let s = &file.stages[i];
        if let Some(j) = by_ref(&s.base, i) {
            todo.push(j);
        }
        for step in &s.steps {
            if let Instruction::Copy(c) = &step.instruction {
                if let Some(j) = c.from.as_deref().and_then(|f| by_ref(f, i)) {
                    todo.push(j);
                }
            }
        }
    }
    (0..file.stages.len()).filter(|&i| need[i]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_stages_a_target_needs_are_built() {
        let file = dockerfile::parse(
            "FROM busybox AS tools\nRUN true\nFROM busybox AS unused\nRUN false\nFROM busybox AS build\nCOPY --from=tools /bin/x /x\nFROM build\nRUN true\n",
        )
        .unwrap();
        assert_eq!(needed_stages(&file, 3), vec![0, 2, 3]);
        assert_eq!(target_stage(&file, Some("unused")).unwrap(), 1);
        assert_eq!(target_stage(&file, None).unwrap(), 3);
        assert!(target_stage(&file, Some("nope")).is_err());
    }

    #[test]
    fn global_args_take_build_arguments() {
        let file = dockerfile::parse("ARG BASE=busybox\nARG TAG=${BASE}-1\nFROM $BASE\n").unwrap();
        let args = global_args(&file, &BTreeMap::new(), '\\').unwrap();
        assert_eq!(args.get("TAG").map(String::as_str), Some("busybox-1"));
        let given = BTreeMap::from([("BASE".to_string(), "python".to_string())]);
        let args = global_args(&file, &given, '\\').unwrap();
        assert_eq!(args.get("TAG").map(String::as_str), Some("python-1"));
    }
}
