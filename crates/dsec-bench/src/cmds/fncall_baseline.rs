//! The FnCall benchmark's baseline: a subprocess-per-call runner, the way
//! SandboxFusion runs code. Every call gets a fresh temporary directory and
//! a fresh interpreter (or compiler, then binary) started with
//! `tokio::process`; nothing is kept warm and nothing is isolated (which
//! only flatters the baseline). It answers `POST /v1/fncall` with the same
//! request shape as dsec, so one load generator drives both.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use clap::Args;
use dsec_api::FnCallRequest;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

#[derive(Args, Debug)]
pub struct BaselineArgs {
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    #[arg(long, default_value = "python3")]
    pub python: String,
    #[arg(long, default_value = "g++")]
    pub cxx: String,
    /// The JDK's bin directory's `javac` and `java` (run as a judge would:
    /// javac, then `java -cp . Main`).
    #[arg(long, default_value = "javac")]
    pub javac: String,
    #[arg(long, default_value = "java")]
    pub java: String,
    #[arg(long, default_value = "node")]
    pub node: String,
    #[arg(long, default_value = "rustc")]
    pub rustc: String,
    #[arg(long, default_value = "perl")]
    pub perl: String,
    /// Programs running at once (more calls wait), like a worker pool.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
}

struct Baseline {
    args: BaselineArgs,
    slots: Semaphore,
}

pub async fn run(args: BaselineArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen).await.context("binding the baseline server")?;
    eprintln!("baseline is up at http://{}", listener.local_addr()?);
    let state = Arc::new(Baseline { slots: Semaphore::new(args.concurrency.max(1)), args });
    let app = Router::new().route("/v1/fncall", post(call)).with_state(state);
    axum::serve(listener, app).await?;
    Ok(())
}

/// One program run: exit code, stdout, timed out.
async fn run_program(cmd: &mut tokio::process::Command, stdin: &[u8], limit: Duration) -> anyhow::Result<(Option<i32>, Vec<u8>, bool)> {
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true).spawn()?;
    let mut input = child.stdin.take().context("stdin")?;
    let data = stdin.to_vec();
    tokio::spawn(async move {
        let _ = input.write_all(&data).await;
    });
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(out) => {
            let out = out?;
            Ok((out.status.code(), out.stdout, false))
        }
        Err(_) => Ok((None, Vec::new(), true)),
    }
}

/// A compile step in the call's directory; whether it succeeded.
async fn compile_step(argv: &[&str], dir: &std::path::Path) -> anyhow::Result<bool> {
    let (code, _, timed_out) = run_program(
        tokio::process::Command::new(argv[0])
            .args(&argv[1..])
            .current_dir(dir)
            // The compiler's temporary files go with the call's
            // directory: a request dropped mid-compile (the client
            // gone) kills only the driver, whose own cleanup of
            // /tmp never runs.
            .env("TMPDIR", dir),
        b"",
        Duration::from_secs(60),
    )
    .await?;
    Ok(code == Some(0) && !timed_out)
}

fn tokens(b: &[u8]) -> Vec<&[u8]> {
    b.split(|c| c.is_ascii_whitespace()).filter(|t| !t.is_empty()).collect()
}

async fn call(State(st): State<Arc<Baseline>>, Json(req): Json<FnCallRequest>) -> Json<Value> {
    let _slot = st.slots.acquire().await;
    let t0 = Instant::now();
    match serve(&st, &req).await {
        Ok(mut v) => {
            v["duration_ms"] = json!(t0.elapsed().as_secs_f64() * 1000.0);
            Json(v)
        }
        Err(e) => Json(json!({"status": "sandbox_error", "message": e.to_string()})),
    }
}

async fn serve(st: &Baseline, req: &FnCallRequest) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let limit = Duration::from_secs_f64(req.limits.time.unwrap_or(10.0));
    let program: Vec<String> = match req.language.as_str() {
        "python" => {
            std::fs::write(dir.path().join("main.py"), &req.code)?;
            vec![st.args.python.clone(), "main.py".into()]
        }
        "cpp" => {
            std::fs::write(dir.path().join("main.cpp"), &req.code)?;
            let compile = [st.args.cxx.as_str(), "-O2", "-std=gnu++17", "-o", "prog", "main.cpp"];
            if !compile_step(&compile, dir.path()).await? {
                return Ok(json!({"status": "compile_error"}));
            }
            vec![dir.path().join("prog").display().to_string()]
        }
        "java" => {
            std::fs::write(dir.path().join("Main.java"), &req.code)?;
            if !compile_step(&[st.args.javac.as_str(), "-encoding", "UTF-8", "Main.java"], dir.path()).await? {
                return Ok(json!({"status": "compile_error"}));
            }
            vec![st.args.java.clone(), "-cp".into(), ".".into(), "Main".into()]
        }
        "javascript" => {
            std::fs::write(dir.path().join("main.js"), &req.code)?;
            vec![st.args.node.clone(), "main.js".into()]
        }
        "rust" => {
            std::fs::write(dir.path().join("main.rs"), &req.code)?;
            let compile = [st.args.rustc.as_str(), "-O", "--edition", "2021", "-o", "prog", "main.rs"];
            if !compile_step(&compile, dir.path()).await? {
                return Ok(json!({"status": "compile_error"}));
            }
            vec![dir.path().join("prog").display().to_string()]
        }
        "perl" => {
            std::fs::write(dir.path().join("main.pl"), &req.code)?;
            vec![st.args.perl.clone(), "main.pl".into()]
        }
        other => anyhow::bail!("the baseline runs python, cpp, java, javascript, rust and perl, not {other}"),
    };
    let cases: Vec<(String, Option<String>)> = if req.test_cases.is_empty() {
        vec![(req.stdin.clone().unwrap_or_default(), None)]
    } else {
        req.test_cases.iter().map(|c| (c.stdin.clone(), c.expected_output.clone())).collect()
    };
    let mut verdicts = Vec::new();
    let mut last_stdout = Vec::new();
    for (stdin, expected) in cases {
        let (code, stdout, timed_out) =
            run_program(tokio::process::Command::new(&program[0]).args(&program[1..]).current_dir(dir.path()), stdin.as_bytes(), limit)
                .await?;
        let verdict = match (timed_out, code, &expected) {
            (true, _, _) => "TLE",
            (false, Some(0), Some(e)) if tokens(&stdout) == tokens(e.as_bytes()) => "AC",
            (false, Some(0), Some(_)) => "WA",
            (false, Some(0), None) => "AC",
            _ => "RE",
        };
        verdicts.push(verdict);
        last_stdout = stdout;
        if verdict != "AC" {
            break;
        }
    }
    let ok = verdicts.iter().all(|v| *v == "AC");
    Ok(json!({
        "status": if ok { "ok" } else { "failed" },
        "verdicts": verdicts,
        "run": {"stdout": String::from_utf8_lossy(&last_stdout)},
    }))
}
