//! Keyed creations in the shared store: which node each (tenant,
//! idempotency key) was placed on.
//!
//! Every apiserver replica places on its own, so a retry of a creation
//! through another replica would be placed afresh and could land on a
//! node that never saw the key. The replica that places a keyed creation
//! first records the node here; a retry through any replica finds it and
//! asks the same node, whose journal dedups the key (a creation still
//! running there is waited for, a finished one answered again).

use std::future::Future;

use crate::Result;

/// How long a key's placement is kept: longer than any retry of it.
pub const CREATION_KEY_TTL_MS: u64 = 24 * 3600 * 1000;

pub trait CreationKeys: Send + Sync {
    /// Records that `tenant`'s creation `key` goes to `node`, unless it was
    /// recorded before; returns the node the key is recorded for (`node`,
    /// or the one an earlier call recorded).
    fn place_creation(&self, tenant: &str, key: &str, node: &str, now_ms: u64) -> impl Future<Output = Result<String>> + Send;

    /// Moves the key from `from` to `to` (the node refused the creation);
    /// `false` if it is no longer recorded for `from` (another replica
    /// moved it first: the caller follows that one).
    fn move_creation(&self, tenant: &str, key: &str, from: &str, to: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Forgets keys recorded before `before_ms`; how many.
    fn forget_creations(&self, before_ms: u64) -> impl Future<Output = Result<u64>> + Send;
}
