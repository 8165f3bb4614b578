//! State events: every saved change of a sandbox's record is published on
//! the node's broadcast channel, for the per-sandbox and per-job event
//! streams of the API. A subscriber that falls behind loses events (and is
//! told so by the channel); it can always re-read the current state.

use tokio::sync::broadcast;

use crate::edge::Edge;
use crate::model::{now_ms, SandboxRecord, State};

/// Events kept for slow subscribers before they start losing some.
pub const EVENT_BUFFER: usize = 8192;

#[derive(Debug, Clone, PartialEq)]
pub struct SandboxEvent {
    pub id: String,
    pub tenant: String,
    pub job: Option<String>,
    pub state: State,
    pub reason: Option<String>,
    pub at_ms: u64,
    pub queue_position: Option<u64>,
}

impl SandboxEvent {
    pub fn of(rec: &SandboxRecord) -> Self {
        SandboxEvent {
            id: rec.id.clone(),
            tenant: rec.tenant.clone(),
            job: rec.spec.job.clone(),
            state: rec.state,
            reason: rec.reason.clone(),
            at_ms: now_ms(),
            queue_position: rec.queue_position,
        }
    }
}

pub(crate) fn channel() -> broadcast::Sender<SandboxEvent> {
    broadcast::channel(EVENT_BUFFER).0
}

impl Edge {
    /// Every state event of this node from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<SandboxEvent> {
        self.inner.events.subscribe()
    }

    /// Queues the record for the database and publishes it.
    pub(crate) fn save(&self, rec: &SandboxRecord) {
        self.inner.store.upsert(rec);
        self.publish(rec);
    }

    pub(crate) fn publish(&self, rec: &SandboxRecord) {
        // No subscriber is not an error.
        let _ = self.inner.events.send(SandboxEvent::of(rec));
    }
}
