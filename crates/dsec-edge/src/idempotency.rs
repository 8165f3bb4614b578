//! Idempotency keys: a request retried with the same key by the same tenant
//! gets the first request's result instead of doing the work twice; the
//! same key with a different request is an error. Keys are kept per scope
//! in the node's journal (`create` now; snapshots, when they come, use the
//! same table with scope `snapshot`) and dropped with the sandbox they
//! name.

use std::time::Duration;

use crate::edge::Edge;
use crate::error::EdgeError;
use crate::journal::Claim;
use crate::model::{Caller, SandboxRecord};
use crate::spec::SandboxRequest;

/// Scope of creation keys in the journal.
pub const SCOPE_CREATE: &str = "create";
/// How often a retry polls a first request that is still in progress.
const IN_PROGRESS_POLL: Duration = Duration::from_millis(25);

fn journal_err(e: crate::journal::JournalError) -> EdgeError {
    EdgeError::Internal(e.to_string())
}

impl Edge {
    /// Creates a sandbox unless this tenant already created one with `key`;
    /// then returns that one (as it is now). `fingerprint` identifies the
    /// request's body: the same key with another body is an error.
    pub async fn create_idempotent(&self, caller: &Caller, req: SandboxRequest, key: &str, fingerprint: &str) -> Result<SandboxRecord, EdgeError> {
        if key.is_empty() || key.len() > 256 {
            return Err(EdgeError::Invalid("an idempotency key must have 1 to 256 characters".into()));
        }
        // Finish (and settle the key) even if the caller goes away: a retry
        // must find the sandbox this request made.
        let (edge, caller, key, fingerprint) = (self.clone(), caller.clone(), key.to_string(), fingerprint.to_string());
        tokio::spawn(async move { edge.create_keyed(&caller, req, &key, &fingerprint).await })
            .await
            .map_err(|e| EdgeError::Internal(format!("creation task failed: {e}")))?
    }

    async fn create_keyed(&self, caller: &Caller, req: SandboxRequest, key: &str, fingerprint: &str) -> Result<SandboxRecord, EdgeError> {
        let journal = &self.inner.journal;
        let deadline = tokio::time::Instant::now() + self.inner.config.create_timeout * 4;
        loop {
            match journal.claim(&caller.tenant, SCOPE_CREATE, key, fingerprint).map_err(journal_err)? {
                Claim::New => {
                    return match self.create(caller, req).await {
                        Ok(rec) => {
                            journal.settle(&caller.tenant, SCOPE_CREATE, key, &rec.id).map_err(journal_err)?;
                            Ok(rec)
                        }
                        Err(e) => {
                            // Nothing was made: a retry may try again.
                            let _ = journal.release(&caller.tenant, SCOPE_CREATE, key);
                            Err(e)
                        }
                    };
                }
                Claim::Existing { fingerprint: first, .. } if first != fingerprint => {
                    return Err(EdgeError::IdempotencyConflict(key.to_string()));
                }
                Claim::Existing { target: Some(id), .. } => return self.get(caller, &id),
                Claim::Existing { target: None, .. } => {
                    // The first request is still creating: wait for it.
                    if tokio::time::Instant::now() > deadline {
                        return Err(EdgeError::Timeout(format!("the first request with idempotency key {key:?} is still in progress")));
                    }
                    tokio::time::sleep(IN_PROGRESS_POLL).await;
                }
            }
        }
    }
}
