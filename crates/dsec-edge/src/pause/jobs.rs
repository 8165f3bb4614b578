//! Job-level operations: pause or resume every sandbox of a job on this
//! node in one call, all at once (each sandbox in its own task; the cgroup
//! work runs on the blocking pool).

use crate::edge::Edge;
use crate::error::EdgeError;
use crate::model::{Caller, ListFilter};

/// What a job-wide pause or resume did on this node.
#[derive(Debug, Default)]
pub struct JobOutcome {
    /// Sandboxes of the job visible to the caller on this node.
    pub matched: u64,
    /// Sandboxes whose state changed.
    pub changed: u64,
    /// Already in the asked-for state.
    pub unchanged: u64,
    /// Stopped or failed: skipped.
    pub ended: u64,
    /// Resident memory pushed out of RAM (pause).
    pub memory_freed_bytes: u64,
    /// (sandbox id, error) of each sandbox that could not change.
    pub failed: Vec<(String, EdgeError)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAction {
    Pause,
    Resume,
}

impl Edge {
    /// Pauses or resumes every live sandbox of `job` that `caller` sees.
    /// Idempotent: sandboxes already in the target state count as
    /// `unchanged`; stopped ones as `ended`.
    pub async fn job_action(&self, caller: &Caller, job: &str, action: JobAction) -> JobOutcome {
        let filter = ListFilter { job: Some(job.to_string()), ..Default::default() };
        let records = self.list(caller, &filter);
        let mut out = JobOutcome { matched: records.len() as u64, ..Default::default() };
        let mut set = tokio::task::JoinSet::new();
        for r in records {
            if r.state.is_terminal() {
                out.ended += 1;
                continue;
            }
            let (edge, caller) = (self.clone(), caller.clone());
            set.spawn(async move {
                let res = match action {
                    JobAction::Pause => edge.pause(&caller, &r.id).await.map(|o| (o.changed, o.memory.freed_bytes())),
                    JobAction::Resume => edge.resume(&caller, &r.id).await.map(|o| (o.changed, 0)),
                };
                (r.id, res)
            });
        }
        while let Some(joined) = set.join_next().await {
            let Ok((id, res)) = joined else { continue };
            match res {
                Ok((true, freed)) => {
                    out.changed += 1;
                    out.memory_freed_bytes += freed;
                }
                Ok((false, _)) => out.unchanged += 1,
                // It ended while we were at it.
                Err(EdgeError::Ended { .. }) => out.ended += 1,
                Err(e) => out.failed.push((id, e)),
            }
        }
        out.failed.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}
