//! Pause and resume on the fake backend (`backends::fake`), whose kernel
//! freezes at once. No root needed.

use crate::backends::fake::{admin, ended_record, request, Call, Plan, Scripted, TestNode};
use crate::error::EdgeError;
use crate::model::State;

#[tokio::test]
async fn a_pause_frees_the_admission_slot_and_a_resume_takes_it_again() {
    let node = TestNode::new(|_| {});
    let edge = node.start().await;
    let rec = edge.create(&admin(), request()).await.unwrap();
    let id = rec.id.clone();
    assert_eq!(edge.stats().used.sandboxes, 1);

    let paused = edge.pause(&admin(), &id).await.unwrap();
    assert!(paused.changed && !paused.suspended, "a container is frozen, not suspended");
    assert_eq!(paused.record.state, State::Paused);
    assert!(paused.record.paused_at_ms.is_some());
    assert_eq!(paused.memory.before_bytes, 48 << 20, "the push-out read the cgroup's memory use");
    assert_eq!(node.fake.fs().read(&id, "cgroup.freeze").as_deref(), Some("1"));
    let used = edge.stats().used;
    assert_eq!((used.sandboxes, used.memory_mb), (0, 0), "a paused sandbox holds no reservation");
    assert_eq!(edge.paused_count(), 1);
    assert!(!edge.pause(&admin(), &id).await.unwrap().changed, "pausing is idempotent");

    let resumed = edge.resume(&admin(), &id).await.unwrap();
    assert!(resumed.changed);
    assert_eq!(resumed.record.state, State::Running);
    assert!(resumed.record.paused_at_ms.is_none());
    assert_eq!(node.fake.fs().read(&id, "cgroup.freeze").as_deref(), Some("0"));
    assert_eq!(node.fake.fs().read(&id, "memory.max"), Some((64u64 << 20).to_string()), "the memory limit is restored");
    assert_eq!(edge.stats().used.sandboxes, 1);
    assert!(!edge.resume(&admin(), &id).await.unwrap().changed);
    assert_eq!(
        node.fake.calls(),
        vec![Call::Start(id.clone()), Call::BeforeFreeze(id.clone()), Call::AfterThaw(id.clone())],
        "the freeze hooks run once each, around the freeze"
    );
    assert_eq!(node.fake.running(), vec![id], "the same process runs on");
}

#[tokio::test]
async fn a_resume_refused_when_the_node_is_full_stays_paused() {
    let node = TestNode::new(|c| c.max_sandboxes = 1);
    let edge = node.start().await;
    let a = edge.create(&admin(), request()).await.unwrap();
    edge.pause(&admin(), &a.id).await.unwrap();
    // A's slot went back: B takes it.
    let b = edge.create(&admin(), request()).await.unwrap();

    let err = edge.resume(&admin(), &a.id).await.unwrap_err();
    assert!(matches!(&err, EdgeError::NoCapacity(_)), "{err}");
    assert_eq!(edge.get(&admin(), &a.id).unwrap().state, State::Paused);
    assert_eq!(node.fake.fs().read(&a.id, "cgroup.freeze").as_deref(), Some("1"), "still frozen");
    assert_eq!(edge.stats().used.sandboxes, 1, "B's reservation only");
    assert!(!node.fake.calls_for(&a.id).contains(&Call::AfterThaw(a.id.clone())));

    edge.stop(&admin(), &b.id, "make room").await.unwrap();
    assert_eq!(edge.resume(&admin(), &a.id).await.unwrap().record.state, State::Running);
    assert_eq!(edge.stats().used.sandboxes, 1);
}

#[tokio::test]
async fn a_pause_whose_freeze_hook_fails_leaves_the_sandbox_running() {
    let node = TestNode::new(|_| {});
    let edge = node.start().await;
    let rec = edge.create(&admin(), request()).await.unwrap();
    node.fake.script(Scripted::BeforeFreeze, Plan::Fail("the vCPUs would not stop".into()));
    let err = edge.pause(&admin(), &rec.id).await.unwrap_err();
    assert!(err.to_string().contains("the vCPUs would not stop"), "{err}");
    assert_eq!(edge.get(&admin(), &rec.id).unwrap().state, State::Running);
    assert_eq!(edge.stats().used.sandboxes, 1, "it keeps its reservation");
    assert_eq!(node.fake.fs().read(&rec.id, "cgroup.freeze"), None, "the cgroup was never asked to freeze");
    // The next pause works.
    assert_eq!(edge.pause(&admin(), &rec.id).await.unwrap().record.state, State::Paused);
}

#[tokio::test]
async fn stopping_a_paused_sandbox_releases_nothing_twice() {
    let node = TestNode::new(|_| {});
    let edge = node.start().await;
    let a = edge.create(&admin(), request()).await.unwrap();
    let b = edge.create(&admin(), request()).await.unwrap();
    edge.pause(&admin(), &a.id).await.unwrap();
    assert_eq!(edge.stats().used.sandboxes, 1);

    let stopped = edge.stop(&admin(), &a.id, "no longer needed").await.unwrap();
    assert_eq!(stopped.state, State::Stopped);
    assert_eq!(ended_record(&edge, &a.id).await.state, State::Stopped);
    assert_eq!(edge.stats().used.sandboxes, 1, "B still holds its reservation: A's was not given back twice");
    assert!(matches!(edge.resume(&admin(), &a.id).await, Err(EdgeError::Ended { .. })));
    assert_eq!(node.fake.running(), vec![b.id]);
}
