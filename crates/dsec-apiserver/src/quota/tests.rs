//! The ledger's arithmetic, and a randomized run of random project trees
//! with concurrent creations, deletions and quota changes.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dsec_store::{Limit, Quota};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Held, Ledger};

fn sandboxes(n: u64) -> Quota {
    Quota { sandboxes: Some(n), ..Quota::default() }
}

fn one() -> Held {
    Held::sandbox(1.0, 512, 1024)
}

#[test]
fn a_creation_is_checked_against_its_project_and_every_ancestor() {
    let now = Instant::now();
    let l =
        Ledger::new([("team".to_string(), sandboxes(3)), ("team/a/x".to_string(), Quota { cpu_millis: Some(1500), ..Quota::default() })]);
    let r1 = l.reserve("team/a/x", one(), now).unwrap();
    l.commit(r1, "n.1", one(), now).unwrap();
    let e = l.reserve("team/a/x", one(), now).unwrap_err();
    assert_eq!((e.project.as_str(), e.limit, e.max, e.used, e.asked), ("team/a/x", Limit::CpuMillis, 1500, 1000, 1000));
    assert!(e.to_string().contains("\"team/a/x\"") && e.to_string().contains("cpu"), "{e}");
    let r2 = l.reserve("team/b", one(), now).unwrap();
    let r3 = l.reserve("team", one(), now).unwrap();
    let e = l.reserve("team/b", one(), now).unwrap_err();
    assert_eq!((e.project.as_str(), e.limit), ("team", Limit::Sandboxes));
    assert_eq!(l.holds("team").sandboxes, 3);
    assert_eq!(l.holds("team/a").sandboxes, 1, "an intermediate project without a quota still counts");
    l.release(r2);
    l.commit(r3, "n.3", one(), now).unwrap();
    l.ended("n.1", now);
    l.ended("n.1", now);
    assert_eq!(l.holds("team").sandboxes, 1, "ending twice gives back once");
    assert!(l.consistent());
    l.ended("n.3", now);
    assert_eq!(l.holds("team"), Held::default());
}

#[test]
fn a_commit_bigger_than_reserved_is_checked_again_and_a_retry_holds_once() {
    let now = Instant::now();
    let l = Ledger::new([("p".to_string(), Quota { disk_mb: Some(4000), ..Quota::default() })]);
    let r = l.reserve("p", one(), now).unwrap();
    l.commit(r, "n.1", Held::sandbox(1.0, 512, 2048), now).unwrap();
    let r = l.reserve("p", one(), now).unwrap();
    let e = l.commit(r, "n.2", Held::sandbox(1.0, 512, 2048), now).unwrap_err();
    assert_eq!(e.limit, Limit::DiskMb);
    assert_eq!(l.holds("p").disk_mb, 2048, "the refused one holds nothing");
    // An idempotent retry answers the same sandbox: it holds once.
    let r = l.reserve("p", Held::sandbox(0.5, 1, 1), now).unwrap();
    l.commit(r, "n.1", Held::sandbox(1.0, 512, 2048), now).unwrap();
    assert_eq!(l.holds("p").sandboxes, 1);
    assert!(l.consistent());
}

#[test]
fn an_end_seen_before_the_commit_is_not_held() {
    let now = Instant::now();
    let l = Ledger::new([]);
    let r = l.reserve("p", one(), now).unwrap();
    l.ended("n.1", now);
    l.commit(r, "n.1", one(), now).unwrap();
    assert_eq!(l.holds("p"), Held::default());
}

#[test]
fn creations_per_second_is_a_token_bucket_up_the_tree() {
    let t0 = Instant::now();
    let l = Ledger::new([("p".to_string(), Quota { creations_per_s: Some(2), ..Quota::default() })]);
    let a = l.reserve("p/c", Held::default(), t0).unwrap();
    let b = l.reserve("p/d", Held::default(), t0).unwrap();
    let e = l.reserve("p/c", Held::default(), t0).unwrap_err();
    assert_eq!((e.project.as_str(), e.limit), ("p", Limit::CreationsPerS));
    assert!(e.to_string().contains("creations_per_s is 2 per second"), "{e}");
    l.release(a);
    l.release(b);
    assert!(l.reserve("p", Held::default(), t0).is_err(), "a released creation does not give back its token");
    l.release(l.reserve("p", Held::default(), t0 + Duration::from_millis(600)).unwrap());
    let usage = l.usage("p", t0 + Duration::from_millis(600));
    assert!(usage.iter().any(|(lim, used)| *lim == Limit::CreationsPerS && (*used - 1.8).abs() < 0.01), "{usage:?}");
    l.take_rate("q", Limit::FncallPerS, 5, t0).unwrap();
    l.set_limits("q/r", Some(Quota { fncall_per_s: Some(4), ..Quota::default() }));
    assert!(l.take_rate("q/r", Limit::FncallPerS, 5, t0).is_err(), "more than a second's worth at once");
    l.take_rate("q/r", Limit::FncallPerS, 4, t0).unwrap();
    assert_eq!(l.take_rate("q/r", Limit::FncallPerS, 1, t0).unwrap_err().project, "q/r");
}

#[test]
fn reconcile_holds_what_the_nodes_list_and_gives_back_what_they_do_not() {
    let t0 = Instant::now();
    let l = Ledger::new([]);
    let r = l.reserve("p", one(), t0).unwrap();
    l.commit(r, "n.1", one(), t0).unwrap();
    let later = t0 + Duration::from_secs(1);
    let r = l.reserve("p", one(), t0).unwrap();
    l.commit(r, "m.1", one(), t0).unwrap();
    let answered: HashSet<String> = ["n".to_string()].into();
    l.reconcile(&[("n.2".to_string(), "p/c".to_string(), one())], &answered, later);
    assert_eq!(l.holds("p").sandboxes, 2, "n.1 is gone, n.2 found, m.1 kept (node m did not answer)");
    l.ended("m.1", later);
    assert_eq!(l.holds("p/c").sandboxes, 1);
    // One committed after the listing began is kept.
    let r = l.reserve("p", one(), later + Duration::from_secs(1)).unwrap();
    l.commit(r, "n.3", one(), later + Duration::from_secs(1)).unwrap();
    l.reconcile(&[("n.2".to_string(), "p/c".to_string(), one())], &answered, later);
    assert_eq!(l.holds("p").sandboxes, 2);
    assert!(l.consistent());
}

/// A random tree of up to `n` projects, at most 8 deep.
fn random_tree(rng: &mut StdRng, n: usize) -> Vec<String> {
    let mut projects = vec!["root".to_string()];
    while projects.len() < n {
        let parent = projects[rng.random_range(0..projects.len())].clone();
        if parent.split('/').count() >= 8 {
            continue;
        }
        projects.push(format!("{parent}/p{}", projects.len()));
    }
    projects
}

fn random_quota(rng: &mut StdRng) -> Option<Quota> {
    if rng.random_bool(0.3) {
        return None;
    }
    Some(Quota {
        sandboxes: Some(rng.random_range(1..12)),
        cpu_millis: rng.random_bool(0.5).then(|| rng.random_range(500..8000)),
        memory_mb: rng.random_bool(0.5).then(|| rng.random_range(256..8192)),
        disk_mb: rng.random_bool(0.3).then(|| rng.random_range(1024..16384)),
        creations_per_s: rng.random_bool(0.2).then(|| rng.random_range(50..500)),
        ..Quota::default()
    })
}

/// Many seeds: random trees and quotas; four threads create (reserve, then
/// commit or fail), end sandboxes and change quotas at random for a bounded
/// time. Every grant is checked against the limits under the ledger's lock
/// (the `debug_assert` in `reserve`); at the end the totals are exactly
/// the committed sandboxes', and nothing is held once all have ended.
#[test]
fn random_trees_under_concurrent_creations_deletions_and_quota_changes_never_exceed_a_limit() {
    for seed in 0..24u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let size = rng.random_range(2..30);
        let projects = Arc::new(random_tree(&mut rng, size));
        let ledger = Arc::new(Ledger::new(projects.iter().filter_map(|p| random_quota(&mut rng).map(|q| (p.clone(), q)))));
        let ids = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_millis(150);
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (projects, ledger, ids) = (projects.clone(), ledger.clone(), ids.clone());
                std::thread::spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed * 100 + t);
                    let mut mine: Vec<String> = Vec::new();
                    let mut ops = 0u64;
                    // Bounded in both time and count, so a slow host only
                    // makes fewer operations.
                    while Instant::now() < deadline && ops < 20_000 {
                        ops += 1;
                        let project = &projects[rng.random_range(0..projects.len())];
                        match rng.random_range(0..10) {
                            0..=4 => {
                                let demand = Held::sandbox(rng.random_range(1..4) as f64 * 0.5, rng.random_range(1..4) * 256, 1024);
                                if let Ok(r) = ledger.reserve(project, demand, Instant::now()) {
                                    if rng.random_bool(0.15) {
                                        ledger.release(r);
                                    } else {
                                        let id = format!("n.{}", ids.fetch_add(1, Ordering::Relaxed));
                                        if ledger.commit(r, &id, demand, Instant::now()).is_ok() {
                                            mine.push(id);
                                        }
                                    }
                                }
                            }
                            5..=7 if !mine.is_empty() => {
                                let id = mine.swap_remove(rng.random_range(0..mine.len()));
                                ledger.ended(&id, Instant::now());
                            }
                            8 => ledger.set_limits(project, random_quota(&mut rng)),
                            _ => {
                                let _ = ledger.take_rate(project, Limit::FncallPerS, rng.random_range(1..4), Instant::now());
                            }
                        }
                    }
                    mine
                })
            })
            .collect();
        let left: Vec<String> = threads.into_iter().flat_map(|t| t.join().expect("a worker panicked: a limit was exceeded")).collect();
        assert!(ledger.consistent(), "seed {seed}: totals drifted from the sandboxes held");
        assert_eq!(ledger.holds("root").sandboxes, left.len() as u64, "seed {seed}");
        for id in &left {
            ledger.ended(id, Instant::now());
        }
        assert_eq!(ledger.holds("root"), Held::default(), "seed {seed}: something is still held");
    }
}
