//! cgroup v1 directories made ahead of demand, renamed to a sandbox's id
//! when it is created.
//!
//! Making a sandbox's cgroups (one mkdir per hierarchy) costs about a
//! quarter of a millisecond here, mostly the memory cgroup's allocations
//! (its per-memcg shrinker map alone is ~1 MiB on a host that once had many
//! superblocks); renaming ready ones costs a fifth of that. cgroup v1 allows
//! a rename within the same parent; cgroup2 allows none, so v2 has no pool.
//!
//! Pool directories are named `pool-<run>-<n>`, `<run>` unique to this edge
//! process, so the reaper can tell this run's pool (left alone: see
//! `V1Cgroups::list`) from a dead run's (removed like any stray cgroup).
//! A crash half-way through a claim leaves at worst a stray pool directory
//! or a cgroup named after a sandbox that never started, which the reaper
//! or recovery removes; no process is placed in a cgroup before its claim
//! is complete.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{io_err, rmdir_retry, CgroupError, CgroupLimits};
use crate::prewarm::Prewarm;

/// Directories of an edge run's pool start with this, plus the run token.
const POOL_PREFIX: &str = "pool-";

pub(super) struct V1Pool {
    pool: Prewarm<String>,
    /// `pool-<run>-`: names this run's pool entries.
    pub(super) run_prefix: String,
}

impl std::fmt::Debug for V1Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("V1Pool").field("run_prefix", &self.run_prefix).field("ready", &self.pool.ready()).finish()
    }
}

impl V1Pool {
    /// Starts keeping `size` ready cgroups under every parent.
    pub(super) fn start(parents: Vec<PathBuf>, size: usize) -> std::io::Result<V1Pool> {
        let run_prefix = format!("{POOL_PREFIX}{}-", run_token());
        let (make_parents, make_prefix) = (parents.clone(), run_prefix.clone());
        let next = AtomicU64::new(0);
        let make = move || {
            let name = format!("{make_prefix}{}", next.fetch_add(1, Ordering::Relaxed));
            make_one(&make_parents, &name).map(|()| name)
        };
        let discard = move |name: String| remove_everywhere(&parents, &name);
        let pool = Prewarm::start("dsec-cgroup-pool", "cgroups", size, make, discard)?;
        Ok(V1Pool { pool, run_prefix })
    }

    /// The name of a ready cgroup, if there is one; it is the caller's to
    /// `claim`.
    pub(super) fn take(&self) -> Option<String> {
        self.pool.take()
    }
}

/// Names the ready cgroup `pooled` `name` and sets its limits. `false`: the
/// claim failed and what it touched is gone; the caller makes the cgroup
/// itself.
pub(super) fn claim(parents: &[(PathBuf, Vec<String>)], pooled: &str, name: &str, limits: &CgroupLimits) -> bool {
    match rename_and_limit(parents, pooled, name, limits) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(error = %e, "claiming a pooled cgroup failed; making one");
            let dirs: Vec<PathBuf> = parents.iter().map(|(p, _)| p.clone()).collect();
            remove_everywhere(&dirs, pooled);
            remove_everywhere(&dirs, name);
            false
        }
    }
}

/// Distinguishes this edge process's pool from earlier ones on the node.
fn run_token() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{:x}{:05x}", std::process::id(), nanos & 0xfffff)
}

/// One pooled cgroup: a directory in every hierarchy, swapping off (the
/// per-sandbox setting `create` writes), no limits yet.
fn make_one(parents: &[PathBuf], name: &str) -> std::io::Result<()> {
    let made = (|| {
        for parent in parents {
            let dir = parent.join(name);
            std::fs::create_dir(&dir)?;
            let swappiness = dir.join("memory.swappiness");
            if swappiness.exists() {
                std::fs::write(&swappiness, "0")?;
            }
        }
        Ok(())
    })();
    if made.is_err() {
        remove_everywhere(parents, name);
    }
    made
}

fn rename_and_limit(parents: &[(PathBuf, Vec<String>)], pooled: &str, name: &str, l: &CgroupLimits) -> Result<(), CgroupError> {
    for (parent, _) in parents {
        let to = parent.join(name);
        std::fs::rename(parent.join(pooled), &to).map_err(|e| io_err(&to, e))?;
    }
    for (parent, ctrls) in parents {
        super::v1::write_limits(&parent.join(name), ctrls, l)?;
    }
    Ok(())
}

fn remove_everywhere(parents: &[PathBuf], name: &str) {
    for parent in parents {
        let _ = rmdir_retry(&parent.join(name));
    }
}
