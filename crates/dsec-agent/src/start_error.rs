//! Why a mode of the agent binary ended before or instead of serving: the
//! one error its start-up paths return to `main`, which prints it (to the
//! console of a microVM, the guest's journal, the edge's log) and exits.

use dsec_agent_proto::codec::CodecError;
use dsec_agent_proto::AgentError;

use crate::setup_error::SetupError;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The command line names no mode this binary has.
    #[error("{0}")]
    Usage(String),
    /// A step of boot or of the sandbox's setup.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// A system call outside the setup steps (the process's hygiene, the
    /// event loop, the spawn helper's socket).
    #[error("{step}: {source}")]
    Os {
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The channel failed while saying Hello or before the setup request.
    #[error("{step}: {source}")]
    Channel {
        step: &'static str,
        #[source]
        source: CodecError,
    },
    /// The edge's first frame was not its Hello.
    #[error("expected the edge's Hello, got {0}")]
    NoHello(String),
    /// The edge and this agent speak no protocol version in common.
    #[error("no common protocol version: {0}")]
    Versions(String),
    /// The setup request was refused; the edge got the same error as its
    /// reply.
    #[error("setup failed: {}", .0.message)]
    Refused(AgentError),
}

impl StartError {
    pub fn os(step: &'static str) -> impl FnOnce(std::io::Error) -> StartError {
        move |source| StartError::Os { step, source }
    }

    pub fn channel(step: &'static str) -> impl FnOnce(CodecError) -> StartError {
        move |source| StartError::Channel { step, source }
    }
}
