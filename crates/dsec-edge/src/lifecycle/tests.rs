//! The lifecycle on the fake backend (`backends::fake`): create, stop,
//! delete, failures, stops during a start, the creation queue, recovery
//! after a restart, the sweeper and the reaper. No root needed.

use std::time::Instant;

use crate::backends::fake::{admin, ended_record, request, within, Call, Gate, Plan, Scripted, TestNode};
use crate::error::EdgeError;
use crate::model::{ListFilter, State};
use crate::spec::SandboxRequest;

#[tokio::test]
async fn a_sandbox_runs_and_a_stop_settles_it_stopped() {
    let node = TestNode::new(|_| {});
    let edge = node.start().await;
    let rec = edge.create(&admin(), request()).await.unwrap();
    assert_eq!(rec.state, State::Running);
    assert!(rec.pid.is_some() && rec.create_ms.is_some());
    assert_eq!(node.fake.running(), vec![rec.id.clone()]);
    // The real driver wrote the sandbox's limits into its cgroup.
    assert_eq!(node.fake.fs().read(&rec.id, "memory.max"), Some((64u64 << 20).to_string()));
    assert_eq!(node.fake.fs().read(&rec.id, "cpu.max").as_deref(), Some("25000 100000"));
    let used = edge.stats().used;
    assert_eq!((used.sandboxes, used.memory_mb), (1, 64));

    let stopped = edge.stop(&admin(), &rec.id, "done with it").await.unwrap();
    assert_eq!(stopped.state, State::Stopped);
    assert_eq!(stopped.reason.as_deref(), Some("done with it"));
    assert!(stopped.pid.is_none() && stopped.stopped_at_ms.is_some());
    assert_eq!(edge.stats().used.sandboxes, 0);
    assert!(node.fake.running().is_empty());
    assert!(!node.fake.fs().dir(&rec.id).exists(), "the exit watcher's cleanup removes the cgroup");
    assert_eq!(node.fake.calls(), vec![Call::Start(rec.id.clone()), Call::Cleanup(rec.id.clone())]);
    // Stopping again changes nothing.
    assert_eq!(edge.stop(&admin(), &rec.id, "again").await.unwrap().reason.as_deref(), Some("done with it"));
    assert_eq!(node.fake.calls().len(), 2);
}

#[tokio::test]
async fn delete_stops_and_forgets_a_running_sandbox() {
    let node = TestNode::new(|_| {});
    let edge = node.start().await;
    let rec = edge.create(&admin(), request()).await.unwrap();
    edge.delete(&admin(), &rec.id).await.unwrap();
    assert!(matches!(edge.get(&admin(), &rec.id), Err(EdgeError::SandboxNotFound(_))));
    assert!(edge.list(&admin(), &ListFilter::default()).is_empty());
    assert_eq!(edge.stats().used.sandboxes, 0);
    assert!(node.fake.running().is_empty());
    assert_eq!(node.fake.calls(), vec![Call::Start(rec.id.clone()), Call::Cleanup(rec.id)]);
}

#[tokio::test]
async fn a_failed_start_is_undone_and_settled_failed_with_its_reason() {
    let node = TestNode::new(|_| {});
    let edge = node.start().await;
    node.fake.script(Scripted::Start, Plan::Fail("the image has no /bin/sh".into()));
    let err = edge.create(&admin(), request()).await.unwrap_err();
    assert!(matches!(&err, EdgeError::SetupFailed(m) if m == "the image has no /bin/sh"), "{err}");
    let recs = edge.list(&admin(), &ListFilter::default());
    assert_eq!(recs.len(), 1, "the failed record stays listable");
    let rec = &recs[0];
    assert_eq!(rec.state, State::Failed);
    assert_eq!(rec.reason.as_deref(), Some("creation failed: sandbox setup failed: the image has no /bin/sh"));
    assert!(rec.pid.is_none());
    assert_eq!(edge.stats().used.sandboxes, 0, "admission released");
    assert!(node.fake.running().is_empty() && node.cgroups.list().is_empty(), "the start undid itself");
    assert_eq!(node.fake.calls(), vec![Call::Start(rec.id.clone())]);
    // The node is not worse for it.
    assert_eq!(edge.create(&admin(), request()).await.unwrap().state, State::Running);
}

#[tokio::test]
async fn a_sandbox_whose_process_dies_fails_with_how_it_ended() {
    let node = TestNode::new(|_| {});
    let edge = node.start().await;
    let rec = edge.create(&admin(), request()).await.unwrap();
    node.fake.crash(&rec.id);
    let ended = ended_record(&edge, &rec.id).await;
    assert_eq!(ended.state, State::Failed);
    let reason = ended.reason.unwrap_or_default();
    assert!(reason.contains("exited unexpectedly (status 9)"), "{reason}");
    assert_eq!(edge.stats().used.sandboxes, 0);
    assert_eq!(node.fake.calls_for(&rec.id), vec![Call::Start(rec.id.clone()), Call::Cleanup(rec.id.clone())]);
    assert!(node.cgroups.list().is_empty());
}

#[tokio::test]
async fn admission_refuses_beyond_capacity_before_any_start() {
    let node = TestNode::new(|c| c.max_sandboxes = 1);
    let edge = node.start().await;
    let first = edge.create(&admin(), request()).await.unwrap();
    let err = edge.create(&admin(), request()).await.unwrap_err();
    assert!(matches!(&err, EdgeError::NoCapacity(m) if m.contains("maximum of 1")), "{err}");
    assert_eq!(node.fake.calls(), vec![Call::Start(first.id.clone())], "a refused creation reaches no backend");
    assert_eq!(edge.list(&admin(), &ListFilter::default()).len(), 1, "and leaves no record");
    edge.stop(&admin(), &first.id, "make room").await.unwrap();
    assert_eq!(edge.create(&admin(), request()).await.unwrap().state, State::Running);
}

/// Starts a creation whose backend start stops at a gate, and waits until
/// it has; returns the gate, the creation and the sandbox's id.
async fn creation_at_gate(
    node: &TestNode,
    edge: &crate::Edge,
) -> (Gate, tokio::task::JoinHandle<Result<crate::SandboxRecord, EdgeError>>, String) {
    let gate = Gate::new();
    node.fake.script(Scripted::Start, Plan::Wait(gate.clone()));
    let (e, before) = (edge.clone(), node.fake.calls().len());
    let creation = tokio::spawn(async move { e.create(&admin(), request()).await });
    gate.reached().await;
    let id = node.fake.calls()[before].id().to_string();
    assert_eq!(edge.get(&admin(), &id).unwrap().state, State::Creating);
    (gate, creation, id)
}

#[tokio::test]
async fn a_stop_during_a_slow_start_cuts_it_short() {
    let node = TestNode::new(|_| {});
    node.fake.set_abortable(true);
    let edge = node.start().await;
    let (_gate, creation, id) = creation_at_gate(&node, &edge).await;
    assert_eq!(edge.stats().used.sandboxes, 1);

    // The gate stays shut: only abort_start can end this start.
    let stopped = edge.stop(&admin(), &id, "user gave up").await.unwrap();
    assert_eq!(stopped.state, State::Stopped);
    assert_eq!(stopped.reason.as_deref(), Some("user gave up"));
    match creation.await.unwrap() {
        Err(EdgeError::StoppedWhileCreating { id: got, reason }) => {
            assert_eq!((got.as_str(), reason.as_str()), (id.as_str(), "user gave up"))
        }
        other => panic!("expected StoppedWhileCreating, got {other:?}"),
    }
    let calls = node.fake.calls();
    assert_eq!(calls[..2], [Call::Start(id.clone()), Call::AbortStart(id.clone())]);
    assert!(calls[2..].iter().all(|c| *c == Call::AbortStart(id.clone())), "nothing but more cuts follows: {calls:?}");
    assert_eq!(edge.stats().used.sandboxes, 0);
    assert!(node.fake.running().is_empty() && node.cgroups.list().is_empty());
}

#[tokio::test]
async fn a_stop_during_a_start_that_cannot_be_cut_waits_for_it() {
    let node = TestNode::new(|_| {});
    let edge = node.start().await;
    let (gate, creation, id) = creation_at_gate(&node, &edge).await;
    let (e, sid) = (edge.clone(), id.clone());
    let stop = tokio::spawn(async move { e.stop(&admin(), &sid, "user gave up").await });
    node.fake.called(Call::AbortStart(id.clone())).await;
    // The backend declined: the stop waits for the creation's lock.
    tokio::task::yield_now().await;
    assert!(!stop.is_finished());
    assert_eq!(edge.get(&admin(), &id).unwrap().state, State::Creating);

    gate.open();
    let rec = within("the creation", creation).await.unwrap().unwrap();
    assert_eq!(rec.state, State::Running, "the creation ends as it would have");
    let stopped = within("the stop", stop).await.unwrap().unwrap();
    assert_eq!(stopped.state, State::Stopped);
    assert_eq!(stopped.reason.as_deref(), Some("user gave up"));
    assert_eq!(node.fake.calls(), vec![Call::Start(id.clone()), Call::AbortStart(id.clone()), Call::Cleanup(id)]);
    assert_eq!(edge.stats().used.sandboxes, 0);
}

#[tokio::test]
async fn a_stop_of_a_queued_creation_settles_it_without_a_start() {
    let node = TestNode::new(|c| c.max_creating = 1);
    let edge = node.start().await;
    let (gate, first, first_id) = creation_at_gate(&node, &edge).await;
    let e = edge.clone();
    let second = tokio::spawn(async move { e.create(&admin(), SandboxRequest { job: Some("j".into()), ..request() }).await });
    let queued = within("the second creation queueing", async {
        loop {
            if let Some(r) = edge.list(&admin(), &ListFilter::default()).into_iter().find(|r| r.state == State::Queued) {
                return r;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(queued.queue_position, Some(0));
    assert_eq!(edge.stats().queued, 1);
    let stopped = edge.stop(&admin(), &queued.id, "not needed").await.unwrap();
    assert_eq!(stopped.state, State::Stopped);
    assert!(matches!(second.await.unwrap(), Err(EdgeError::StoppedWhileCreating { .. })));
    assert_eq!(edge.stats().used.sandboxes, 1, "only the first holds a reservation");

    gate.open();
    assert_eq!(first.await.unwrap().unwrap().state, State::Running);
    assert_eq!(node.fake.calls(), vec![Call::Start(first_id)], "the queued one never reached the backend");
    assert_eq!(edge.stats().queued, 0);
}

/// Runs `f` on a runtime of its own and ends the runtime with everything on
/// it: one edge process's life, as far as the node can tell.
fn edge_process<T>(f: impl std::future::Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(f)
}

#[test]
fn a_restarted_edge_readopts_running_sandboxes_and_settles_gone_ones() {
    let node = TestNode::new(|_| {});
    let (alive, gone, stopped, calls_before) = edge_process(async {
        let edge = node.start().await;
        let alive = edge.create(&admin(), request()).await.unwrap();
        let gone = edge.create(&admin(), request()).await.unwrap();
        let stopped = edge.create(&admin(), request()).await.unwrap();
        edge.stop(&admin(), &stopped.id, "finished").await.unwrap();
        edge.inner.store.sync().await.unwrap();
        (alive, gone, stopped, node.fake.calls().len())
    });
    // While no edge runs, one sandbox's process dies.
    node.fake.crash(&gone.id);

    edge_process(async {
        let edge = node.start().await;
        let a = edge.get(&admin(), &alive.id).unwrap();
        assert_eq!((a.state, a.pid), (State::Running, alive.pid), "re-adopted");
        let g = edge.get(&admin(), &gone.id).unwrap();
        assert_eq!(g.state, State::Failed);
        let reason = g.reason.unwrap_or_default();
        assert!(reason.starts_with("the edge restarted and could not re-adopt the sandbox: "), "{reason}");
        assert!(reason.contains("no longer the agent"), "{reason}");
        let s = edge.get(&admin(), &stopped.id).unwrap();
        assert_eq!((s.state, s.reason.as_deref()), (State::Stopped, Some("finished")), "terminal records come back as they were");
        assert_eq!(edge.stats().used.sandboxes, 1, "only the re-adopted one is admitted");
        assert_eq!(node.fake.running(), vec![alive.id.clone()]);
        assert_eq!(node.cgroups.list(), vec![alive.id.clone()], "the gone one's cgroup was removed");
        let after_restart: Vec<Call> = node.fake.calls().into_iter().skip(calls_before).collect();
        assert!(after_restart.contains(&Call::Adopt(alive.id.clone(), alive.pid.unwrap())));
        assert!(after_restart.contains(&Call::Adopt(gone.id.clone(), gone.pid.unwrap())));
        assert!(after_restart.contains(&Call::Cleanup(gone.id.clone())));
        assert!(!after_restart.iter().any(|c| c.id() == stopped.id), "a stopped sandbox is left alone");

        // The re-adopted sandbox is watched again: a stop ends it as usual.
        let rec = edge.stop(&admin(), &alive.id, "bye").await.unwrap();
        assert_eq!(rec.state, State::Stopped);
        assert_eq!(node.fake.calls().last(), Some(&Call::Cleanup(alive.id.clone())));
        assert_eq!(edge.stats().used.sandboxes, 0);
    });
}

#[test]
fn an_adopt_that_fails_abandons_the_sandbox() {
    let node = TestNode::new(|_| {});
    let rec = edge_process(async {
        let edge = node.start().await;
        let rec = edge.create(&admin(), request()).await.unwrap();
        edge.inner.store.sync().await.unwrap();
        rec
    });
    node.fake.script(Scripted::Adopt, Plan::Fail("the agent answered nonsense".into()));
    edge_process(async {
        let edge = node.start().await;
        let r = edge.get(&admin(), &rec.id).unwrap();
        assert_eq!(r.state, State::Failed);
        let reason = r.reason.unwrap_or_default();
        assert!(reason.contains("the agent answered nonsense"), "{reason}");
        assert!(node.fake.running().is_empty(), "its process was removed");
        assert!(node.cgroups.list().is_empty());
        assert_eq!(edge.stats().used.sandboxes, 0);
        assert_eq!(node.fake.calls_for(&rec.id)[1..], [Call::Adopt(rec.id.clone(), rec.pid.unwrap()), Call::Cleanup(rec.id.clone())]);
    });
}

/// A node whose sweeper runs every 10 ms.
fn swept_node() -> TestNode {
    TestNode::new(|c| c.sweep_interval = std::time::Duration::from_millis(10))
}

#[tokio::test]
async fn the_sweeper_stops_sandboxes_past_their_lifetime_paused_or_not() {
    let node = swept_node();
    let edge = node.start().await;
    let t0 = Instant::now();
    let short = SandboxRequest { max_lifetime_s: Some(1), ..request() };
    let running = edge.create(&admin(), short.clone()).await.unwrap();
    let paused = edge.create(&admin(), short).await.unwrap();
    let kept = edge.create(&admin(), request()).await.unwrap();
    edge.pause(&admin(), &paused.id).await.unwrap();
    // Activity does not extend a hard lifetime.
    let _busy = edge.entry(&admin(), &running.id).unwrap().begin();
    for id in [&running.id, &paused.id] {
        let rec = ended_record(&edge, id).await;
        assert_eq!(rec.state, State::Stopped);
        assert_eq!(rec.reason.as_deref(), Some("maximum lifetime of 1 s reached"));
    }
    assert!(t0.elapsed() >= std::time::Duration::from_secs(1));
    assert_eq!(edge.get(&admin(), &kept.id).unwrap().state, State::Running);
    assert_eq!(edge.stats().used.sandboxes, 1);
    assert_eq!(node.fake.running(), vec![kept.id.clone()]);
}

#[tokio::test]
async fn the_sweeper_stops_idle_sandboxes_and_spares_busy_ones() {
    let node = swept_node();
    let edge = node.start().await;
    let t0 = Instant::now();
    let short = SandboxRequest { idle_ttl_s: Some(1), ..request() };
    let idle = edge.create(&admin(), short.clone()).await.unwrap();
    let busy = edge.create(&admin(), short).await.unwrap();
    let guard = edge.entry(&admin(), &busy.id).unwrap().begin();
    let rec = ended_record(&edge, &idle.id).await;
    assert_eq!(rec.state, State::Stopped);
    assert_eq!(rec.reason.as_deref(), Some("idle for 1 s (ttl_running_stop)"));
    assert!(t0.elapsed() >= std::time::Duration::from_secs(1));
    assert_eq!(edge.get(&admin(), &busy.id).unwrap().state, State::Running, "a request in flight is activity");
    assert_eq!(node.fake.calls_for(&busy.id), vec![Call::Start(busy.id.clone())]);
    drop(guard);
}

#[tokio::test]
async fn the_sweeper_records_a_backend_condition_once() {
    let node = swept_node();
    let edge = node.start().await;
    let rec = edge.create(&admin(), request()).await.unwrap();
    let mut events = edge.subscribe();
    node.fake.set_condition(&rec.id, "the disk's write limit is reached");
    let noted = within("the condition", async {
        loop {
            let ev = events.recv().await.unwrap();
            if ev.id == rec.id {
                return ev;
            }
        }
    })
    .await;
    assert_eq!((noted.state, noted.reason.as_deref()), (State::Running, Some("the disk's write limit is reached")));
    let now = edge.get(&admin(), &rec.id).unwrap();
    assert_eq!((now.state, now.reason.as_deref()), (State::Running, Some("the disk's write limit is reached")));
}

#[tokio::test]
async fn the_reaper_removes_cgroups_of_no_live_sandbox() {
    let node = TestNode::new(|_| {});
    // Left by an edge that crashed: at start, the reaper removes it.
    std::fs::create_dir(node.fake.fs().dir("n1.left-at-start")).unwrap();
    let edge = node.start().await;
    assert_eq!(node.fake.calls(), vec![Call::Cleanup("n1.left-at-start".into())]);
    let live = edge.create(&admin(), request()).await.unwrap();
    std::fs::create_dir(node.fake.fs().dir("n1.stray")).unwrap();
    let report = edge.reap_once().await;
    assert_eq!(report.cgroups, 1);
    assert_eq!(node.cgroups.list(), vec![live.id.clone()], "a live sandbox's cgroup stays");
    assert_eq!(node.fake.calls().last(), Some(&Call::Cleanup("n1.stray".into())));
    assert_eq!(edge.get(&admin(), &live.id).unwrap().state, State::Running);
}

#[test]
fn a_restarted_edge_with_less_room_abandons_what_it_cannot_admit() {
    let node = TestNode::new(|_| {});
    let ids: Vec<String> = edge_process(async {
        let edge = node.start().await;
        let a = edge.create(&admin(), request()).await.unwrap();
        let b = edge.create(&admin(), request()).await.unwrap();
        edge.inner.store.sync().await.unwrap();
        vec![a.id, b.id]
    });
    let smaller = TestNode { config: crate::EdgeConfig { max_sandboxes: 1, ..node.config.clone() }, ..node };
    edge_process(async {
        let edge = smaller.start().await;
        let recs: Vec<_> = ids.iter().map(|id| edge.get(&admin(), id).unwrap()).collect();
        let (running, failed): (Vec<_>, Vec<_>) = recs.into_iter().partition(|r| r.state == State::Running);
        assert_eq!((running.len(), failed.len()), (1, 1), "one re-admitted, one abandoned");
        assert_eq!(failed[0].state, State::Failed);
        assert!(failed[0].reason.as_deref().unwrap_or_default().ends_with("no capacity left to re-admit it"), "{:?}", failed[0].reason);
        assert_eq!(smaller.fake.running(), vec![running[0].id.clone()], "the abandoned one's process was removed");
        assert_eq!(edge.stats().used.sandboxes, 1);
    });
}

#[tokio::test]
async fn the_sweeper_forgets_ended_sandboxes_past_their_retention() {
    let node = TestNode::new(|c| {
        c.sweep_interval = std::time::Duration::from_millis(10);
        c.retention = std::time::Duration::from_millis(1);
    });
    let edge = node.start().await;
    let rec = edge.create(&admin(), request()).await.unwrap();
    edge.stop(&admin(), &rec.id, "done").await.unwrap();
    within("the record being forgotten", async {
        while edge.get(&admin(), &rec.id).is_ok() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    edge.inner.store.sync().await.unwrap();
    let (_store, saved) = crate::store::Store::open(&node.config.state_dir.join("edge.db")).unwrap();
    assert!(saved.iter().all(|r| r.id != rec.id), "and deleted from the database");
}

#[tokio::test]
async fn a_shutdown_stops_every_sandbox_when_asked_and_removes_its_lock_file() {
    let node = TestNode::new(|c| c.stop_sandboxes_on_shutdown = true);
    let edge = node.start().await;
    let lock_file = crate::lifecycle::node_lock::path(&node.dir.path().join("locks"), "n1");
    assert!(lock_file.exists());
    let a = edge.create(&admin(), request()).await.unwrap();
    let b = edge.create(&admin(), request()).await.unwrap();
    edge.shutdown().await;
    for id in [&a.id, &b.id] {
        let r = edge.get(&admin(), id).unwrap();
        assert_eq!((r.state, r.reason.as_deref()), (State::Stopped, Some("edge shut down")));
    }
    assert!(node.fake.running().is_empty());
    assert_eq!(edge.stats().used.sandboxes, 0);
    assert!(!lock_file.exists(), "the node lock's own file is removed, wherever it is");
}
