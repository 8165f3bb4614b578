//! The edge's restart guarantees, with the real `dsec up`: sandboxes keep
//! running while the platform is down (killed or stopped gracefully), and
//! the next `dsec up` on the same data dir re-adopts them with their state;
//! a sandbox whose agent died meanwhile is marked failed and cleaned up.
//! Needs root. Every test ends by stopping the platform and checking that
//! no cgroup, agent or mount of its node is left.

mod common;

use std::time::{Duration, Instant};

use common::*;
use dsec_api::SandboxState;

/// What a sandbox should still have after a restart: a file in its writable
/// layer and a process it started.
fn prepare(api: &Api, id: &str) {
    api.out(id, "echo persisted > /root/state.txt && mkdir -p /work && echo x > /work/y");
    api.out(id, "sleep 1000 >/dev/null 2>&1 &");
}

fn still_intact(api: &Api, id: &str) {
    let sb = api.call(api.client.get(id)).expect("get after restart");
    assert_eq!(sb.state, SandboxState::Running, "{sb:?}");
    assert_eq!(api.out(id, "cat /root/state.txt /work/y"), "persisted\nx\n");
    let ps = api.out(id, "ps -o pid,args");
    assert!(ps.contains("sleep 1000"), "the sandbox's process did not survive the restart:\n{ps}");
    let (code, out, err) = api.sh(id, "echo out; echo err >&2; exit 4");
    assert_eq!((code, out.as_str(), err.as_str()), (4, "out\n", "err\n"));
}

/// Kill `dsec up` with `signal`, start it again (without
/// --stop-sandboxes-on-exit), and check the sandbox is re-adopted whole.
/// Returns the platform running again, and the sandbox's id.
fn survive(signal: i32) -> (Platform, String) {
    let mut p = Platform::start(false);
    let api = Api::new(&p);
    let sb = api.create_busybox(&[("test", "restart")]);
    prepare(&api, &sb.id);
    let agent = p.agent_pid(&sb.id).expect("the sandbox's agent");
    let (_, _, agent_start) = proc_stat(agent).unwrap();
    let mut layer_mounts = mounts_under(p.dir.path());
    layer_mounts.sort();
    assert!(!layer_mounts.is_empty(), "busybox's layer is mounted on the host");
    drop(api);

    let status = p.signal_and_wait(signal);
    if signal == libc::SIGTERM {
        assert!(status.success(), "graceful exit: {status}\n{}", p.log());
        assert!(p.log().contains("dsec is shutting down"));
        // A graceful exit unmounts the node's layers even though sandboxes
        // keep running on them (their overlays hold their own references).
        // The node's writable-layer filesystem stays: the restarted edge
        // makes the next sandboxes' layers on the same mount (a second
        // loop device of its image would be a second copy of a mounted
        // btrfs).
        let left: Vec<_> = mounts_under(p.dir.path()).into_iter().filter(|m| !m.ends_with("/writable")).collect();
        assert!(left.is_empty(), "mounts after a graceful exit: {left:?}");
    }
    // The platform is down; the sandbox is not.
    assert!(alive(agent, agent_start), "the agent died with dsec up");
    assert_eq!(p.agent_pid(&sb.id), Some(agent));

    let token = p.token.clone();
    p.up(false);
    assert!(p.log().contains("re-adopted sandbox"), "{}", p.log());
    assert_eq!(p.token, token, "the admin token changed across a restart");
    let ps = p.dsec(&["ps"]);
    assert!(ps.ok().lines().any(|l| l.starts_with(sb.id.as_str()) && l.contains(" running ")), "{ps:?}");
    let api = Api::new(&p);
    still_intact(&api, &sb.id);
    assert_eq!(p.agent_pid(&sb.id), Some(agent), "re-adoption must not replace the agent");
    let listed = api.call(api.client.list(&[("label", "test=restart")])).unwrap();
    assert_eq!(listed.sandboxes.len(), 1);
    assert_eq!(listed.sandboxes[0].id, sb.id);

    // The node still creates sandboxes.
    let fresh = api.create_busybox(&[]);
    assert_eq!(api.out(&fresh.id, "echo fresh"), "fresh\n");
    // The layer is mounted once again, not stacked on a leftover mount.
    let mut now = mounts_under(p.dir.path());
    now.sort();
    assert_eq!(now, layer_mounts, "layer mounts after the restart");
    (p, sb.id)
}

#[test]
fn sandboxes_survive_sigkill_of_dsec() {
    let (mut p, id) = survive(libc::SIGKILL);
    // Once more: an agent re-adopted once can be re-adopted again.
    p.signal_and_wait(libc::SIGKILL);
    p.up(true);
    let api = Api::new(&p);
    still_intact(&api, &id);
    // This platform runs with --stop-sandboxes-on-exit: SIGTERM stops the
    // re-adopted sandboxes alike.
    assert_eq!(api.call(api.client.list(&[("state", "running")])).unwrap().sandboxes.len(), 2);
    assert!(p.agent_pid(&id).is_some());
    drop(api);
    p.finish();
}

#[test]
fn sandboxes_survive_graceful_stop_of_dsec() {
    let (p, id) = survive(libc::SIGTERM);
    // Without --stop-sandboxes-on-exit: remove them through the API, the
    // re-adopted one (not a child of this dsec) included.
    let api = Api::new(&p);
    let stopped = api.call(api.client.stop(&id)).unwrap();
    assert_eq!(stopped.state, SandboxState::Stopped, "{stopped:?}");
    assert!(p.cgroup_dirs_of(&id).is_empty(), "stopping a re-adopted sandbox left {:?}", p.cgroup_dirs_of(&id));
    for sb in api.call(api.client.list(&[])).unwrap().sandboxes {
        api.call(api.client.delete(&sb.id)).unwrap();
    }
    assert!(api.call(api.client.list(&[])).unwrap().sandboxes.is_empty());
    drop(api);
    p.finish();
}

#[test]
fn a_sandbox_whose_agent_died_while_dsec_was_down_fails() {
    let mut p = Platform::start(false);
    let api = Api::new(&p);
    let victim = api.create_busybox(&[("role", "victim")]).id;
    let survivor = api.create_busybox(&[("role", "survivor")]).id;
    prepare(&api, &survivor);
    api.out(&victim, "sleep 1000 >/dev/null 2>&1 &");
    drop(api);
    let agent = p.agent_pid(&victim).expect("the victim's agent");

    p.signal_and_wait(libc::SIGKILL);
    // With no edge running, the agent dies (an OOM kill, a crash...).
    // SAFETY: kill(2) of the guest agent of a sandbox this test created.
    unsafe { libc::kill(agent, libc::SIGKILL) };
    // It was orphaned to this test process (a subreaper): reap it by PID.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: waitpid of one specific pid.
        let r = unsafe { libc::waitpid(agent, std::ptr::null_mut(), libc::WNOHANG) };
        if r == agent || (r < 0 && proc_stat(agent).is_none_or(|(st, _, _)| st == 'Z')) {
            break;
        }
        assert!(Instant::now() < deadline, "the victim's agent did not die");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Its cgroups are still there: nobody cleaned up yet.
    assert!(!p.cgroup_dirs_of(&victim).is_empty());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !read_pids(&p.cgroup_dir(&victim).join("cgroup.procs")).is_empty() {
        assert!(Instant::now() < deadline, "the victim's processes outlived its pid namespace");
        std::thread::sleep(Duration::from_millis(10));
    }

    p.up(true);
    let api = Api::new(&p);
    let v = api.call(api.client.get(&victim)).unwrap();
    assert_eq!(v.state, SandboxState::Failed, "{v:?}");
    let reason = v.state_reason.clone().unwrap_or_default();
    assert!(reason.contains("re-adopt"), "reason: {reason:?}");
    assert!(v.stopped_at.is_some(), "{v:?}");
    assert!(p.cgroup_dirs_of(&victim).is_empty(), "the dead sandbox's cgroups stayed: {:?}", p.cgroup_dirs_of(&victim));
    let e = api.call(api.client.exec(&victim, &dsec_api::ExecRequest { cmd: Some("true".into()), ..Default::default() })).unwrap_err();
    assert_eq!(e.code(), Some(dsec_api::ErrorCode::SandboxNotRunning), "{e}");

    // The other sandbox was re-adopted whole, and the node has room for more.
    still_intact(&api, &survivor);
    let fresh = api.create_busybox(&[]);
    assert_eq!(api.out(&fresh.id, "echo fresh"), "fresh\n");
    let running: Vec<String> = api.call(api.client.list(&[("state", "running")])).unwrap().sandboxes.into_iter().map(|s| s.id).collect();
    assert_eq!(running.len(), 2, "{running:?}");
    assert!(running.contains(&survivor) && running.contains(&fresh.id));
    drop(api);
    p.finish();
}

/// The idle TTL counts from a sandbox's last request, also across a
/// restart: a sandbox in constant use, older than its TTL, must not be
/// stopped as idle by the restarted edge.
#[test]
fn the_idle_ttl_survives_a_restart() {
    let mut p = Platform::start(false);
    let api = Api::new(&p);
    let req: dsec_api::CreateSandboxRequest =
        serde_json::from_value(serde_json::json!({"image": "busybox", "memory_limit_mb": 64, "ttl_running_stop": 3})).unwrap();
    let sb = api.call(api.client.create(&req)).unwrap();
    // Busy for longer than the TTL.
    for _ in 0..10 {
        api.out(&sb.id, "true");
        std::thread::sleep(Duration::from_millis(400));
    }
    api.out(&sb.id, "true");
    let last_request = Instant::now();
    let before = api.call(api.client.get(&sb.id)).unwrap();
    assert_eq!(before.state, SandboxState::Running);
    drop(api);

    p.stop();
    p.up(false);
    let api = Api::new(&p);
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(last_request.elapsed()));
    let after = api.call(api.client.get(&sb.id)).unwrap();
    assert!(
        after.state == SandboxState::Running,
        "{:.1?} after its last request (TTL 3 s) the sandbox is {:?} ({:?}); last_active_at was {} before the restart, {} after",
        last_request.elapsed(),
        after.state,
        after.state_reason,
        before.last_active_at,
        after.last_active_at
    );
    assert!(after.last_active_at >= before.last_active_at, "{} < {}", after.last_active_at, before.last_active_at);
    // And the TTL still applies once it is really idle.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = api.call(api.client.get(&sb.id)).unwrap();
        if s.state == SandboxState::Stopped {
            assert!(s.state_reason.as_deref().unwrap_or_default().contains("idle"), "{s:?}");
            break;
        }
        assert!(Instant::now() < deadline, "not stopped when idle: {s:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    api.call(api.client.delete(&sb.id)).unwrap();
    drop(api);
    p.finish();
}

fn freezer_state(p: &Platform, id: &str) -> String {
    let dir = p.cgroup_dirs_of(id).into_iter().find(|d| d.join("freezer.state").exists()).expect("the sandbox's freezer cgroup");
    std::fs::read_to_string(dir.join("freezer.state")).unwrap().trim().to_string()
}

/// A crash of the edge while a sandbox is paused loses nothing: the
/// restarted edge keeps it frozen (it cannot talk to a frozen agent, so it
/// does not try), it still does not count as running, and the first
/// request resumes it with its processes and files, same agent.
#[test]
fn a_paused_sandbox_survives_sigkill_of_dsec() {
    let mut p = Platform::start(false);
    let api = Api::new(&p);
    let sb = api.create_busybox(&[("test", "paused-restart")]);
    prepare(&api, &sb.id);
    let paused = api.call(api.client.pause(&sb.id)).unwrap();
    assert_eq!(paused.sandbox.state, SandboxState::Paused);
    let agent = p.agent_pid(&sb.id).expect("the sandbox's agent");
    drop(api);

    p.signal_and_wait(libc::SIGKILL);
    assert_eq!(freezer_state(&p, &sb.id), "FROZEN");
    p.up(true);
    let api = Api::new(&p);
    let got = api.call(api.client.get(&sb.id)).unwrap();
    assert_eq!(got.state, SandboxState::Paused, "{got:?}\n{}", p.log());
    assert_eq!(freezer_state(&p, &sb.id), "FROZEN", "recovery must keep a paused sandbox frozen");
    // The first request resumes it and re-attaches to its agent.
    assert_eq!(api.out(&sb.id, "cat /root/state.txt"), "persisted\n");
    assert_eq!(freezer_state(&p, &sb.id), "THAWED");
    still_intact(&api, &sb.id);
    assert_eq!(p.agent_pid(&sb.id), Some(agent), "resume after a restart keeps the agent");
    // Paused again and stopped, through the re-attached agent.
    api.call(api.client.pause(&sb.id)).unwrap();
    assert_eq!(api.call(api.client.stop(&sb.id)).unwrap().state, SandboxState::Stopped);
    drop(api);
    p.finish();
}

/// A crash between a freeze and its record (the record says running, the
/// cgroup is frozen): the restarted edge thaws the sandbox before it
/// re-attaches, instead of waiting on a frozen agent and failing it.
#[test]
fn a_frozen_running_sandbox_is_thawed_on_restart() {
    let mut p = Platform::start(false);
    let api = Api::new(&p);
    let sb = api.create_busybox(&[]);
    prepare(&api, &sb.id);
    drop(api);
    p.signal_and_wait(libc::SIGKILL);
    let dir = p.cgroup_dirs_of(&sb.id).into_iter().find(|d| d.join("freezer.state").exists()).unwrap();
    std::fs::write(dir.join("freezer.state"), "FROZEN").unwrap();
    p.up(true);
    let api = Api::new(&p);
    assert_eq!(freezer_state(&p, &sb.id), "THAWED");
    still_intact(&api, &sb.id);
    drop(api);
    p.finish();
}
