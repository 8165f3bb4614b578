//! Refused attempts of the sandbox's processes, recorded by the agent.
//!
//! The agent supervises its own seccomp filter (seccomp/mod.rs): the kernel
//! holds each process that makes a refused call until the agent answers
//! it. The agent records who tried what, then answers with the rule's
//! errno. Events live in a bounded ring (the edge reads it with
//! `Op::AuditEvents`), so a process that loops on refused calls costs a
//! fixed amount of memory and, since it waits for every answer, only its
//! own sandbox's CPU (the agent is in the sandbox's cgroup).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;

use dsec_agent_proto::{AuditEvent, AuditLog, AuditTally, FromAgent};

use crate::seccomp::policy;

/// Events kept per sandbox; older ones are dropped and counted.
pub const RING: usize = 256;
/// A reply carries at most this many events (the edge pages with `after`).
const PAGE: usize = 256;
/// Notifications answered per wake-up before other tasks get a turn.
const BATCH: usize = 64;

/// How long the tally waits after an event for more to come, so a flood
/// of refused attempts sends a few tallies a second, not one per event.
const TALLY_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

#[derive(Default)]
pub struct Ring {
    events: VecDeque<AuditEvent>,
    total: u64,
    dropped: u64,
    /// Events ever recorded, by kind (for the edge's metrics).
    tally: AuditTally,
    /// Woken on every event (see `report`).
    changed: Rc<tokio::sync::Notify>,
}

impl Ring {
    pub fn push(&mut self, time_ms: u64, kind: &str, pid: u32, detail: String) {
        self.total += 1;
        match self.tally.by_kind.iter_mut().find(|(k, _)| k == kind) {
            Some((_, n)) => *n += 1,
            None => self.tally.by_kind.push((kind.to_string(), 1)),
        }
        self.changed.notify_one();
        if self.events.len() == RING {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(AuditEvent { seq: self.total, time_ms, kind: kind.to_string(), pid, detail });
    }

    /// Events with a sequence number above `after`, oldest first.
    pub fn since(&self, after: u64) -> AuditLog {
        let events = self.events.iter().filter(|e| e.seq > after).take(PAGE).cloned().collect();
        AuditLog { events, total: self.total, dropped: self.dropped }
    }
}

/// Sends the edge on `conn` the tally of `ring`: at once if anything was
/// recorded before it connected, then after each burst of events. The
/// caller aborts it when the connection ends.
pub async fn report(ring: Rc<RefCell<Ring>>, conn: Rc<crate::channel::Conn>) {
    let changed = ring.borrow().changed.clone();
    let mut first = true;
    loop {
        if !first {
            changed.notified().await;
            tokio::time::sleep(TALLY_DELAY).await;
        }
        first = false;
        if conn.is_closed() {
            return;
        }
        let tally = {
            let ring = ring.borrow();
            (ring.total > 0).then(|| ring.tally.clone())
        };
        if let Some(tally) = tally {
            let _ = conn.send(&FromAgent::Audited(tally));
        }
    }
}

pub(crate) use dsec_agent_proto::now_ms;

/// The process's command name, for the event (best effort: it may be gone).
fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim_end().to_string()).unwrap_or_default()
}

fn errno_name(e: i32) -> &'static str {
    match e {
        libc::EPERM => "EPERM",
        libc::ENOSYS => "ENOSYS",
        libc::EACCES => "EACCES",
        _ => "error",
    }
}

/// Answers the filter's notifications for as long as the agent lives,
/// recording each in `ring`.
pub async fn supervise(ring: Rc<RefCell<Ring>>, listener: OwnedFd) {
    let fd = match crate::aio::register(listener) {
        Ok(fd) => fd,
        Err(e) => {
            // Without a supervisor every refused call fails with ENOSYS
            // (the kernel's answer once the listener is gone): still refused,
            // only not recorded.
            eprintln!("dsec-agent: cannot watch the seccomp listener: {}", e.message);
            return;
        }
    };
    loop {
        let mut guard = match fd.readable().await {
            Ok(g) => g,
            Err(e) => {
                eprintln!("dsec-agent: seccomp listener: {e}");
                return;
            }
        };
        for _ in 0..BATCH {
            if !pending(guard.get_inner().as_raw_fd()) {
                break;
            }
            answer_one(&ring, guard.get_inner().as_raw_fd());
        }
        if pending(guard.get_inner().as_raw_fd()) {
            drop(guard);
            tokio::task::yield_now().await;
        } else {
            guard.clear_ready();
        }
    }
}

/// Whether a notification waits (the receive ioctl would block otherwise).
fn pending(fd: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd on our stack, zero timeout.
    unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLIN != 0 }
}

fn answer_one(ring: &RefCell<Ring>, fd: i32) {
    // SAFETY: the kernel requires a zeroed seccomp_notif; all-zero bytes
    // are a valid value of this plain C struct.
    let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: RECV fills `req` (a seccomp_notif on our stack).
    if unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut req) } != 0 {
        // ENOENT: the caller was killed before we got to it.
        return;
    }
    let args = req.data.args;
    let (name, errno, why) = match policy::lookup(req.data.nr, &args) {
        Some(rule) => (rule.name, rule.errno, rule.why),
        // The filter and the table come from the same data; refuse anyway.
        None => ("unknown", libc::EPERM, "not in the policy table"),
    };
    let resp = libc::seccomp_notif_resp { id: req.id, val: 0, error: -errno, flags: 0 };
    // SAFETY: SEND reads `resp` from our stack. ENOENT (the caller died
    // meanwhile) needs no handling.
    unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_SEND, &resp) };
    let who = comm(req.pid);
    let detail = format!("{name} refused with {} (by {who}): {why}", errno_name(errno));
    ring.borrow_mut().push(now_ms(), "syscall", req.pid, detail);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_is_bounded_and_counts_what_it_drops() {
        let mut r = Ring::default();
        for i in 0..(RING as u64 + 10) {
            r.push(i, "syscall", 7, format!("e{i}"));
        }
        let all = r.since(0);
        assert_eq!((all.events.len(), all.total, all.dropped), (RING, RING as u64 + 10, 10));
        assert_eq!(all.events[0].seq, 11, "the oldest ten fell out");
        let tail = r.since(RING as u64 + 8);
        assert_eq!(tail.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![RING as u64 + 9, RING as u64 + 10]);
        // The tally counts what the ring dropped too.
        assert_eq!(r.tally.by_kind, vec![("syscall".to_string(), RING as u64 + 10)]);
        r.push(0, "network", 1, "x".into());
        assert_eq!(r.tally.by_kind[1], ("network".to_string(), 1));
    }
}
