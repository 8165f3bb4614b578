//! A sandbox's CPU QoS class: applied to its tasks once they exist, and
//! changed while it lives (a task's stages differ: a rollout waits on its
//! steps, a build after it need not).

use crate::cgroup::QosClass;
use crate::edge::{lock, Edge};
use crate::error::EdgeError;
use crate::model::{Caller, SandboxRecord, State};

impl Edge {
    /// Changes the QoS class of a sandbox that has not ended: the record
    /// (durable first), then its cgroup's weights and its tasks. A queued
    /// sandbox gets it when it starts, a suspended VM when it is restored.
    pub async fn set_qos(&self, caller: &Caller, id: &str, class: QosClass) -> Result<SandboxRecord, EdgeError> {
        let entry = self.entry(caller, id)?;
        // One operation at a time: a pause, resume or restore in flight
        // settles first, so the class reaches the processes it leaves.
        let _op = entry.op_lock.lock().await;
        let rec = {
            let mut r = lock(&entry.record);
            if r.state.is_terminal() {
                return Err(EdgeError::Ended { id: id.to_string(), state: r.state.as_str() });
            }
            r.spec.qos_class = class;
            r.clone()
        };
        self.save(&rec);
        if rec.state != State::Queued && !rec.suspended {
            let cgroups = self.inner.cgroups.clone();
            let name = id.to_string();
            tokio::task::spawn_blocking(move || cgroups.set_qos(&name, class)).await.map_err(EdgeError::task("QoS"))??;
        }
        tracing::info!(id, class = class.as_str(), "QoS class set");
        Ok(entry.record())
    }

    /// Puts the tasks of a sandbox that just started (`fresh`) or was
    /// restored in its class. A failure is logged, not fatal: the weights
    /// in its cgroup already hold, only the per-task part is missing.
    pub(crate) fn apply_task_qos(&self, rec: &SandboxRecord, fresh: bool) {
        let class = rec.spec.qos_class;
        let applied =
            if fresh { self.inner.cgroups.set_task_qos(&rec.id, class, true) } else { self.inner.cgroups.set_qos(&rec.id, class) };
        if let Err(e) = applied {
            tracing::warn!(id = %rec.id, class = class.as_str(), error = %e, "applying the QoS class to the sandbox's tasks failed");
        }
    }
}
