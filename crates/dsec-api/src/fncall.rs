//! FnCall: stateless calls served by warm, reusable runners
//! (`POST /v1/fncall`, `POST /v1/fncall/batch`), and the
//! SandboxFusion-compatible `run_code` body.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// One call: run `code` in `language`, or judge it against `test_cases`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FnCallRequest {
    /// `python`, `bash`, `c`, `cpp`, `java`, `javascript`, `go`, `rust`, `php`, `ruby`, `perl` or
    /// `lua` (whatever the node's judge image carries; `GET /v1/fncall/pools` lists the pools).
    pub language: String,
    /// The program's source.
    pub code: String,
    /// Text on stdin (UTF-8). Ignored in judge mode (each case has its own).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Extra files, relative path -> base64 content, put in the working
    /// directory before the program runs.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Files (relative paths) to return, base64, after the run.
    #[serde(default)]
    pub fetch_files: Vec<String>,
    /// Extra environment of the program.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub limits: FnCallLimits,
    /// Judge mode when non-empty: run the program once per case.
    #[serde(default)]
    pub test_cases: Vec<TestCase>,
    /// How a case's output is compared with its expected output.
    #[serde(default)]
    pub compare: CompareMode,
    /// Absolute tolerance of `compare: float` (also relative, whichever is
    /// looser). Default 1e-6.
    #[serde(default)]
    pub float_tolerance: Option<f64>,
    /// A custom checker instead of `compare`: a program that gets the
    /// case's `input.txt`, `output.txt` (the submission's) and
    /// `expected.txt` in its working directory and exits 0 to accept.
    #[serde(default)]
    pub checker: Option<Checker>,
    /// Judge mode: stop at the first case that is not accepted (the rest
    /// are `SKIPPED`). Default true.
    #[serde(default)]
    pub stop_on_first_failure: Option<bool>,
}

/// Limits of one call; each has a node default and a node maximum.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FnCallLimits {
    /// Wall-clock time of one run, in seconds (CPU time is limited to the
    /// same, rounded up).
    #[serde(default)]
    pub time: Option<f64>,
    /// Memory of one run, MiB (address space for compiled programs,
    /// growth beyond the warm interpreter for Python).
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// Bytes of stdout and of stderr kept; more is an output-limit error.
    #[serde(default)]
    pub output_bytes: Option<u64>,
    /// Seconds for the compile step of compiled languages.
    #[serde(default)]
    pub compile_time: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    #[serde(default)]
    pub stdin: String,
    /// Without it the case is accepted when the program exits 0.
    #[serde(default)]
    pub expected_output: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CompareMode {
    /// Byte for byte.
    Exact,
    /// Tokens separated by any whitespace must be equal (the usual judge rule).
    #[default]
    Whitespace,
    /// Like `whitespace`, but tokens that parse as numbers are equal within
    /// `float_tolerance`.
    Float,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Checker {
    /// `python` or `bash`.
    pub language: String,
    pub code: String,
}

/// How one run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Exited with status 0.
    Ok,
    /// Exited non-zero or was killed by a signal.
    RuntimeError,
    /// Ran out of wall-clock or CPU time.
    Timeout,
    /// Ran out of memory.
    MemoryLimit,
    /// Wrote more than `output_bytes` to stdout or stderr.
    OutputLimit,
}

/// The result of one step (a compile or a run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StepResult {
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Wall-clock milliseconds.
    pub duration_ms: f64,
    pub cpu_ms: f64,
    /// Peak resident memory of the program, KiB.
    pub peak_memory_kb: u64,
    /// Output beyond the limit was cut off.
    pub truncated: bool,
}

/// A judge verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum Verdict {
    /// Accepted.
    AC,
    /// Wrong answer.
    WA,
    /// Time limit exceeded.
    TLE,
    /// Memory limit exceeded.
    MLE,
    /// Runtime error.
    RE,
    /// Compilation error.
    CE,
    /// Output limit exceeded.
    OLE,
    /// Not run (an earlier case failed and `stop_on_first_failure`).
    SKIPPED,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CaseResult {
    pub verdict: Verdict,
    /// The run; absent when the case was skipped.
    pub run: Option<StepResult>,
    /// The checker's output when a custom checker rejected the case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checker_message: Option<String>,
}

/// What a call returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FnCallResponse {
    /// `ok` only if every step ended with status 0 (and, in judge mode,
    /// every case was accepted); otherwise the first failure's status, or
    /// `compile_error`, or `wrong_answer`.
    pub status: String,
    /// The compile step of compiled languages (absent on a compile-cache hit).
    pub compile: Option<StepResult>,
    /// The run (plain mode).
    pub run: Option<StepResult>,
    /// Judge mode: the overall verdict (the first non-AC case's, or AC).
    pub verdict: Option<Verdict>,
    /// Judge mode: one result per test case, in order.
    #[serde(default)]
    pub cases: Vec<CaseResult>,
    /// The requested `fetch_files` that existed, base64.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// The compiled program came from the compile cache.
    pub compile_cached: bool,
    /// Which runner served the call (a sandbox id).
    pub runner: String,
    /// Milliseconds the call waited for a free runner.
    pub queued_ms: f64,
}

/// `POST /v1/fncall/batch`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FnCallBatchRequest {
    pub calls: Vec<FnCallRequest>,
}

/// One entry per call, in order: a result or an error.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FnCallBatchResponse {
    pub results: Vec<FnCallBatchItem>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum FnCallBatchItem {
    Ok(Box<FnCallResponse>),
    Err(crate::ErrorBody),
}

/// `GET /v1/fncall/pools`: the pools of this node.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FnCallPools {
    pub pools: Vec<FnCallPoolStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FnCallPoolStatus {
    pub language: String,
    /// The memory of each runner: the ordinary runners', or a bigger size
    /// made for calls asking for more (0 from servers that predate it).
    #[serde(default)]
    pub runner_memory_mb: u64,
    pub min_runners: u32,
    pub max_runners: u32,
    pub runners: u32,
    pub idle: u32,
    pub starting: u32,
    pub queued: u32,
    pub queue_limit: u32,
    pub calls: u64,
    pub runners_replaced: u64,
}

/// SandboxFusion's `POST /run_code` body. Unknown fields are ignored, as
/// the real service does (verl sends `memory_limit_MB`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunCodeRequest {
    #[serde(default = "ten")]
    pub compile_timeout: f64,
    #[serde(default = "ten")]
    pub run_timeout: f64,
    #[serde(default, rename = "memory_limit_MB")]
    pub memory_limit_mb: Option<i64>,
    pub code: String,
    #[serde(default)]
    pub stdin: Option<String>,
    pub language: String,
    /// Path -> base64 content (null: an empty file).
    #[serde(default)]
    pub files: BTreeMap<String, Option<String>>,
    #[serde(default)]
    pub fetch_files: Vec<String>,
}

fn ten() -> f64 {
    10.0
}

/// SandboxFusion's `RunCodeResponse`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunCodeResponse {
    /// `Success`, `Failed` or `SandboxError`.
    pub status: String,
    pub message: String,
    pub compile_result: Option<CommandRunResult>,
    pub run_result: Option<CommandRunResult>,
    pub executor_pod_name: Option<String>,
    pub files: BTreeMap<String, String>,
}

/// SandboxFusion's `CommandRunResult`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CommandRunResult {
    /// `Finished`, `Error` or `TimeLimitExceeded`.
    pub status: String,
    /// Seconds.
    pub execution_time: Option<f64>,
    pub cpu_time: Option<f64>,
    pub return_code: Option<i32>,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
}
