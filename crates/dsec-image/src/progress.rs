//! Progress reporting for long builds. The crate only reports; drawing (the
//! CLI's progress bars) is the caller's business.

/// What a `done`/`total` pair counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Items,
}

/// Receives progress of a build. Both methods default to doing nothing, so
/// an implementation picks what it cares about. Called from the building
/// thread (and from a helper thread that relays tool output), hence `Sync`.
pub trait Progress: Send + Sync {
    /// A new step started, or a line of a tool's output (debootstrap's
    /// `I: Retrieving ...` lines arrive here as they are printed).
    fn stage(&self, _text: &str) {}

    /// Position within the current step; `total` when known.
    fn advance(&self, _done: u64, _total: Option<u64>, _unit: Unit) {}
}

/// Ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// Adapts a closure over [`ProgressEvent`]s, for callers that prefer one
/// function (and for tests).
pub struct ProgressFn<F>(pub F);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressEvent<'a> {
    Stage(&'a str),
    Advance { done: u64, total: Option<u64>, unit: Unit },
}

impl<F: Fn(ProgressEvent<'_>) + Send + Sync> Progress for ProgressFn<F> {
    fn stage(&self, text: &str) {
        (self.0)(ProgressEvent::Stage(text))
    }

    fn advance(&self, done: u64, total: Option<u64>, unit: Unit) {
        (self.0)(ProgressEvent::Advance { done, total, unit })
    }
}
