use dsec_edge::EdgeError;

#[derive(Debug, thiserror::Error)]
pub enum FnCallError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    InvalidLimits(String),
    #[error("language {0:?} is not served here (available: {1})")]
    UnsupportedLanguage(String, String),
    #[error("every {language} runner is busy and {queued} calls are already waiting")]
    QueueFull { language: String, queued: usize, retry_after_s: u64 },
    #[error("no {0} runner became free within the queue timeout")]
    QueueTimeout(String),
    #[error("the runner failed: {0}")]
    RunnerFailed(String),
    /// The runner broke under a request (its monitor or zygote gone, no
    /// answer in time, a garbled answer): the call is run again on another
    /// runner, and callers see `RunnerFailed` only if that fails too.
    #[error("the runner was lost: {0}")]
    RunnerLost(String),
    #[error("could not start a runner: {0}")]
    Start(#[from] EdgeError),
    #[error("the FnCall service is shutting down")]
    ShuttingDown,
}
