//! Persistent shell sessions.
//!
//! A session is not a long-lived shell process: each command runs in a fresh
//! shell started with the session's saved cwd and environment, wrapped so
//! that afterwards the shell reports its `$PWD` and `export -p` on fd 3 (a
//! pipe the user's command itself does not inherit). That keeps exit codes,
//! timeouts and output separation exact, and a command that `exit`s or is
//! killed simply leaves the session as it was.

use std::rc::Rc;

use dsec_agent_proto::{AgentError, Command, ErrorKind, ExecSpec, Reply, SessionSpec};

use crate::agent::{Agent, Mode};
use crate::envs;
use crate::exec;
use crate::launch;
use crate::pgroup::signal_group;
use crate::request::ReqCtx;
use crate::session_state::parse_state;

/// Runs the command (`$1`) in the current shell with fd 3 closed for it,
/// then reports cwd + NUL + exported environment on fd 3. Builtins only, so
/// it works with bash, dash and busybox ash alike.
const WRAPPER: &str = "__dsec_cmd=$1; shift; eval \"$__dsec_cmd\" 3>&-; __dsec_rc=$?; \
{ printf '%s\\0' \"$PWD\"; export -p; } >&3; exit $__dsec_rc";

/// Variables the shell maintains itself; carrying them over would be wrong
/// (SHLVL would grow by one per command).
const SHELL_OWNED: &[&str] = &["PWD", "SHLVL", "_"];

fn unknown(id: &str) -> AgentError {
    AgentError::new(ErrorKind::UnknownSession, format!("no session {id:?}"))
}

pub fn open(agent: &Agent, spec: SessionSpec) -> Result<Reply, AgentError> {
    envs::validate(&spec.env)?;
    let user = launch::user(agent, spec.user.as_deref())?;
    let cwd = spec.cwd.unwrap_or_else(|| agent.workdir.clone());
    // Fail now rather than on the first command.
    launch::cwd(agent, &cwd)?;
    let mut env = envs::base(&agent.image_env, &user);
    envs::overlay(&mut env, &spec.env);
    let id = agent.sessions.borrow_mut().open(cwd, env, spec.user);
    Ok(Reply::Session { session_id: id })
}

pub fn close(agent: &Agent, id: &str) -> Result<Reply, AgentError> {
    let session = agent.sessions.borrow_mut().remove(id).ok_or_else(|| unknown(id))?;
    for pg in session.groups {
        signal_group(pg, libc::SIGKILL);
    }
    Ok(Reply::Done)
}

/// Quotes an argv into one shell command line.
pub fn quote_argv(argv: &[String]) -> String {
    argv.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect::<Vec<_>>().join(" ")
}

/// A command of a session (its `ExecSpec::session`).
pub async fn exec(agent: &Rc<Agent>, ctx: &Rc<ReqCtx>, spec: ExecSpec) -> Result<Reply, AgentError> {
    let id = spec.session.clone().unwrap_or_default();
    let (saved_cwd, saved_env, saved_user) = {
        let sessions = agent.sessions.borrow();
        let s = sessions.get(&id).ok_or_else(|| unknown(&id))?;
        (s.cwd.clone(), s.env.clone(), s.user.clone())
    };
    envs::validate(&spec.env)?;
    let user = launch::user(agent, spec.user.as_deref().or(saved_user.as_deref()))?;
    let mut env = saved_env.clone();
    if spec.user.is_some() {
        envs::user_vars(&mut env, &user);
    }
    envs::overlay(&mut env, &spec.env);
    for k in SHELL_OWNED {
        envs::remove(&mut env, k);
    }
    let text = match &spec.command {
        Command::Shell(s) => s.clone(),
        Command::Argv(v) => quote_argv(v),
    };
    let shell = agent.shell().to_string();
    let argv = vec![shell.clone(), "-c".into(), WRAPPER.into(), shell, text];
    let cwd = launch::cwd(agent, spec.cwd.as_deref().unwrap_or(&saved_cwd))?;
    let launch = launch::prepare(argv, &env, cwd, user)?;
    let done = exec::run(agent, ctx, &spec, &launch, true).await?;

    if let Some((pwd, mut new_env)) = done.state.as_deref().and_then(parse_state) {
        for k in SHELL_OWNED {
            envs::remove(&mut new_env, k);
        }
        // A per-command variable applies to that command only, unless the
        // command itself changed it.
        for (k, v) in &spec.env {
            if envs::get(&new_env, k) == Some(v.as_str()) {
                match envs::get(&saved_env, k) {
                    Some(old) => envs::set(&mut new_env, k, old),
                    None => envs::remove(&mut new_env, k),
                }
            }
        }
        let cwd = sandbox_cwd(agent, &pwd);
        if let Some(s) = agent.sessions.borrow_mut().get_mut(&id) {
            if let Some(cwd) = cwd {
                s.cwd = cwd;
            }
            s.env = new_env;
        }
    }
    Ok(Reply::Exited(done.result))
}

/// The shell reports its cwd as the kernel sees it. In container mode that
/// is a sandbox path already; in plain mode it is under the root directory
/// (anything outside it cannot be named and keeps the previous cwd).
fn sandbox_cwd(agent: &Agent, pwd: &str) -> Option<String> {
    match agent.mode {
        Mode::Container | Mode::Vm | Mode::Guest => Some(pwd.to_string()),
        Mode::Plain => {
            let root = agent.root_path.as_deref()?.trim_end_matches('/');
            if pwd == root {
                Some("/".into())
            } else {
                pwd.strip_prefix(root).filter(|rest| rest.starts_with('/')).map(str::to_string)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_quoting_survives_the_shell() {
        let argv: Vec<String> = ["printf", "%s|", "a b", "it's", "$HOME", ""].iter().map(|s| s.to_string()).collect();
        let line = quote_argv(&argv);
        let out = std::process::Command::new("/bin/sh").args(["-c", &line]).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a b|it's|$HOME||");
    }

    #[test]
    fn wrapper_reports_state_in_real_shells() {
        for shell in ["/bin/bash", "/bin/dash", "/bin/sh", "/bin/busybox"] {
            if !std::path::Path::new(shell).exists() {
                continue;
            }
            let dir = tempfile::tempdir().unwrap();
            let state_path = dir.path().join("state");
            let state = std::fs::File::create(&state_path).unwrap();
            let mut cmd = std::process::Command::new(shell);
            if shell.ends_with("busybox") {
                cmd.arg("sh");
            }
            cmd.args([
                "-c",
                WRAPPER,
                shell,
                "cd /usr && export DSEC_T='x y'; ls /proc/self/fd/3 2>/dev/null; exit_code=4; (exit $exit_code)",
            ]);
            cmd.env_clear().env("PATH", envs::DEFAULT_PATH);
            let fd = std::os::fd::AsRawFd::as_raw_fd(&state);
            // SAFETY: dup2 in the forked child onto fd 3, async-signal-safe.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    // dup2(3, 3) would keep CLOEXEC: clear it instead.
                    let r = if fd == 3 { libc::fcntl(3, libc::F_SETFD, 0) } else { libc::dup2(fd, 3) };
                    if r < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let out = cmd.output().unwrap();
            assert_eq!(out.status.code(), Some(4), "{shell}");
            assert!(out.stdout.is_empty(), "{shell}: the command saw fd 3: {:?}", out.stdout);
            let (cwd, env) = parse_state(&std::fs::read(&state_path).unwrap()).unwrap();
            assert_eq!(cwd, "/usr", "{shell}");
            assert_eq!(envs::get(&env, "DSEC_T"), Some("x y"), "{shell}");
        }
    }
}
