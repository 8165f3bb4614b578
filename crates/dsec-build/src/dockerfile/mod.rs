//! Dockerfiles: the syntax tree (`Dockerfile`), the parser (`parse`) and
//! the word rules of the instructions that expand variables (`words`).
//!
//! The parser keeps words as written (quotes and `$` references in place);
//! the builder expands them with the variables in scope at each step, the
//! way BuildKit does: `ENV`/`ARG` values, paths of `COPY`/`ADD`, `WORKDIR`,
//! `USER`, `LABEL`, `EXPOSE`, `FROM`, `STOPSIGNAL`, `VOLUME`. The shell form
//! of `RUN`, `CMD` and `ENTRYPOINT` is left to the shell.

pub mod parse;
pub mod words;

pub use parse::{parse, ParseError};

/// A parsed Dockerfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerfile {
    /// `ARG`s before the first `FROM`: usable in `FROM` lines only (and in a
    /// stage that declares them again without a value).
    pub global_args: Vec<ArgDecl>,
    /// At least one.
    pub stages: Vec<Stage>,
}

/// One `FROM` and the steps up to the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// Position among the stages, from 0 (what `COPY --from=0` names).
    pub index: usize,
    /// The base as written: an image reference, an earlier stage's name,
    /// or `scratch`; may hold `$` references to global args.
    pub base: String,
    /// `AS name`, lowercased (stage names are case-insensitive).
    pub name: Option<String>,
    /// `--platform=...` as written.
    pub platform: Option<String>,
    /// 1-based line of the `FROM`.
    pub line: usize,
    pub steps: Vec<Step>,
}

/// One instruction of a stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// 1-based line where the instruction starts.
    pub line: usize,
    /// The instruction as written, continuation lines joined with single
    /// spaces and comments between them dropped (for messages, progress and
    /// the step cache's key).
    pub text: String,
    pub instruction: Instruction,
}

/// `ARG name[=default]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgDecl {
    pub name: String,
    /// Unexpanded, as written.
    pub default: Option<String>,
}

/// The two forms of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Shell form: the text, run as `SHELL + [text]` (default `/bin/sh -c`).
    /// For `RUN <<EOF` (a heredoc as the whole command) it is the heredoc's
    /// body; for a heredoc fed to a command (`RUN python3 <<EOF`) it is the
    /// command line, a newline, the body and the terminator, which the
    /// shell itself understands.
    Shell(String),
    /// Exec form: a JSON array of strings, run as is.
    Exec(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instruction {
    Run {
        command: Command,
        /// `--network=none|default|host` as written.
        network: Option<String>,
    },
    /// `COPY` and `ADD`.
    Copy(CopySpec),
    /// `ENV k=v ...` or the legacy `ENV k v`; values unexpanded.
    Env(Vec<(String, String)>),
    Arg(Vec<ArgDecl>),
    /// Unexpanded.
    Workdir(String),
    /// Unexpanded (`user[:group]`).
    User(String),
    /// Keys and values unexpanded.
    Label(Vec<(String, String)>),
    /// Unexpanded words (`80`, `53/udp`).
    Expose(Vec<String>),
    Entrypoint(Command),
    Cmd(Command),
    Healthcheck(Healthcheck),
    /// `SHELL ["executable", "parameters"]` (exec form only).
    Shell(Vec<String>),
    /// Unexpanded.
    StopSignal(String),
    /// Unexpanded paths (JSON or space-separated).
    Volume(Vec<String>),
}

/// `COPY`/`ADD [--from=..] [--chown=..] [--chmod=..] src... dest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopySpec {
    /// `ADD` (unpacks local tar archives) rather than `COPY`.
    pub add: bool,
    /// Unexpanded words; may hold wildcards (`*`, `?`, `[...]`).
    pub sources: Vec<String>,
    /// Unexpanded.
    pub dest: String,
    /// `--from=` as written: a stage name or index, or an image.
    pub from: Option<String>,
    pub chown: Option<String>,
    pub chmod: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Healthcheck {
    /// `HEALTHCHECK NONE`: turn off a check the base image set.
    None,
    Check {
        /// `CMD` in shell or exec form.
        test: Command,
        /// The options as written (`30s`, `3`); absent: the default.
        interval: Option<String>,
        timeout: Option<String>,
        start_period: Option<String>,
        start_interval: Option<String>,
        retries: Option<String>,
    },
}
