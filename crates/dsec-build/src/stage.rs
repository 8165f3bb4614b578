//! A stage as the build goes through it: the layers so far, the image
//! config its instructions have set, the build arguments in scope, and the
//! step cache key of where it stands.

use std::collections::BTreeMap;

use dsec_image::{HealthcheckConfig, ImageConfig, LayerDescriptor};

use crate::cache::Key;
use crate::dockerfile::{words, Command, Healthcheck};

/// The shell of shell-form commands when the image sets none.
pub const DEFAULT_SHELL: [&str; 2] = ["/bin/sh", "-c"];

#[derive(Debug, Clone)]
pub struct StageState {
    pub layers: Vec<LayerDescriptor>,
    pub config: ImageConfig,
    /// The stored image whose layers are `layers` (a sandbox of a step
    /// starts from it).
    pub image: String,
    /// `ARG`s declared in this stage, with their values.
    pub args: BTreeMap<String, String>,
    pub key: Key,
    /// A `WORKDIR` that the next filesystem step must create.
    pub workdir_pending: bool,
    /// `CMD` was set in this stage (an `ENTRYPOINT` of this stage clears
    /// an inherited `CMD`, not one of its own).
    pub cmd_set: bool,
    /// What the stage was built from, for the image's provenance.
    pub base: String,
}

impl StageState {
    /// A variable as instructions see it: the stage's environment first,
    /// then its build arguments.
    pub fn lookup(&self, name: &str) -> Option<String> {
        env_get(&self.config.env, name).or_else(|| self.args.get(name).cloned())
    }

    /// Expands a raw word of the Dockerfile.
    pub fn expand(&self, raw: &str, escape: char) -> Result<String, words::WordError> {
        words::expand_with(raw, &|n| self.lookup(n), escape)
    }

    /// The environment a RUN step runs in: the image's, plus build
    /// arguments that no `ENV` overrides.
    pub fn run_env(&self) -> Vec<(String, String)> {
        let mut env: BTreeMap<String, String> = self.args.clone();
        for e in &self.config.env {
            if let Some((k, v)) = e.split_once('=') {
                env.insert(k.to_string(), v.to_string());
            }
        }
        env.into_iter().collect()
    }

    /// The argv of a command as RUN (or the image config) runs it.
    pub fn argv(&self, command: &Command) -> Vec<String> {
        match command {
            Command::Exec(v) => v.clone(),
            Command::Shell(text) => {
                let mut argv: Vec<String> = match &self.config.shell {
                    Some(s) => s.clone(),
                    None => DEFAULT_SHELL.iter().map(|s| s.to_string()).collect(),
                };
                argv.push(text.clone());
                argv
            }
        }
    }

    pub fn set_env(&mut self, key: &str, value: &str) {
        let entry = format!("{key}={value}");
        match self.config.env.iter_mut().find(|e| e.split_once('=').map(|(k, _)| k) == Some(key)) {
            Some(e) => *e = entry,
            None => self.config.env.push(entry),
        }
    }

    /// `WORKDIR path`: relative paths are taken from the current one.
    pub fn set_workdir(&mut self, path: &str) {
        self.config.workdir = resolve_in(&self.config.workdir, path);
        self.workdir_pending = true;
    }

    pub fn set_entrypoint(&mut self, command: &Command) {
        self.config.entrypoint = Some(self.argv(command));
        if !self.cmd_set {
            self.config.cmd = None;
        }
    }

    pub fn set_cmd(&mut self, command: &Command) {
        self.config.cmd = Some(self.argv(command));
        self.cmd_set = true;
    }

    pub fn set_healthcheck(&mut self, h: &Healthcheck) -> Result<(), String> {
        self.config.healthcheck = Some(match h {
            Healthcheck::None => HealthcheckConfig {
                test: vec!["NONE".into()],
                interval_ns: 0,
                timeout_ns: 0,
                start_period_ns: 0,
                start_interval_ns: 0,
                retries: 0,
            },
            Healthcheck::Check { test, interval, timeout, start_period, start_interval, retries } => {
                let test = match test {
                    Command::Exec(v) => std::iter::once("CMD".to_string()).chain(v.iter().cloned()).collect(),
                    Command::Shell(s) => vec!["CMD-SHELL".to_string(), s.clone()],
                };
                let d = |v: &Option<String>| v.as_deref().map(parse_duration_ns).transpose().map(|o| o.unwrap_or(0));
                HealthcheckConfig {
                    test,
                    interval_ns: d(interval)?,
                    timeout_ns: d(timeout)?,
                    start_period_ns: d(start_period)?,
                    start_interval_ns: d(start_interval)?,
                    retries: retries
                        .as_deref()
                        .map(|r| r.parse().map_err(|_| format!("--retries={r} is not a number")))
                        .transpose()?
                        .unwrap_or(0),
                }
            }
        });
        Ok(())
    }
}

/// `value` of `name` in a `KEY=value` list.
pub fn env_get(env: &[String], name: &str) -> Option<String> {
    env.iter().filter_map(|e| e.split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
}

/// `path` as an absolute, clean path: relative ones are taken from `base`.
pub fn resolve_in(base: &str, path: &str) -> String {
    if path.starts_with('/') {
        clean_absolute(path)
    } else {
        clean_absolute(&format!("{base}/{path}"))
    }
}

/// An absolute path with `.`, `..` and repeated slashes resolved.
pub fn clean_absolute(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

/// A Go duration as Docker writes them (`30s`, `1m30s`, `500ms`, `1h`).
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a duration (like 30s, 1m30s, 500ms)");
    let mut total: f64 = 0.0;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let (num, tail) = rest.split_at(num_len);
        let n: f64 = num.parse().map_err(|_| bad())?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        total += n * scale;
        rest = tail;
    }
    Ok(total as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> StageState {
        StageState {
            layers: vec![],
            config: ImageConfig::default(),
            image: "x".into(),
            args: BTreeMap::new(),
            key: Key::root("x"),
            workdir_pending: false,
            cmd_set: false,
            base: "x".into(),
        }
    }

    #[test]
    fn env_overrides_args_and_workdirs_resolve() {
        let mut s = state();
        s.args.insert("V".into(), "arg".into());
        s.args.insert("ONLY_ARG".into(), "a".into());
        assert_eq!(s.lookup("V").as_deref(), Some("arg"));
        s.set_env("V", "env");
        assert_eq!(s.lookup("V").as_deref(), Some("env"));
        let env = s.run_env();
        assert!(env.contains(&("V".into(), "env".into())) && env.contains(&("ONLY_ARG".into(), "a".into())));
        s.set_workdir("/app");
        s.set_workdir("src/../lib");
        assert_eq!(s.config.workdir, "/app/lib");
        assert!(s.workdir_pending);
    }

    #[test]
    fn entrypoint_clears_an_inherited_cmd_only() {
        let mut s = state();
        s.config.cmd = Some(vec!["bash".into()]);
        s.set_entrypoint(&Command::Exec(vec!["/app".into()]));
        assert_eq!(s.config.cmd, None);
        s.set_cmd(&Command::Shell("serve".into()));
        s.set_entrypoint(&Command::Exec(vec!["/app2".into()]));
        assert_eq!(s.config.cmd, Some(vec!["/bin/sh".into(), "-c".into(), "serve".into()]));
    }

    #[test]
    fn durations_parse_like_docker() {
        assert_eq!(parse_duration_ns("30s").unwrap(), 30_000_000_000);
        assert_eq!(parse_duration_ns("1m30s").unwrap(), 90_000_000_000);
        assert_eq!(parse_duration_ns("500ms").unwrap(), 500_000_000);
        assert!(parse_duration_ns("5 parsecs").is_err());
        assert!(parse_duration_ns("").is_err());
    }
}
