//! The quota ledger: what each project holds (itself and every project
//! below it), and the check-and-reserve each creation goes through.
//!
//! One mutex guards it all, so a reservation checks the project and every
//! ancestor and takes from all of them in one step: concurrent creations
//! through one apiserver can never overshoot a limit. A reservation is
//! made before the creation, committed with the sandbox's id once it
//! exists, released if it failed; an ended sandbox gives its hold back.
//! Paused sandboxes keep their hold (they keep their disk and come back
//! with no check), so a resume can never exceed a quota.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dsec_store::projects::self_and_ancestors;
use dsec_store::{Limit, Quota};

use super::bucket::Bucket;

/// What a sandbox holds against its project's quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub sandboxes: u64,
    pub cpu_millis: u64,
    pub memory_mb: u64,
    pub disk_mb: u64,
}

impl Held {
    /// One sandbox with these limits.
    pub fn sandbox(cpu_cores: f64, memory_mb: u64, disk_mb: u64) -> Held {
        Held { sandboxes: 1, cpu_millis: (cpu_cores.max(0.0) * 1000.0).round() as u64, memory_mb, disk_mb }
    }

    pub fn get(&self, l: Limit) -> u64 {
        match l {
            Limit::Sandboxes => self.sandboxes,
            Limit::CpuMillis => self.cpu_millis,
            Limit::MemoryMb => self.memory_mb,
            Limit::DiskMb => self.disk_mb,
            Limit::CreationsPerS | Limit::FncallPerS => 0,
        }
    }

    fn add(&mut self, o: &Held) {
        self.sandboxes += o.sandboxes;
        self.cpu_millis += o.cpu_millis;
        self.memory_mb += o.memory_mb;
        self.disk_mb += o.disk_mb;
    }

    fn sub(&mut self, o: &Held) {
        self.sandboxes = self.sandboxes.saturating_sub(o.sandboxes);
        self.cpu_millis = self.cpu_millis.saturating_sub(o.cpu_millis);
        self.memory_mb = self.memory_mb.saturating_sub(o.memory_mb);
        self.disk_mb = self.disk_mb.saturating_sub(o.disk_mb);
    }
}

/// A creation or call refused by a quota: which project, which limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct QuotaExceeded {
    pub project: String,
    pub limit: Limit,
    /// The limit's value.
    pub max: u64,
    /// What is held now (held limits).
    pub used: u64,
    /// What the refused request needed (held limits).
    pub asked: u64,
}

impl QuotaExceeded {
    fn describe(&self) -> String {
        if self.limit.is_held() {
            format!(
                "quota exceeded: project {:?} limit {} is {}, {} held, this needs {} more",
                self.project,
                self.limit.name(),
                self.max,
                self.used,
                self.asked
            )
        } else {
            format!("quota exceeded: project {:?} limit {} is {} per second", self.project, self.limit.name(), self.max)
        }
    }
}

/// Held against quotas until committed (with the sandbox's id) or
/// released.
#[must_use = "a reservation must be committed or released"]
#[derive(Debug)]
pub struct Reservation {
    project: String,
    held: Held,
}

struct Entry {
    project: String,
    held: Held,
    since: Instant,
}

#[derive(Default)]
struct State {
    limits: HashMap<String, Quota>,
    /// Per project: what it and every project below it hold.
    held: HashMap<String, Held>,
    buckets: HashMap<(String, Limit), Bucket>,
    sandboxes: HashMap<String, Entry>,
    /// Sandboxes that ended before their creation was committed, and when.
    ended_early: HashMap<String, Instant>,
}

/// How long an early end is remembered (longer than any creation's
/// answer takes to reach its commit).
const EARLY_END_MEMORY: Duration = Duration::from_secs(600);

#[derive(Default)]
pub struct Ledger {
    state: Mutex<State>,
}

impl State {
    fn hold(&mut self, project: &str, h: &Held) {
        for p in self_and_ancestors(project) {
            self.held.entry(p.to_string()).or_default().add(h);
        }
    }

    fn unhold(&mut self, project: &str, h: &Held) {
        for p in self_and_ancestors(project) {
            if let Some(x) = self.held.get_mut(p) {
                x.sub(h);
                if *x == Held::default() {
                    self.held.remove(p);
                }
            }
        }
    }

    /// The first limit of `project` or an ancestor that `extra` (and `n`
    /// tokens of `rate`, if given) would exceed.
    fn check(&mut self, project: &str, extra: &Held, rate: Option<(Limit, u64)>, now: Instant) -> Result<(), QuotaExceeded> {
        for p in self_and_ancestors(project) {
            let Some(q) = self.limits.get(p) else { continue };
            let held = self.held.get(p).copied().unwrap_or_default();
            for l in Limit::ALL.into_iter().filter(|l| l.is_held()) {
                let (Some(max), asked) = (q.get(l), extra.get(l)) else { continue };
                if asked > 0 && held.get(l).saturating_add(asked) > max {
                    return Err(QuotaExceeded { project: p.to_string(), limit: l, max, used: held.get(l), asked });
                }
            }
            if let Some((l, n)) = rate {
                if let Some(max) = q.get(l) {
                    let b = self.buckets.entry((p.to_string(), l)).or_insert_with(|| Bucket::full(max, now));
                    if !b.has(n, max, now) {
                        return Err(QuotaExceeded { project: p.to_string(), limit: l, max, used: 0, asked: n });
                    }
                }
            }
        }
        Ok(())
    }

    fn take_rate(&mut self, project: &str, l: Limit, n: u64) {
        for p in self_and_ancestors(project) {
            if let Some(b) = self.buckets.get_mut(&(p.to_string(), l)) {
                b.take(n);
            }
        }
    }

    fn within_limits(&self, project: &str) -> bool {
        self_and_ancestors(project).all(|p| {
            let held = self.held.get(p).copied().unwrap_or_default();
            self.limits.get(p).is_none_or(|q| Limit::ALL.into_iter().all(|l| q.get(l).is_none_or(|max| !l.is_held() || held.get(l) <= max)))
        })
    }

    fn forget_early_ends(&mut self, now: Instant) {
        if self.ended_early.len() > 1024 {
            self.ended_early.retain(|_, at| now.saturating_duration_since(*at) < EARLY_END_MEMORY);
        }
    }
}

impl Ledger {
    pub fn new(limits: impl IntoIterator<Item = (String, Quota)>) -> Ledger {
        Ledger { state: Mutex::new(State { limits: limits.into_iter().collect(), ..State::default() }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A project's quota changed (`None`: removed, or the project is gone).
    pub fn set_limits(&self, project: &str, quota: Option<Quota>) {
        let mut s = self.lock();
        s.buckets.retain(|(p, _), _| p != project);
        match quota {
            Some(q) => s.limits.insert(project.to_string(), q),
            None => s.limits.remove(project),
        };
    }

    /// Checks `demand` and one creation against `project` and each of its
    /// ancestors, and holds it in all of them at once.
    pub fn reserve(&self, project: &str, demand: Held, now: Instant) -> Result<Reservation, QuotaExceeded> {
        let mut s = self.lock();
        s.check(project, &demand, Some((Limit::CreationsPerS, 1)), now)?;
        s.take_rate(project, Limit::CreationsPerS, 1);
        s.hold(project, &demand);
        // What `check` promised, checked again where it holds (tests run
        // debug builds, the randomized one with many threads).
        debug_assert!(s.within_limits(project), "a reservation took {project} or an ancestor over a limit");
        Ok(Reservation { project: project.to_string(), held: demand })
    }

    /// The creation failed: nothing is held any more.
    pub fn release(&self, r: Reservation) {
        self.lock().unhold(&r.project, &r.held);
    }

    /// The sandbox `id` exists and holds `actual` (its limits as the node
    /// set them). If that is more than reserved and does not fit, the hold
    /// is given back and the error returned: the caller deletes the
    /// sandbox. A second commit of one id (a keyed retry) holds nothing more.
    pub fn commit(&self, r: Reservation, id: &str, actual: Held, now: Instant) -> Result<(), QuotaExceeded> {
        let mut s = self.lock();
        s.unhold(&r.project, &r.held);
        if s.sandboxes.contains_key(id) {
            return Ok(());
        }
        if s.ended_early.remove(id).is_some() {
            return Ok(());
        }
        // Limits lowered meanwhile do not refuse what was reserved; only
        // more than reserved is checked again.
        if Limit::ALL.into_iter().any(|l| actual.get(l) > r.held.get(l)) {
            s.check(&r.project, &actual, None, now)?;
        }
        s.hold(&r.project, &actual);
        s.sandboxes.insert(id.to_string(), Entry { project: r.project, held: actual, since: now });
        Ok(())
    }

    /// The sandbox ended (stopped, failed, deleted): its hold is given back.
    pub fn ended(&self, id: &str, now: Instant) {
        let mut s = self.lock();
        match s.sandboxes.remove(id) {
            Some(e) => s.unhold(&e.project, &e.held),
            None => {
                s.forget_early_ends(now);
                s.ended_early.insert(id.to_string(), now);
            }
        }
    }

    /// Brings the ledger to what the nodes list (`live`: every live
    /// sandbox's id, project and hold, listed starting at `listed_at` from
    /// the nodes in `answered`): sandboxes it does not know are held (they
    /// exist: never refused), and ones of an answering node committed
    /// before the listing that it no longer shows are given back.
    pub fn reconcile(&self, live: &[(String, String, Held)], answered: &HashSet<String>, listed_at: Instant) {
        let mut s = self.lock();
        let ids: HashSet<&str> = live.iter().map(|(id, _, _)| id.as_str()).collect();
        // A sandbox id is `<node>.<random>`.
        let node_answered = |id: &str| id.rsplit_once('.').is_some_and(|(node, _)| answered.contains(node));
        let gone: Vec<String> = s
            .sandboxes
            .iter()
            .filter(|(id, e)| e.since < listed_at && !ids.contains(id.as_str()) && node_answered(id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(e) = s.sandboxes.remove(&id) {
                s.unhold(&e.project, &e.held);
            }
        }
        for (id, project, held) in live {
            if !s.sandboxes.contains_key(id) && !s.ended_early.contains_key(id) {
                s.hold(project, held);
                s.sandboxes.insert(id.clone(), Entry { project: project.clone(), held: *held, since: listed_at });
            }
        }
    }

    /// `n` calls against `limit` (a rate) of `project` and its ancestors:
    /// all of them or none.
    pub fn take_rate(&self, project: &str, limit: Limit, n: u64, now: Instant) -> Result<(), QuotaExceeded> {
        let mut s = self.lock();
        s.check(project, &Held::default(), Some((limit, n)), now)?;
        s.take_rate(project, limit, n);
        Ok(())
    }

    /// What `project` (with everything below it) uses of each limit: held
    /// amounts, and for rates the tokens taken and not yet refilled.
    pub fn usage(&self, project: &str, now: Instant) -> Vec<(Limit, f64)> {
        let mut s = self.lock();
        let held = s.held.get(project).copied().unwrap_or_default();
        let rate = s.limits.get(project).copied().unwrap_or_default();
        Limit::ALL
            .into_iter()
            .map(|l| {
                if l.is_held() {
                    return (l, held.get(l) as f64);
                }
                let used = match (rate.get(l), s.buckets.get_mut(&(project.to_string(), l))) {
                    (Some(max), Some(b)) => b.in_use(max, now),
                    _ => 0.0,
                };
                (l, used)
            })
            .collect()
    }

    /// Whether the per-project totals are exactly the sum of the committed
    /// sandboxes' holds (with no reservation outstanding).
    #[cfg(test)]
    pub fn consistent(&self) -> bool {
        let s = self.lock();
        let mut sums: HashMap<String, Held> = HashMap::new();
        for e in s.sandboxes.values() {
            for p in self_and_ancestors(&e.project) {
                sums.entry(p.to_string()).or_default().add(&e.held);
            }
        }
        sums.retain(|_, h| *h != Held::default());
        sums == s.held
    }

    /// What `project` and everything below it hold.
    pub fn holds(&self, project: &str) -> Held {
        self.lock().held.get(project).copied().unwrap_or_default()
    }
}
