//! Admission: the edge refuses a sandbox it has no room for, instead of
//! letting the node swap itself to death. CPU and memory may be overcommitted
//! (sandboxes mostly wait on the model: DSec saw 90% of them use at most 5% of
//! the CPU they asked for), by factors the operator sets.

use std::sync::Mutex;

use crate::error::EdgeError;
use crate::model::Limits;

#[derive(Debug, Clone, Copy)]
pub struct Capacity {
    pub cpu_cores: f64,
    pub memory_mb: u64,
    pub sandboxes: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Usage {
    pub cpu_cores: f64,
    pub memory_mb: u64,
    pub sandboxes: u64,
}

#[derive(Debug)]
pub struct Admission {
    capacity: Capacity,
    used: Mutex<Usage>,
}

impl Admission {
    pub fn new(capacity: Capacity) -> Self {
        Self { capacity, used: Mutex::new(Usage::default()) }
    }

    pub fn capacity(&self) -> Capacity {
        self.capacity
    }

    pub fn usage(&self) -> Usage {
        *self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves room for a sandbox or says clearly what is missing.
    pub fn reserve(&self, l: &Limits) -> Result<(), EdgeError> {
        let mut u = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let c = &self.capacity;
        if u.sandboxes + 1 > c.sandboxes {
            return Err(EdgeError::NoCapacity(format!("node already runs its maximum of {} sandboxes", c.sandboxes)));
        }
        if u.memory_mb + l.memory_mb > c.memory_mb {
            return Err(EdgeError::NoCapacity(format!(
                "{} MiB of memory requested, {} of {} MiB (after overcommit) free on this node",
                l.memory_mb,
                c.memory_mb - u.memory_mb.min(c.memory_mb),
                c.memory_mb
            )));
        }
        if u.cpu_cores + l.cpu_cores > c.cpu_cores + 1e-9 {
            return Err(EdgeError::NoCapacity(format!(
                "{} CPU cores requested, {:.2} of {:.2} (after overcommit) free on this node",
                l.cpu_cores,
                (c.cpu_cores - u.cpu_cores).max(0.0),
                c.cpu_cores
            )));
        }
        u.sandboxes += 1;
        u.memory_mb += l.memory_mb;
        u.cpu_cores += l.cpu_cores;
        Ok(())
    }

    pub fn release(&self, l: &Limits) {
        let mut u = self.used.lock().unwrap_or_else(|p| p.into_inner());
        u.sandboxes = u.sandboxes.saturating_sub(1);
        u.memory_mb = u.memory_mb.saturating_sub(l.memory_mb);
        u.cpu_cores = (u.cpu_cores - l.cpu_cores).max(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(mem: u64, cpu: f64) -> Limits {
        Limits { memory_mb: mem, cpu_cores: cpu, disk_mb: 1, pids: 1, cpu_quota_cores: None }
    }

    #[test]
    fn refuses_beyond_capacity_and_frees_on_release() {
        let a = Admission::new(Capacity { cpu_cores: 2.0, memory_mb: 1000, sandboxes: 3 });
        a.reserve(&limits(600, 1.0)).unwrap();
        let err = a.reserve(&limits(600, 0.5)).unwrap_err();
        assert!(err.to_string().contains("memory"), "{err}");
        a.reserve(&limits(100, 1.0)).unwrap();
        assert!(a.reserve(&limits(1, 0.5)).unwrap_err().to_string().contains("CPU"));
        a.release(&limits(600, 1.0));
        a.reserve(&limits(100, 0.5)).unwrap();
        a.reserve(&limits(100, 0.5)).unwrap();
        assert!(a.reserve(&limits(1, 0.0)).unwrap_err().to_string().contains("maximum of 3"));
        assert_eq!(a.usage().sandboxes, 3);
    }
}
