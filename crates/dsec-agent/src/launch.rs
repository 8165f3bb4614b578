//! Turning a request (command, user, env, cwd) into what spawn needs:
//! resolved user, final environment, a cwd fd confined to the root, and the
//! program's path. Shared by exec, sessions and PTYs.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use dsec_agent_proto::{AgentError, Command, ErrorKind};

use crate::agent::Agent;
use crate::envs::{self, Env};
use crate::errors::{invalid, kind_of, os_err};
use crate::paths::SandboxPath;
use crate::spawn::{self, SpawnError, Step};
use crate::users::{self, User};

/// A command ready to be spawned.
pub struct Launch {
    pub program: CString,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub cwd: OwnedFd,
    pub user: User,
}

impl Launch {
    /// Forks and execs; returns the pid (= process group id). Tracks the
    /// group for Shutdown.
    pub fn spawn(
        &self,
        agent: &Agent,
        stdin: BorrowedFd<'_>,
        stdout: BorrowedFd<'_>,
        stderr: BorrowedFd<'_>,
        fd3: Option<BorrowedFd<'_>>,
        controlling_tty: bool,
    ) -> Result<i32, AgentError> {
        let cmd = spawn::Command {
            program: &self.program,
            argv: &self.argv,
            envp: &self.envp,
            cwd: self.cwd.as_fd(),
            stdin,
            stdout,
            stderr,
            fd3,
            controlling_tty,
            user: &self.user,
        };
        let pid = spawn::spawn(&cmd, agent.policy).map_err(|e| spawn_error(self, e))?;
        agent.track_group(pid);
        Ok(pid)
    }
}

/// Resolves a user spec, falling back to the sandbox's default user.
pub fn user(agent: &Agent, spec: Option<&str>) -> Result<User, AgentError> {
    users::lookup(&agent.root, spec.unwrap_or(&agent.default_user))
}

/// Opens the working directory inside the root.
pub fn cwd(agent: &Agent, cwd: &str) -> Result<OwnedFd, AgentError> {
    let p = SandboxPath::parse(cwd)?;
    agent.root.open_dir(&p).map_err(|e| AgentError::new(e.kind, format!("working directory {}", e.message)))
}

/// argv for a protocol `Command`: a shell string runs through the sandbox's
/// shell, an argv as it is.
pub fn argv(agent: &Agent, command: &Command) -> Result<Vec<String>, AgentError> {
    match command {
        Command::Shell(s) => Ok(vec![agent.shell().to_string(), "-c".to_string(), s.clone()]),
        Command::Argv(v) if v.is_empty() => Err(invalid("empty argv")),
        Command::Argv(v) => Ok(v.clone()),
    }
}

/// Builds the launch: PATH lookup happens here, so a missing program is a
/// clean `SpawnFailed` before anything is spawned.
pub fn prepare(argv: Vec<String>, env: &Env, cwd: OwnedFd, user: User) -> Result<Launch, AgentError> {
    envs::validate(env)?;
    let path = envs::get(env, "PATH").unwrap_or(envs::DEFAULT_PATH);
    let name = argv.first().ok_or_else(|| invalid("empty argv"))?;
    let program =
        spawn::find_program(name, path).ok_or_else(|| AgentError::new(ErrorKind::SpawnFailed, format!("{name}: command not found")))?;
    let argv =
        argv.into_iter().map(|a| CString::new(a).map_err(|_| invalid("argument contains a NUL byte"))).collect::<Result<Vec<_>, _>>()?;
    Ok(Launch { program, argv, envp: envs::to_cstrings(env)?, cwd, user })
}

/// The error reply for a failed spawn.
pub fn spawn_error(launch: &Launch, e: SpawnError) -> AgentError {
    let program = launch.program.to_string_lossy();
    match e.step {
        Step::Chdir => AgentError::new(kind_of(e.errno), format!("working directory: {}", e.errno)),
        Step::Exec => AgentError::new(ErrorKind::SpawnFailed, format!("exec {program}: {}", e.errno)),
        _ => AgentError::new(ErrorKind::SpawnFailed, format!("{program}: {e}")),
    }
}

/// A pipe for a child's stdio, mapped to an error reply.
pub fn pipe() -> Result<(OwnedFd, OwnedFd), AgentError> {
    spawn::pipe().map_err(|e| os_err("pipe", e))
}
