//! `dsec fncall`: run code once on a warm runner, or judge it.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use dsec_api as api;

use crate::connect::ConnectArgs;

#[derive(Args, Debug)]
pub struct FnCallArgs {
    /// python, bash, c, cpp, java, javascript, go, rust, php, ruby, perl or lua.
    #[arg(long, short)]
    pub language: String,
    /// The source file (`-` reads it from stdin).
    pub file: Option<PathBuf>,
    /// The source as an argument instead of a file.
    #[arg(long, short, conflicts_with = "file")]
    pub code: Option<String>,
    /// Text given to the program on stdin.
    #[arg(long)]
    pub stdin: Option<String>,
    /// Seconds the program may run.
    #[arg(long)]
    pub time: Option<f64>,
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// A judge test case as INPUT_FILE:EXPECTED_FILE (repeatable).
    #[arg(long = "case")]
    pub cases: Vec<String>,
    /// exact, whitespace or float.
    #[arg(long)]
    pub compare: Option<String>,
    /// Print the whole answer as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

fn source(a: &FnCallArgs) -> anyhow::Result<String> {
    match (&a.code, &a.file) {
        (Some(c), _) => Ok(c.clone()),
        (None, Some(p)) if p.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            Ok(s)
        }
        (None, Some(p)) => std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())),
        (None, None) => anyhow::bail!("give the program as a FILE, `-` (stdin) or --code"),
    }
}

fn test_cases(specs: &[String]) -> anyhow::Result<Vec<api::TestCase>> {
    specs
        .iter()
        .map(|s| {
            let (input, expected) = s.split_once(':').with_context(|| format!("--case {s:?}: expected INPUT_FILE:EXPECTED_FILE"))?;
            Ok(api::TestCase {
                stdin: std::fs::read_to_string(input).with_context(|| format!("reading {input}"))?,
                expected_output: Some(std::fs::read_to_string(expected).with_context(|| format!("reading {expected}"))?),
            })
        })
        .collect()
}

/// Exit status: the program's own in plain mode (1 if it did not exit),
/// 0 for an accepted submission and 1 otherwise in judge mode.
pub async fn run(a: FnCallArgs) -> anyhow::Result<u8> {
    let compare = match a.compare.as_deref() {
        None | Some("whitespace") => api::CompareMode::Whitespace,
        Some("exact") => api::CompareMode::Exact,
        Some("float") => api::CompareMode::Float,
        Some(other) => anyhow::bail!("--compare {other:?}: expected exact, whitespace or float"),
    };
    let req = api::FnCallRequest {
        language: a.language.clone(),
        code: source(&a)?,
        stdin: a.stdin.clone(),
        limits: api::FnCallLimits { time: a.time, memory_mb: a.memory_mb, ..Default::default() },
        test_cases: test_cases(&a.cases)?,
        compare,
        ..Default::default()
    };
    let resp = a.conn.client()?.fncall(&req).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&resp)?);
        return Ok(u8::from(resp.status != "ok"));
    }
    if let Some(c) = &resp.compile {
        if c.status != api::RunStatus::Ok {
            eprint!("{}", c.stderr);
        }
    }
    if let Some(verdict) = resp.verdict {
        for (i, c) in resp.cases.iter().enumerate() {
            let ms = c.run.as_ref().map(|r| format!("{:.1} ms", r.duration_ms)).unwrap_or_default();
            println!("case {:>3}: {:?} {ms}", i + 1, c.verdict);
        }
        println!("verdict: {verdict:?}");
        return Ok(u8::from(verdict != api::Verdict::AC));
    }
    let Some(run) = resp.run else {
        eprintln!("{}", resp.status);
        return Ok(1);
    };
    std::io::stdout().write_all(run.stdout.as_bytes())?;
    std::io::stderr().write_all(run.stderr.as_bytes())?;
    if run.status != api::RunStatus::Ok {
        eprintln!("dsec: {}", resp.status);
    }
    Ok(run.exit_code.map(|c| c.clamp(0, 255) as u8).unwrap_or(1))
}
