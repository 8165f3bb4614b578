//! Idempotency keys: a request retried with the same key by the same tenant
//! gets the first request's result instead of doing the work twice; the
//! same key with a different request is an error. Keys are kept per scope
//! in the node's journal (`create`, `snapshot`, `pack`) and dropped with
//! the sandbox they name.

use std::time::Duration;

use crate::edge::Edge;
use crate::error::EdgeError;
use crate::model::{Caller, SandboxRecord};
use crate::spec::SandboxRequest;
use crate::trajectory::journal::Claim;

/// Scope of creation keys in the journal.
pub const SCOPE_CREATE: &str = "create";
/// Scope of `pack_diff` keys.
pub const SCOPE_PACK: &str = "pack";
/// How often a retry polls a first request that is still in progress.
const IN_PROGRESS_POLL: Duration = Duration::from_millis(25);

fn journal_err(e: crate::trajectory::journal::JournalError) -> EdgeError {
    EdgeError::Journal(e)
}

impl Edge {
    /// Creates a sandbox unless this tenant already created one with `key`;
    /// then returns that one (as it is now). `fingerprint` identifies the
    /// request's body: the same key with another body is an error.
    pub async fn create_idempotent(
        &self,
        caller: &Caller,
        req: SandboxRequest,
        key: &str,
        fingerprint: &str,
    ) -> Result<SandboxRecord, EdgeError> {
        // Finish (and settle the key) even if the caller goes away: a retry
        // must find the sandbox this request made.
        let (edge, caller, key, fingerprint) = (self.clone(), caller.clone(), key.to_string(), fingerprint.to_string());
        tokio::spawn(async move { edge.create_keyed(&caller, req, &key, &fingerprint).await }).await.map_err(EdgeError::task("creation"))?
    }

    async fn create_keyed(&self, caller: &Caller, req: SandboxRequest, key: &str, fingerprint: &str) -> Result<SandboxRecord, EdgeError> {
        let work = async {
            let rec = self.create(caller, req).await?;
            let id = rec.id.clone();
            Ok((rec, id))
        };
        self.once(&caller.tenant, SCOPE_CREATE, key, fingerprint, work, |id| self.get(caller, id)).await
    }

    /// Runs `work` once per (tenant, scope, key): the first request runs
    /// it and binds the key to the target it names (a sandbox id, or a
    /// result to replay); a retry with the same fingerprint gets
    /// `replay(target)`, or waits while the first is still running; another
    /// fingerprint under the same key is an error. A failed first request
    /// gives the key back, so a retry may try again.
    pub(crate) async fn once<T>(
        &self,
        tenant: &str,
        scope: &str,
        key: &str,
        fingerprint: &str,
        work: impl std::future::Future<Output = Result<(T, String), EdgeError>>,
        replay: impl Fn(&str) -> Result<T, EdgeError>,
    ) -> Result<T, EdgeError> {
        if key.is_empty() || key.len() > 256 {
            return Err(EdgeError::Invalid("an idempotency key must have 1 to 256 characters".into()));
        }
        let journal = &self.inner.journal;
        let deadline = tokio::time::Instant::now() + self.inner.config.create_timeout * 4;
        let mut work = Some(work);
        loop {
            match journal.claim(tenant, scope, key, fingerprint).map_err(journal_err)? {
                Claim::New => {
                    // A key is claimed New at most once per request (the
                    // branch returns), so the work is always there.
                    let Some(work) = work.take() else { return Err(EdgeError::Invariant("idempotent work runs at most once")) };
                    return match work.await {
                        Ok((out, target)) => {
                            journal.settle(tenant, scope, key, &target).map_err(journal_err)?;
                            Ok(out)
                        }
                        Err(e) => {
                            let _ = journal.release(tenant, scope, key);
                            Err(e)
                        }
                    };
                }
                Claim::Existing { fingerprint: first, .. } if first != fingerprint => {
                    return Err(EdgeError::IdempotencyConflict(key.to_string()));
                }
                Claim::Existing { target: Some(target), .. } => return replay(&target),
                Claim::Existing { target: None, .. } => {
                    // The first request is still running: wait for it.
                    if tokio::time::Instant::now() > deadline {
                        return Err(EdgeError::Timeout(format!("the first request with idempotency key {key:?} is still in progress")));
                    }
                    tokio::time::sleep(IN_PROGRESS_POLL).await;
                }
            }
        }
    }
}
