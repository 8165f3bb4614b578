//! Dockerfile builds (`dsec image build NAME -f Dockerfile CONTEXT`): the
//! Dockerfile parser, `.dockerignore`, the build context, the step cache,
//! and the builder that carries out each step in a container sandbox of
//! the edge and packs its changes into a layer.

mod agent_io;
pub mod cache;
pub mod context;
mod copy;
pub mod dockerfile;
pub mod engine;
pub mod error;
pub mod ignore;
mod stage;
mod steps;

pub use cache::is_cache_image;
pub use context::Context;
pub use engine::{BuildEvent, BuildRequest, BuildSummary, Builder, BUILD_LABEL};
pub use error::BuildError;

/// Runs blocking work (the image store, file walks) off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, BuildError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| BuildError::Store(format!("a blocking task failed: {e}")))
}
