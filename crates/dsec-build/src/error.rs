//! What can go wrong in a build, each naming the step where it did.

use dsec_edge::EdgeError;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The Dockerfile does not parse.
    #[error("Dockerfile: {0}")]
    Parse(#[from] crate::dockerfile::ParseError),
    /// A word of an instruction does not expand.
    #[error("line {line}: {source}")]
    Word {
        line: usize,
        #[source]
        source: crate::dockerfile::words::WordError,
    },
    /// The request itself: a bad name, a missing Dockerfile, an unknown
    /// target stage, a context that is not a tar archive.
    #[error("{0}")]
    Invalid(String),
    /// An instruction that cannot be carried out as written (a missing
    /// COPY source, a path outside the context, an unknown stage).
    #[error("line {line} ({text}): {message}")]
    Step { line: usize, text: String, message: String },
    /// A RUN step's command exited with a failure.
    #[error("line {line} ({text}): the command {how}{output}")]
    RunFailed { line: usize, text: String, how: String, output: String },
    /// The edge failed a sandbox operation of a step.
    #[error("line {line} ({text}): {source}")]
    Edge {
        line: usize,
        text: String,
        #[source]
        source: EdgeError,
    },
    /// The image store or a layer build failed.
    #[error("image store: {0}")]
    Store(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn io_err(what: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> BuildError {
    let path = path.display().to_string();
    move |source| BuildError::Io { what, path, source }
}
