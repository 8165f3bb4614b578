//! Creation backpressure: at most `max_creating` sandboxes are being
//! created at once on a node; the others wait here, in a bounded queue that
//! is fair across jobs (round-robin between jobs, FIFO within one), so one
//! job's burst of thousands does not starve another job's single sandbox.
//! Only a full queue refuses (`creation_queue_full`, 429 + Retry-After).
//!
//! A finished creation hands its slot straight to the next waiter, so a
//! burst drains without a thundering herd.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::error::EdgeError;

struct Waiter {
    id: String,
    go: oneshot::Sender<()>,
}

#[derive(Default)]
struct QueueState {
    creating: usize,
    /// Jobs with waiters, in the order they will next be served.
    ring: VecDeque<String>,
    waiting: HashMap<String, VecDeque<Waiter>>,
    queued: usize,
}

pub struct CreateQueue {
    /// 0 = no bound (no queue at all).
    max_creating: usize,
    max_queued: usize,
    state: Mutex<QueueState>,
}

/// The right to create one sandbox; frees the slot when dropped.
pub struct Slot {
    queue: Arc<CreateQueue>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.queue.release();
    }
}

/// Either a slot now, or a place in the queue.
pub enum Ticket {
    Go(Slot),
    Wait(oneshot::Receiver<()>),
}

impl CreateQueue {
    pub fn new(max_creating: usize, max_queued: usize) -> Arc<Self> {
        Arc::new(Self { max_creating, max_queued, state: Mutex::new(QueueState::default()) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot at once if one is free and nobody waits; otherwise a place in
    /// `job`'s line, or `QueueFull`.
    pub fn enter(self: &Arc<Self>, job: &str, id: &str) -> Result<Ticket, EdgeError> {
        let mut s = self.lock();
        if self.max_creating == 0 || (s.creating < self.max_creating && s.queued == 0) {
            s.creating += 1;
            return Ok(Ticket::Go(Slot { queue: self.clone() }));
        }
        if s.queued >= self.max_queued {
            return Err(EdgeError::QueueFull(format!("{} creations are already waiting on this node (its queue bound)", s.queued)));
        }
        let (go, wait) = oneshot::channel();
        let line = s.waiting.entry(job.to_string()).or_default();
        line.push_back(Waiter { id: id.to_string(), go });
        if line.len() == 1 {
            s.ring.push_back(job.to_string());
        }
        s.queued += 1;
        Ok(Ticket::Wait(wait))
    }

    /// Turns a granted wait into its slot (the slot was counted at hand-off).
    pub fn granted(self: &Arc<Self>) -> Slot {
        Slot { queue: self.clone() }
    }

    fn release(&self) {
        let mut s = self.lock();
        s.creating = s.creating.saturating_sub(1);
        while let Some(job) = s.ring.pop_front() {
            let Some(line) = s.waiting.get_mut(&job) else { continue };
            let Some(w) = line.pop_front() else {
                s.waiting.remove(&job);
                continue;
            };
            if line.is_empty() {
                s.waiting.remove(&job);
            } else {
                s.ring.push_back(job);
            }
            s.queued -= 1;
            if w.go.send(()).is_ok() {
                s.creating += 1;
                return;
            }
        }
    }

    /// Takes a waiter out of the queue (its sandbox was stopped). False if
    /// it was not waiting (already granted, or never queued).
    pub fn cancel(&self, job: &str, id: &str) -> bool {
        let mut s = self.lock();
        let Some(line) = s.waiting.get_mut(job) else { return false };
        let Some(i) = line.iter().position(|w| w.id == id) else { return false };
        line.remove(i);
        if line.is_empty() {
            s.waiting.remove(job);
            s.ring.retain(|j| j != job);
        }
        s.queued -= 1;
        true
    }

    /// How many creations will be served before this one (0 = next).
    pub fn position(&self, job: &str, id: &str) -> Option<u64> {
        let s = self.lock();
        let i = s.waiting.get(job)?.iter().position(|w| w.id == id)?;
        let r = s.ring.iter().position(|j| j == job)?;
        // Round k serves the k-th waiter of every job still waiting, in ring
        // order: ours goes in round i, after the jobs before it that still
        // have an i-th waiter.
        let ahead: usize = s
            .ring
            .iter()
            .enumerate()
            .map(|(k, j)| {
                let len = s.waiting.get(j).map_or(0, |l| l.len());
                len.min(i) + usize::from(k < r && len > i)
            })
            .sum();
        Some(ahead as u64)
    }

    /// (being created, waiting).
    pub fn counts(&self) -> (usize, usize) {
        let s = self.lock();
        (s.creating, s.queued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(t: Ticket) -> oneshot::Receiver<()> {
        match t {
            Ticket::Wait(w) => w,
            Ticket::Go(_) => panic!("expected to wait"),
        }
    }

    #[test]
    fn serves_jobs_round_robin_and_hands_slots_over() {
        let q = CreateQueue::new(1, 10);
        let Ok(Ticket::Go(first)) = q.enter("a", "a0") else { panic!("the first goes at once") };
        let mut a1 = wait(q.enter("a", "a1").unwrap());
        let mut a2 = wait(q.enter("a", "a2").unwrap());
        let mut b1 = wait(q.enter("b", "b1").unwrap());
        assert_eq!(q.position("a", "a1"), Some(0));
        assert_eq!(q.position("b", "b1"), Some(1), "b's first comes before a's second");
        assert_eq!(q.position("a", "a2"), Some(2));
        drop(first);
        assert!(a1.try_recv().is_ok());
        let s1 = q.granted();
        assert_eq!(q.counts(), (1, 2));
        drop(s1);
        assert!(b1.try_recv().is_ok(), "round robin: b before a's second");
        assert!(a2.try_recv().is_err());
        drop(q.granted());
        assert!(a2.try_recv().is_ok());
        drop(q.granted());
        assert_eq!(q.counts(), (0, 0));
    }

    #[test]
    fn a_full_queue_refuses_and_cancel_frees_a_place() {
        let q = CreateQueue::new(1, 1);
        let Ok(Ticket::Go(_slot)) = q.enter("", "x0") else { panic!() };
        let _w = wait(q.enter("", "x1").unwrap());
        assert!(matches!(q.enter("", "x2"), Err(EdgeError::QueueFull(_))));
        assert!(q.cancel("", "x1"));
        assert!(!q.cancel("", "x1"));
        assert!(matches!(q.enter("", "x2"), Ok(Ticket::Wait(_))));
    }

    #[test]
    fn unbounded_never_waits() {
        let q = CreateQueue::new(0, 0);
        let slots: Vec<_> = (0..100).map(|i| q.enter("", &i.to_string()).unwrap()).collect();
        assert!(slots.iter().all(|t| matches!(t, Ticket::Go(_))));
    }

    #[test]
    fn a_cancelled_receiver_passes_the_slot_on() {
        let q = CreateQueue::new(1, 10);
        let Ok(Ticket::Go(slot)) = q.enter("", "a") else { panic!() };
        drop(wait(q.enter("", "b").unwrap()));
        let mut c = wait(q.enter("", "c").unwrap());
        drop(slot);
        assert!(c.try_recv().is_ok());
    }
}
