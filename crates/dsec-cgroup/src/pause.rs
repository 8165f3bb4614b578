//! Freezing a sandbox's cgroup and pushing its memory out of RAM, and the
//! reverse. The freezer stops every process of the sandbox at once (v1
//! `freezer.state`, v2 `cgroup.freeze`); then the memory controller reclaims
//! the frozen pages into swap: on v1, which has no `memory.reclaim`, by
//! lowering `memory.limit_in_bytes` for a moment (without memsw accounting
//! the swapped pages no longer count); on v2 with `memory.reclaim`. Nothing
//! faults the pages back in while the processes are frozen, so the limit is
//! restored at once and resume only has to thaw.

use std::time::{Duration, Instant};

use super::{CgroupError, Cgroups};

/// What a push-out achieved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushOut {
    pub before_bytes: u64,
    pub after_bytes: u64,
}

impl PushOut {
    pub fn freed_bytes(&self) -> u64 {
        self.before_bytes.saturating_sub(self.after_bytes)
    }
}

/// The limit a frozen cgroup is squeezed to on v1: below it, what is left
/// is mostly kernel memory that cannot be swapped anyway.
pub const SQUEEZE_BYTES: u64 = 8 << 20;

/// Whole squeezes a v1 push-out tries, and the pause between them.
const SQUEEZE_ATTEMPTS: u32 = 3;
const RETRY_PAUSE: Duration = Duration::from_millis(100);

impl Cgroups {
    /// Freezes every process of the cgroup and waits until the kernel says
    /// they all are frozen (a task in uninterruptible sleep delays it).
    pub fn freeze(&self, name: &str, deadline: Duration) -> Result<(), CgroupError> {
        self.set_frozen(name, true)?;
        let t0 = Instant::now();
        let mut spins = 0u32;
        loop {
            match self.frozen(name) {
                Some(true) => return Ok(()),
                None => return Err(CgroupError::Gone(name.to_string())),
                Some(false) => {}
            }
            if t0.elapsed() > deadline {
                let _ = self.set_frozen(name, false);
                return Err(CgroupError::FreezeTimeout(name.to_string(), deadline));
            }
            // Most freezes finish within microseconds: spin a little before
            // sleeping.
            spins += 1;
            if spins < 50 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    pub fn thaw(&self, name: &str) -> Result<(), CgroupError> {
        self.set_frozen(name, false)
    }

    fn set_frozen(&self, name: &str, frozen: bool) -> Result<(), CgroupError> {
        match self {
            Cgroups::V1(c) => c.set_frozen(name, frozen),
            Cgroups::V2(c) => c.set_frozen(name, frozen),
        }
    }

    /// `Some(true)` once every process is frozen; `None` if the cgroup is gone.
    pub fn frozen(&self, name: &str) -> Option<bool> {
        match self {
            Cgroups::V1(c) => c.frozen(name),
            Cgroups::V2(c) => c.frozen(name),
        }
    }

    /// Pushes a frozen cgroup's memory out (to swap if there is any; page
    /// cache is dropped either way) within `budget`, and restores
    /// `limit_bytes`.
    pub fn push_out(&self, name: &str, limit_bytes: u64, budget: Duration) -> Result<PushOut, CgroupError> {
        let before = self.memory_usage(name).ok_or_else(|| CgroupError::Gone(name.to_string()))?;
        let deadline = Instant::now() + budget;
        match self {
            Cgroups::V1(c) => {
                // A squeeze now and then stops early with most pages still
                // in RAM (seen only on a loaded host; cause not found: pages
                // off the LRU for a moment, or not yet aged). Squeezing again
                // while it is far from done and time remains gets them.
                for attempt in 0..SQUEEZE_ATTEMPTS {
                    c.squeeze(name, limit_bytes, deadline)?;
                    let now = self.memory_usage(name).unwrap_or(before);
                    if now * 10 <= before || Instant::now() + RETRY_PAUSE >= deadline || attempt + 1 == SQUEEZE_ATTEMPTS {
                        break;
                    }
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
            Cgroups::V2(c) => c.reclaim(name, deadline)?,
        }
        let after = self.memory_usage(name).unwrap_or(before);
        Ok(PushOut { before_bytes: before, after_bytes: after })
    }

    /// Writes the sandbox's memory limit again (resume, and recovery after a
    /// crash in the middle of a push-out).
    pub fn restore_memory_limit(&self, name: &str, limit_bytes: u64) -> Result<(), CgroupError> {
        match self {
            Cgroups::V1(c) => c.set_memory_limit(name, limit_bytes),
            Cgroups::V2(c) => c.set_memory_limit(name, limit_bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_is_never_negative() {
        assert_eq!(PushOut { before_bytes: 10, after_bytes: 3 }.freed_bytes(), 7);
        assert_eq!(PushOut { before_bytes: 3, after_bytes: 10 }.freed_bytes(), 0);
    }
}
