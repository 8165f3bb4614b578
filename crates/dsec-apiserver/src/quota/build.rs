//! A Dockerfile build under its project's quotas. A build runs its steps
//! one after another, each in a sandbox of the caller's project, so the
//! build holds one sandbox with the step limits it asked for against the
//! project and every ancestor from its start to its end, however it ends
//! (finished, failed, or cancelled by the client going away). The step
//! sandboxes themselves are never committed to the ledger: the hold
//! stands for them, and the reconciling listings skip them.

use std::sync::Arc;
use std::time::Instant;

use dsec_build::BuildRequest;
use dsec_edge::model::Caller;

use super::create::asked;
use super::{Ledger, Reservation};
use crate::error::ApiError;
use crate::state::AppState;

/// What a running build holds; given back when dropped.
pub struct BuildHold {
    ledger: Arc<Ledger>,
    reservation: Option<Reservation>,
}

impl Drop for BuildHold {
    fn drop(&mut self) {
        if let Some(r) = self.reservation.take() {
            self.ledger.release(r);
        }
    }
}

fn held_by(ledger: &Arc<Ledger>, project: &str, req: &BuildRequest) -> Result<BuildHold, super::QuotaExceeded> {
    // One step sandbox at a time.
    let reservation = ledger.reserve(project, asked(req.cpu_cores, req.memory_mb, req.disk_mb), Instant::now())?;
    Ok(BuildHold { ledger: ledger.clone(), reservation: Some(reservation) })
}

/// Holds a build's sandbox for `caller`'s project, or refuses the build
/// (429 `quota_exceeded`) before it starts. `None`: this apiserver keeps
/// no ledger (an edge behind apiservers; the one in front holds).
pub fn hold(st: &AppState, caller: &Caller, req: &BuildRequest) -> Result<Option<BuildHold>, ApiError> {
    let Some(tokens) = st.auth.tokens() else { return Ok(None) };
    Ok(Some(held_by(tokens.ledger(), &caller.tenant, req)?))
}

#[cfg(test)]
mod tests {
    use dsec_store::{Limit, Quota};

    use super::super::create::DEFAULT_DISK_MB;
    use super::super::Held;
    use super::*;

    #[test]
    fn a_build_holds_one_sandbox_of_its_step_limits_until_dropped() {
        let quota = Quota { sandboxes: Some(1), memory_mb: Some(600), ..Quota::default() };
        let ledger = Arc::new(Ledger::new([("team".to_string(), quota)]));
        let small = BuildRequest { memory_mb: Some(256), ..BuildRequest::default() };
        let too_big = BuildRequest { memory_mb: Some(1024), ..BuildRequest::default() };
        assert_eq!(held_by(&ledger, "team/x", &too_big).err().map(|e| e.limit), Some(Limit::MemoryMb));
        let hold = held_by(&ledger, "team/x", &small).unwrap();
        assert_eq!(ledger.holds("team"), Held { sandboxes: 1, cpu_millis: 1000, memory_mb: 256, disk_mb: DEFAULT_DISK_MB });
        let e = ledger.reserve("team", Held::sandbox(0.5, 64, 64), Instant::now()).unwrap_err();
        assert_eq!(e.limit, Limit::Sandboxes, "the build's step sandbox counts while it runs");
        drop(hold);
        assert_eq!(ledger.holds("team"), Held::default(), "given back when the build ends");
        assert!(ledger.consistent());
    }
}
