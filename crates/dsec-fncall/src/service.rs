//! The node's FnCall service: validates calls, lends runners from the
//! language's pool, compiles (or reuses a cached program), runs, judges.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use dsec_api::{CaseResult, FnCallPools, FnCallRequest, FnCallResponse, RunStatus, StepResult, Verdict};
use dsec_edge::histogram::{Histogram, HistogramSnapshot, OPERATION_BOUNDS};
use dsec_edge::{Edge, ListFilter};

use crate::cache::{compile_key, CompileCache};
use crate::compare::outputs_match;
use crate::config::FnCallConfig;
use crate::error::FnCallError;
use crate::judge::{b64, failure_verdict, status_name, step_result, unb64};
use crate::pool::{Lease, Pool};
use crate::protocol::{ZLimits, ZRequest, ZResponse};
use crate::runner::runner_caller;
use crate::sizing;

/// Languages a custom checker may be written in.
const CHECKER_LANGUAGES: &[&str] = &["python", "bash"];
/// Time the edge allows beyond a step's own limit (kill, cleanup, answer).
const ANSWER_SLACK: Duration = Duration::from_secs(15);
/// Compilers need far more address space than the programs they build;
/// the runner's memory cgroup bounds them instead.
const COMPILE_OUTPUT_BYTES: u64 = 1 << 20;
const COMPILE_FILE_BYTES: u64 = 256 << 20;
const DEFAULT_TOLERANCE: f64 = 1e-6;
const MAINTAIN_EVERY: Duration = Duration::from_secs(1);
/// Runners a call is tried on: one whose runner fails (its zygote killed,
/// its monitor gone) runs again on another, so that callers get the
/// program's result rather than the runner's fault.
const CALL_ATTEMPTS: u32 = 2;

pub struct FnCallService {
    cfg: Arc<FnCallConfig>,
    edge: Edge,
    /// The ordinary runners of each language.
    pools: BTreeMap<String, Arc<Pool>>,
    /// Pools of bigger runners, by language and runner memory, made when a
    /// call first asks for more memory than an ordinary runner holds.
    sized: Mutex<BTreeMap<(String, u64), Arc<Pool>>>,
    /// The largest sandbox this node makes, MiB: what bounds a call's memory.
    node_max_memory_mb: u64,
    cache: CompileCache,
    /// Calls' latency (queueing included) by language; the languages are
    /// the pools', fixed at start, so no lock is needed to observe.
    latency: BTreeMap<String, Histogram>,
}

/// A validated call: limits resolved, inputs checked.
struct Plan {
    pool: Arc<Pool>,
    compiled: bool,
    time_ms: u64,
    compile_time_ms: u64,
    memory_bytes: u64,
    output_bytes: u64,
    tolerance: f64,
    stop_on_first_failure: bool,
}

impl FnCallService {
    /// Removes runners a previous edge process left behind, then starts the
    /// pools (their minimum runners start in the background).
    pub async fn start(edge: Edge, cfg: FnCallConfig) -> Arc<FnCallService> {
        for rec in edge.list(&runner_caller(), &ListFilter::default()) {
            if let Err(e) = edge.delete(&runner_caller(), &rec.id).await {
                tracing::warn!(runner = %rec.id, error = %e, "removing a leftover runner failed");
            }
        }
        let cfg = Arc::new(cfg);
        let pools = cfg
            .pools
            .iter()
            .map(|p| (p.language.clone(), Pool::new(&p.language, p.min, p.max, cfg.runner_memory_mb, edge.clone(), cfg.clone())))
            .collect();
        let node_max_memory_mb = edge.config().policy.max_memory_mb.min(edge.stats().capacity.memory_mb);
        let latency = cfg.pools.iter().map(|p| (p.language.clone(), Histogram::new(OPERATION_BOUNDS))).collect();
        let svc = Arc::new(FnCallService {
            latency,
            cache: CompileCache::new(cfg.compile_cache_bytes),
            cfg,
            edge,
            pools,
            sized: Mutex::new(BTreeMap::new()),
            node_max_memory_mb,
        });
        let weak: Weak<FnCallService> = Arc::downgrade(&svc);
        tokio::spawn(async move {
            loop {
                let Some(svc) = weak.upgrade() else { return };
                for pool in svc.all_pools() {
                    pool.maintain().await;
                }
                drop(svc);
                tokio::time::sleep(MAINTAIN_EVERY).await;
            }
        });
        svc
    }

    pub fn languages(&self) -> Vec<String> {
        self.pools.keys().cloned().collect()
    }

    pub fn status(&self) -> FnCallPools {
        FnCallPools { pools: self.all_pools().iter().map(|p| p.status()).collect() }
    }

    /// The ordinary pools, then the bigger runners' (by language, size).
    fn all_pools(&self) -> Vec<Arc<Pool>> {
        let sized = self.sized.lock().unwrap_or_else(|p| p.into_inner());
        self.pools.values().chain(sized.values()).cloned().collect()
    }

    /// The pool of `language`'s runners of `runner_mb`, made on first use:
    /// none kept warm, as many at most as the language's ordinary pool.
    fn sized_pool(&self, language: &Arc<Pool>, runner_mb: u64) -> Arc<Pool> {
        let mut sized = self.sized.lock().unwrap_or_else(|p| p.into_inner());
        sized
            .entry((language.language.clone(), runner_mb))
            .or_insert_with(|| Pool::new(&language.language, 0, language.max, runner_mb, self.edge.clone(), self.cfg.clone()))
            .clone()
    }

    /// (entries, bytes, hits, misses) of the compile cache.
    pub fn cache_stats(&self) -> (usize, u64, u64, u64) {
        self.cache.stats()
    }

    /// Runs one call to completion. The call runs in its own task, so a
    /// caller that goes away does not leave a runner half-way through.
    pub async fn call(self: &Arc<Self>, req: FnCallRequest) -> Result<FnCallResponse, FnCallError> {
        let plan = self.validate(&req)?;
        let t0 = Instant::now();
        let language = req.language.clone();
        let svc = self.clone();
        let out = tokio::spawn(async move { svc.run_call(req, plan).await })
            .await
            .map_err(|e| FnCallError::RunnerFailed(format!("call task failed: {e}")))?;
        if let Some(h) = self.latency.get(&language) {
            h.observe(t0.elapsed());
        }
        out
    }

    /// Latency of the calls served so far (validated ones, answered or
    /// failed), by language.
    pub fn latency(&self) -> BTreeMap<String, HistogramSnapshot> {
        self.latency.iter().map(|(l, h)| (l.clone(), h.snapshot())).collect()
    }

    /// Runs many calls at once (each as [`FnCallService::call`]); one result
    /// per call, in order.
    pub async fn batch(self: &Arc<Self>, calls: Vec<FnCallRequest>) -> Result<Vec<Result<FnCallResponse, FnCallError>>, FnCallError> {
        if calls.len() > self.cfg.max_batch {
            return Err(FnCallError::Invalid(format!("a batch holds at most {} calls (got {})", self.cfg.max_batch, calls.len())));
        }
        Ok(futures_util::future::join_all(calls.into_iter().map(|c| self.call(c))).await)
    }

    pub async fn shutdown(&self) {
        for pool in self.all_pools() {
            pool.shutdown().await;
        }
    }

    fn validate(&self, req: &FnCallRequest) -> Result<Plan, FnCallError> {
        let cfg = &self.cfg;
        let ordinary = self
            .pools
            .get(&req.language)
            .ok_or_else(|| FnCallError::UnsupportedLanguage(req.language.clone(), self.languages().join(", ")))?;
        let seconds = |name: &str, v: Option<f64>, default: f64| -> Result<u64, FnCallError> {
            let v = v.unwrap_or(default);
            if !v.is_finite() || v <= 0.0 || v > cfg.max_time_s {
                return Err(FnCallError::InvalidLimits(format!("{name} must be in (0, {}] seconds (got {v})", cfg.max_time_s)));
            }
            Ok((v * 1000.0).ceil() as u64)
        };
        let l = &req.limits;
        let time_ms = seconds("limits.time", l.time, cfg.default_time_s)?;
        let compile_time_ms = seconds("limits.compile_time", l.compile_time, cfg.default_compile_time_s)?;
        let memory_mb = l.memory_mb.unwrap_or(cfg.default_memory_mb);
        if memory_mb == 0 {
            return Err(FnCallError::InvalidLimits("limits.memory_mb must be at least 1".into()));
        }
        let runner_mb = sizing::runner_memory_mb(memory_mb, cfg.runner_memory_mb, self.node_max_memory_mb).map_err(|largest| {
            FnCallError::InvalidLimits(format!(
                "limits.memory_mb is {memory_mb}, more than this node can give one call (at most {largest}: its largest sandbox less {} MiB for the runner itself)",
                sizing::RUNNER_OVERHEAD_MB
            ))
        })?;
        let output_bytes = l.output_bytes.unwrap_or(cfg.default_output_bytes);
        if output_bytes == 0 || output_bytes > cfg.max_output_bytes {
            return Err(FnCallError::InvalidLimits(format!(
                "limits.output_bytes must be in 1..={} (got {output_bytes})",
                cfg.max_output_bytes
            )));
        }
        let mut total = req.code.len() as u64 + req.stdin.as_ref().map_or(0, |s| s.len() as u64);
        for (path, content) in &req.files {
            check_relative(path, "files")?;
            let data = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, content)
                .map_err(|e| FnCallError::Invalid(format!("files[{path:?}] is not valid base64: {e}")))?;
            total += data.len() as u64;
        }
        for path in &req.fetch_files {
            check_relative(path, "fetch_files")?;
        }
        for case in &req.test_cases {
            total += case.stdin.len() as u64 + case.expected_output.as_ref().map_or(0, |s| s.len() as u64);
        }
        if total > cfg.max_files_bytes {
            return Err(FnCallError::Invalid(format!(
                "code, stdin, files and test cases total {total} bytes; at most {}",
                cfg.max_files_bytes
            )));
        }
        if req.test_cases.len() > cfg.max_test_cases {
            return Err(FnCallError::Invalid(format!("at most {} test cases (got {})", cfg.max_test_cases, req.test_cases.len())));
        }
        if let Some(c) = &req.checker {
            if !CHECKER_LANGUAGES.contains(&c.language.as_str()) {
                return Err(FnCallError::Invalid(format!("checker.language must be one of {CHECKER_LANGUAGES:?} (got {:?})", c.language)));
            }
        }
        let tolerance = req.float_tolerance.unwrap_or(DEFAULT_TOLERANCE);
        if !tolerance.is_finite() || tolerance < 0.0 {
            return Err(FnCallError::Invalid(format!("float_tolerance must be a non-negative number (got {tolerance})")));
        }
        for (k, v) in &req.env {
            if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                return Err(FnCallError::Invalid(format!("invalid environment variable {k:?}")));
            }
        }
        let pool = match runner_mb {
            None => ordinary.clone(),
            Some(mb) => self.sized_pool(ordinary, mb),
        };
        Ok(Plan {
            pool,
            // Compiled before it runs: the runner's language table says.
            compiled: dsec_fncall_runner::is_compiled(&req.language),
            time_ms,
            compile_time_ms,
            memory_bytes: memory_mb << 20,
            output_bytes,
            tolerance,
            stop_on_first_failure: req.stop_on_first_failure.unwrap_or(true),
        })
    }

    /// Serves the call on a runner of its pool; a runner that fails under
    /// it is retired (the lease dropped unfinished) and the call run again
    /// on another. Its internals stay in the log, not in the answer.
    async fn run_call(self: Arc<Self>, req: FnCallRequest, plan: Plan) -> Result<FnCallResponse, FnCallError> {
        let mut attempt = 1;
        loop {
            let t0 = Instant::now();
            let mut lease = plan.pool.acquire().await?;
            let queued_ms = t0.elapsed().as_secs_f64() * 1000.0;
            let out = self.serve(&mut lease, &req, &plan, queued_ms).await;
            let runner = lease.runner().id.clone();
            match out {
                Ok(resp) => {
                    lease.finish();
                    return Ok(resp);
                }
                Err(FnCallError::RunnerLost(why)) => {
                    drop(lease);
                    tracing::warn!(%runner, language = %req.language, attempt, error = %why, "a runner failed serving a call; it is replaced");
                    if attempt == CALL_ATTEMPTS {
                        return Err(FnCallError::RunnerFailed(
                            "the call's runner failed, and so did the one it was run again on (both were replaced); \
                             a program that breaks every runner it runs on gets this answer"
                                .into(),
                        ));
                    }
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn serve(&self, lease: &mut Lease, req: &FnCallRequest, plan: &Plan, queued_ms: f64) -> Result<FnCallResponse, FnCallError> {
        let judge = !req.test_cases.is_empty();
        let mut resp = FnCallResponse {
            status: "ok".into(),
            compile: None,
            run: None,
            verdict: None,
            cases: Vec::new(),
            files: BTreeMap::new(),
            compile_cached: false,
            runner: lease.runner().id.clone(),
            queued_ms,
        };
        if plan.compiled {
            if let Some(step) = self.prepare_program(lease, req, plan, &mut resp).await? {
                if step.status != RunStatus::Ok {
                    resp.status = "compile_error".into();
                    resp.compile = Some(step);
                    if judge {
                        resp.verdict = Some(Verdict::CE);
                        resp.cases =
                            req.test_cases.iter().map(|_| CaseResult { verdict: Verdict::CE, run: None, checker_message: None }).collect();
                    }
                    return Ok(resp);
                }
                resp.compile = Some(step);
            }
        }
        if !judge {
            let stdin = req.stdin.as_deref().unwrap_or("").as_bytes();
            let z = self.run_step(lease, req, plan, stdin, &req.fetch_files).await?;
            let (step, _) = step_result(&z, plan.memory_bytes);
            resp.status = status_name(step.status).into();
            resp.files = z.fetched.iter().map(|(k, v)| (k.clone(), b64(v))).collect();
            resp.run = Some(step);
            return Ok(resp);
        }
        let mut overall: Option<Verdict> = None;
        for case in &req.test_cases {
            if overall.is_some() && plan.stop_on_first_failure {
                resp.cases.push(CaseResult { verdict: Verdict::SKIPPED, run: None, checker_message: None });
                continue;
            }
            // Every case runs the same code on the same runner: a Python
            // program is compiled once per submission (the monitor
            // remembers what became of the sources it saw last).
            let z = self.run_step(lease, req, plan, case.stdin.as_bytes(), &[]).await?;
            let (step, stdout) = step_result(&z, plan.memory_bytes);
            let (verdict, checker_message) = match (step.status, &case.expected_output) {
                (RunStatus::Ok, None) => (Verdict::AC, None),
                (RunStatus::Ok, Some(expected)) => match &req.checker {
                    Some(_) => self.check(lease, req, plan, case.stdin.as_bytes(), &stdout, expected.as_bytes()).await?,
                    None if outputs_match(req.compare, plan.tolerance, &stdout, expected.as_bytes()) => (Verdict::AC, None),
                    None => (Verdict::WA, None),
                },
                (status, _) => (failure_verdict(status), None),
            };
            if verdict != Verdict::AC && overall.is_none() {
                overall = Some(verdict);
            }
            resp.cases.push(CaseResult { verdict, run: Some(step), checker_message });
        }
        let verdict = overall.unwrap_or(Verdict::AC);
        resp.verdict = Some(verdict);
        resp.status = verdict_status(verdict).into();
        Ok(resp)
    }

    /// Puts the compiled program in the runner: already there, from the
    /// cache, or compiled now (whose step result is returned).
    async fn prepare_program(
        &self,
        lease: &mut Lease,
        req: &FnCallRequest,
        plan: &Plan,
        resp: &mut FnCallResponse,
    ) -> Result<Option<StepResult>, FnCallError> {
        let key = compile_key(&req.language, &req.code, &req.files);
        let runner = lease.runner();
        if runner.installed == Some(key) {
            resp.compile_cached = true;
            return Ok(None);
        }
        if let Some(bin) = self.cache.get(&key) {
            let mut z = ZRequest::new("install", ZLimits { time_ms: 10_000, memory_bytes: 0, output_bytes: 1, file_bytes: 1 });
            z.binary = Some(b64(&bin));
            answer(runner.request(z, ANSWER_SLACK).await?)?;
            runner.installed = Some(key);
            resp.compile_cached = true;
            return Ok(None);
        }
        let limits =
            ZLimits { time_ms: plan.compile_time_ms, memory_bytes: 0, output_bytes: COMPILE_OUTPUT_BYTES, file_bytes: COMPILE_FILE_BYTES };
        let mut z = ZRequest::new("compile", limits);
        z.language = req.language.as_str().into();
        z.code = req.code.as_str().into();
        z.files = req.files.clone();
        z.max_binary_bytes = self.cfg.max_cached_binary_bytes;
        let deadline = Duration::from_millis(plan.compile_time_ms) + ANSWER_SLACK;
        let out = answer(runner.request(z, deadline).await?)?;
        let (step, _) = step_result(&out, 0);
        if step.status == RunStatus::Ok {
            // A successful compile leaves the program installed.
            runner.installed = Some(key);
            if let Some(bin) = &out.binary {
                self.cache.put(key, unb64(bin));
            }
        }
        Ok(Some(step))
    }

    async fn run_step(
        &self,
        lease: &mut Lease,
        req: &FnCallRequest,
        plan: &Plan,
        stdin: &[u8],
        fetch: &[String],
    ) -> Result<ZResponse, FnCallError> {
        let limits = ZLimits {
            time_ms: plan.time_ms,
            memory_bytes: plan.memory_bytes,
            output_bytes: plan.output_bytes,
            file_bytes: plan.output_bytes + 1,
        };
        let mut z = ZRequest::new("run", limits);
        z.language = req.language.as_str().into();
        if !plan.compiled {
            z.code = req.code.as_str().into();
        }
        z.stdin = b64(stdin);
        z.files = req.files.clone();
        z.fetch_files = fetch.into();
        z.env = req.env.clone();
        let deadline = Duration::from_millis(plan.time_ms) + ANSWER_SLACK;
        answer(lease.runner().request(z, deadline).await?)
    }

    /// Runs the custom checker on one case: AC if it exits 0.
    async fn check(
        &self,
        lease: &mut Lease,
        req: &FnCallRequest,
        plan: &Plan,
        input: &[u8],
        output: &[u8],
        expected: &[u8],
    ) -> Result<(Verdict, Option<String>), FnCallError> {
        let checker = req.checker.as_ref().expect("check is called only with a checker");
        let limits = ZLimits { time_ms: plan.time_ms, memory_bytes: plan.memory_bytes, output_bytes: 64 << 10, file_bytes: 64 << 10 };
        let mut z = ZRequest::new("run", limits);
        z.language = checker.language.as_str().into();
        z.code = checker.code.as_str().into();
        z.files = BTreeMap::from([
            ("input.txt".to_string(), b64(input)),
            ("output.txt".to_string(), b64(output)),
            ("expected.txt".to_string(), b64(expected)),
        ]);
        let deadline = Duration::from_millis(plan.time_ms) + ANSWER_SLACK;
        let out = answer(lease.runner().request(z, deadline).await?)?;
        let (step, _) = step_result(&out, plan.memory_bytes);
        if step.status == RunStatus::Ok {
            Ok((Verdict::AC, None))
        } else {
            let msg = format!("{}{}", step.stdout, step.stderr);
            Ok((Verdict::WA, Some(msg.chars().take(4096).collect())))
        }
    }
}

/// A zygote answer that reports a fault instead of a result means the
/// runner is not trustworthy any more.
fn answer(z: ZResponse) -> Result<ZResponse, FnCallError> {
    match &z.error {
        Some(e) => Err(FnCallError::RunnerFailed(format!("the runner could not serve the call: {e}"))),
        None if z.unclean => Err(FnCallError::RunnerFailed("a process of the previous call would not die".into())),
        None => Ok(z),
    }
}

fn verdict_status(v: Verdict) -> &'static str {
    match v {
        Verdict::AC => "ok",
        Verdict::WA => "wrong_answer",
        Verdict::TLE => "timeout",
        Verdict::MLE => "memory_limit",
        Verdict::RE => "runtime_error",
        Verdict::CE => "compile_error",
        Verdict::OLE => "output_limit",
        Verdict::SKIPPED => "skipped",
    }
}

fn check_relative(path: &str, what: &str) -> Result<(), FnCallError> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.contains('\0')
        || path.split('/').any(|c| c == "..")
        || path.split('/').all(|c| c.is_empty() || c == ".");
    if bad {
        return Err(FnCallError::Invalid(format!("{what}: {path:?} must be a relative path inside the working directory (no '..')")));
    }
    Ok(())
}
