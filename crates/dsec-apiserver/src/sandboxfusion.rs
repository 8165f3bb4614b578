//! Conversions between SandboxFusion's `run_code` and dsec's FnCall.
//!
//! SandboxFusion semantics kept: `status` is `Success` only when every step
//! finished with return code 0, `Failed` otherwise; a step that ran out of
//! time is `TimeLimitExceeded` with no return code; a step killed for
//! another reason is `Error`; times are in seconds.

use std::collections::BTreeMap;

use dsec_api::{self as api, RunStatus, StepResult};

use crate::error::{ApiError, ApiResult};

/// SandboxFusion language names dsec serves, and the runner pool of each.
const LANGUAGES: &[(&str, &str)] = &[
    ("python", "python"),
    ("bash", "bash"),
    ("cpp", "cpp"),
    ("c", "c"),
    ("java", "java"),
    ("nodejs", "javascript"),
    ("go", "go"),
    ("rust", "rust"),
    ("php", "php"),
    ("ruby", "ruby"),
    ("perl", "perl"),
    ("lua", "lua"),
];

/// SandboxFusion's `run_timeout` and `compile_timeout` when absent.
const SANDBOXFUSION_DEFAULT_TIMEOUT_S: f64 = 10.0;

pub fn to_fncall(req: api::RunCodeRequest) -> ApiResult<api::FnCallRequest> {
    let language = LANGUAGES.iter().find(|(sf, _)| *sf == req.language).map(|(_, ours)| ours.to_string()).ok_or_else(|| {
        ApiError::new(
            dsec_api::ErrorCode::UnsupportedLanguage,
            format!(
                "language {:?} is not served (available: {})",
                req.language,
                LANGUAGES.iter().map(|(sf, _)| *sf).collect::<Vec<_>>().join(", ")
            ),
        )
    })?;
    let memory_mb = match req.memory_limit_mb {
        Some(m) if m > 0 => Some(m as u64),
        // SandboxFusion's -1 (its default): no limit of its own; FnCall's
        // default limit then.
        _ => None,
    };
    Ok(api::FnCallRequest {
        language,
        code: req.code,
        stdin: req.stdin,
        files: req.files.into_iter().map(|(k, v)| (k, v.unwrap_or_default())).collect(),
        fetch_files: req.fetch_files,
        limits: api::FnCallLimits {
            time: Some(timeout(req.run_timeout)),
            compile_time: Some(timeout(req.compile_timeout)),
            memory_mb,
            output_bytes: None,
        },
        ..Default::default()
    })
}

/// SandboxFusion takes any number of seconds: zero or less (its -1) is its
/// default, 10 s; more than a FnCall call may run is that longest time (a
/// program still running then is `TimeLimitExceeded`, as it would be
/// later there).
fn timeout(seconds: f64) -> f64 {
    if seconds.is_nan() || seconds <= 0.0 {
        SANDBOXFUSION_DEFAULT_TIMEOUT_S
    } else {
        seconds.min(dsec_fncall::MAX_TIME_S)
    }
}

fn command_result(s: &StepResult) -> api::CommandRunResult {
    let status = match s.status {
        RunStatus::Timeout => "TimeLimitExceeded",
        RunStatus::Ok | RunStatus::RuntimeError if s.exit_code.is_some() => "Finished",
        _ => "Error",
    };
    api::CommandRunResult {
        status: status.into(),
        execution_time: Some(s.duration_ms / 1000.0),
        cpu_time: Some(s.cpu_ms / 1000.0),
        return_code: if s.status == RunStatus::Timeout { None } else { s.exit_code },
        stdout: Some(s.stdout.clone()),
        stderr: Some(s.stderr.clone()),
    }
}

pub fn from_fncall(r: api::FnCallResponse) -> api::RunCodeResponse {
    // SandboxFusion always reports a compile step for compiled languages; a
    // compile-cache hit is a compile that finished at once.
    let compile_result = match (&r.compile, r.compile_cached) {
        (Some(step), _) => Some(command_result(step)),
        (None, true) => Some(api::CommandRunResult {
            status: "Finished".into(),
            execution_time: Some(0.0),
            cpu_time: Some(0.0),
            return_code: Some(0),
            stdout: Some(String::new()),
            stderr: Some(String::new()),
        }),
        (None, false) => None,
    };
    let run_result = r.run.as_ref().map(command_result);
    let ok = |c: &Option<api::CommandRunResult>| c.as_ref().is_none_or(|c| c.status == "Finished" && c.return_code == Some(0));
    let success = ok(&compile_result) && run_result.is_some() && ok(&run_result);
    api::RunCodeResponse {
        status: if success { "Success" } else { "Failed" }.into(),
        message: if success { String::new() } else { r.status.clone() },
        compile_result,
        run_result,
        executor_pod_name: Some(r.runner),
        files: r.files.into_iter().collect::<BTreeMap<_, _>>(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(status: RunStatus, exit: Option<i32>) -> StepResult {
        StepResult {
            status,
            exit_code: exit,
            signal: None,
            stdout: "out".into(),
            stderr: String::new(),
            duration_ms: 1500.0,
            cpu_ms: 10.0,
            peak_memory_kb: 1,
            truncated: false,
        }
    }

    fn resp(compile: Option<StepResult>, run: Option<StepResult>) -> api::FnCallResponse {
        api::FnCallResponse {
            status: "x".into(),
            compile,
            run,
            verdict: None,
            cases: vec![],
            files: Default::default(),
            compile_cached: false,
            runner: "n.r".into(),
            queued_ms: 0.0,
        }
    }

    #[test]
    fn statuses_follow_sandboxfusion() {
        let ok = from_fncall(resp(None, Some(step(RunStatus::Ok, Some(0)))));
        assert_eq!(ok.status, "Success");
        let run = ok.run_result.unwrap();
        assert_eq!((run.status.as_str(), run.return_code, run.execution_time), ("Finished", Some(0), Some(1.5)));
        assert_eq!(from_fncall(resp(None, Some(step(RunStatus::RuntimeError, Some(1))))).status, "Failed");
        let tle = from_fncall(resp(None, Some(step(RunStatus::Timeout, None))));
        assert_eq!((tle.status.as_str(), tle.run_result.as_ref().unwrap().status.as_str()), ("Failed", "TimeLimitExceeded"));
        let ce = from_fncall(resp(Some(step(RunStatus::RuntimeError, Some(1))), None));
        assert_eq!((ce.status.as_str(), ce.compile_result.unwrap().status.as_str()), ("Failed", "Finished"));
        assert!(ce.run_result.is_none());
        let killed = from_fncall(resp(None, Some(step(RunStatus::MemoryLimit, None))));
        assert_eq!(killed.run_result.unwrap().status, "Error");
    }

    fn mapped(body: serde_json::Value) -> api::FnCallLimits {
        let mut body = body;
        body["code"] = "print(1)".into();
        body["language"] = "python".into();
        to_fncall(serde_json::from_value(body).unwrap()).unwrap().limits
    }

    #[test]
    fn every_memory_limit_sandboxfusion_takes_maps() {
        // Absent, -1 (its default) and 0: no limit of its own, FnCall's default.
        for v in [serde_json::json!({}), serde_json::json!({"memory_limit_MB": -1}), serde_json::json!({"memory_limit_MB": 0})] {
            assert_eq!(mapped(v.clone()).memory_mb, None, "{v}");
        }
        // Any positive size passes as is (the service picks a runner big
        // enough, or says what the node can give).
        for mb in [1u64, 256, 1024, 4096, 1 << 40] {
            assert_eq!(mapped(serde_json::json!({"memory_limit_MB": mb})).memory_mb, Some(mb));
        }
    }

    #[test]
    fn every_timeout_sandboxfusion_takes_maps() {
        let l = mapped(serde_json::json!({}));
        assert_eq!((l.time, l.compile_time), (Some(10.0), Some(10.0)), "its defaults");
        for (given, want) in [(-1.0, 10.0), (0.0, 10.0), (0.5, 0.5), (30.0, 30.0), (1e9, dsec_fncall::MAX_TIME_S)] {
            let l = mapped(serde_json::json!({"run_timeout": given, "compile_timeout": given}));
            assert_eq!((l.time, l.compile_time), (Some(want), Some(want)), "{given}");
        }
        // Integers, as verl sends them, are seconds too.
        assert_eq!(mapped(serde_json::json!({"run_timeout": 3})).time, Some(3.0));
    }

    #[test]
    fn requests_map_and_refuse_unknown_languages() {
        let req: api::RunCodeRequest = serde_json::from_value(serde_json::json!({
            "code": "print(1)", "language": "python", "stdin": "None", "memory_limit_MB": 512,
            "files": {"a.txt": null}, "unknown_field": true
        }))
        .unwrap();
        let c = to_fncall(req).unwrap();
        assert_eq!(
            (c.language.as_str(), c.stdin.as_deref(), c.limits.memory_mb, c.limits.time),
            ("python", Some("None"), Some(512), Some(10.0))
        );
        assert_eq!(c.files["a.txt"], "");
        let js: api::RunCodeRequest = serde_json::from_value(serde_json::json!({"code": "", "language": "nodejs"})).unwrap();
        assert_eq!(to_fncall(js).unwrap().language, "javascript", "SandboxFusion's name for JavaScript");
        let bad: api::RunCodeRequest = serde_json::from_value(serde_json::json!({"code": "", "language": "cobol"})).unwrap();
        let e = to_fncall(bad).unwrap_err();
        assert_eq!(e.code, dsec_api::ErrorCode::UnsupportedLanguage);
        assert!(e.message.contains("nodejs"), "{}", e.message);
    }
}
