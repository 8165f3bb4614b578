//! Exec through the real agent (plain mode).

mod common;

use std::time::{Duration, Instant};

use common::*;
use dsec_agent_proto::client::CallEvent;
use dsec_agent_proto::{ErrorKind, Op, Reply, Stdin, Stream};

#[tokio::test]
async fn hello_says_ready_with_the_sandbox_id() {
    let a = TestAgent::start().await;
    assert_eq!(a.hello.state, dsec_agent_proto::AgentState::Ready { sandbox_id: "test".into() });
    assert_eq!(a.client.call(Op::Ping).await.unwrap(), Reply::Pong);
}

#[tokio::test]
async fn shell_and_argv_with_exit_codes() {
    let a = TestAgent::start().await;
    let r = a.sh("echo out; echo err >&2; exit 3").await;
    assert_eq!((text(&r.stdout).as_str(), text(&r.stderr).as_str()), ("out\n", "err\n"));
    assert_eq!((r.exit_code, r.signal, r.timed_out, r.truncated), (Some(3), None, false, false));

    let r = a.exec(argv(&["printf", "%s|", "a b", "$HOME", "it's"])).await;
    assert_eq!(text(&r.stdout), "a b|$HOME|it's|");
    assert_eq!(r.exit_code, Some(0));

    let e = a.try_exec(argv(&["dsec-no-such-program"])).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::SpawnFailed, "{e:?}");
    let e = a.try_exec(argv(&[])).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
}

#[tokio::test]
async fn killed_by_a_signal() {
    let a = TestAgent::start().await;
    let r = a.sh("kill -9 $$").await;
    assert_eq!((r.exit_code, r.signal), (None, Some(9)));
}

#[tokio::test]
async fn env_cwd_and_identity_vars() {
    let a = TestAgent::start().await;
    std::fs::create_dir(a.host("/sub")).unwrap();
    let mut spec = shell("echo \"$FOO|$HOME|$USER|$(pwd)\"");
    spec.env = vec![("FOO".into(), "bar baz".into())];
    spec.cwd = Some("/sub".into());
    let r = a.exec(spec).await;
    let root = std::fs::canonicalize(a.root()).unwrap();
    assert_eq!(text(&r.stdout), format!("bar baz|/root|root|{}/sub\n", root.display()));

    let mut spec = shell("true");
    spec.cwd = Some("/missing".into());
    assert_eq!(a.try_exec(spec).await.unwrap_err().kind, ErrorKind::NotFound);
    let mut spec = shell("true");
    spec.env = vec![("BAD=NAME".into(), "x".into())];
    assert_eq!(a.try_exec(spec).await.unwrap_err().kind, ErrorKind::InvalidArgument);
}

#[tokio::test]
async fn commands_get_a_clean_process_context() {
    let a = TestAgent::start().await;
    // Own session and process group, no extra fds, empty signal mask, no
    // ignored signals, oom_score_adj 0.
    let r = a
        .sh("ls /proc/self/fd | tr '\\n' ' '; echo; ps -o pid=,pgid=,sid= -p $$; grep -E 'SigBlk|SigIgn|CapBnd' /proc/self/status; cat /proc/self/oom_score_adj")
        .await;
    let out = text(&r.stdout);
    let mut lines = out.lines();
    // ls itself opens one fd (3) for the directory it lists.
    assert_eq!(lines.next().unwrap().trim(), "0 1 2 3", "{out}");
    let ids: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert!(ids[0] == ids[1] && ids[1] == ids[2], "not a session leader: {ids:?}");
    assert_eq!(lines.next().unwrap(), "SigBlk:\t0000000000000000");
    assert_eq!(lines.next().unwrap(), "SigIgn:\t0000000000000000");
    if is_root() {
        assert_eq!(lines.next().unwrap(), "CapBnd:\t00000000a00425fb", "Docker's default bounding set without MKNOD");
    } else {
        lines.next();
    }
    assert_eq!(lines.next().unwrap(), "0");
}

#[tokio::test]
async fn user_switch_from_the_sandbox_passwd() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let a = TestAgent::start().await;
    let etc = a.host("/etc");
    std::fs::create_dir(&etc).unwrap();
    std::fs::write(etc.join("passwd"), "root:x:0:0:root:/root:/bin/sh\ntester:x:4321:4322:Test:/home/tester:/bin/sh\n").unwrap();
    std::fs::write(etc.join("group"), "root:x:0:\ntester:x:4322:\nextra:x:4323:tester,other\n").unwrap();
    // The user must be able to enter the working directory.
    std::fs::set_permissions(a.root(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut spec = shell("id -u; id -g; id -G; echo $HOME $USER $LOGNAME; grep CapEff /proc/self/status");
    spec.user = Some("tester".into());
    let r = a.exec(spec).await;
    assert_eq!(
        text(&r.stdout),
        "4321\n4322\n4322 4323\n/home/tester tester tester\nCapEff:\t0000000000000000\n",
        "stderr: {}",
        text(&r.stderr)
    );
    let mut spec = shell("id -u");
    spec.user = Some("777".into());
    assert_eq!(text(&a.exec(spec).await.stdout), "777\n");
    let mut spec = shell("true");
    spec.user = Some("nobody-here".into());
    assert_eq!(a.try_exec(spec).await.unwrap_err().kind, ErrorKind::UnknownUser);
}

#[tokio::test]
async fn stdin_bytes_and_streamed_stdin_and_output() {
    let a = TestAgent::start().await;
    let mut spec = shell("cat; echo .");
    spec.stdin = Stdin::Bytes(b"from bytes".to_vec());
    assert_eq!(text(&a.exec(spec).await.stdout), "from bytes.\n");

    // 3 MiB through cat, both directions streamed: more than the window
    // each way, so credit must flow in both directions.
    let data = noise(3 << 20, 7);
    let mut spec = shell("cat");
    spec.stdin = Stdin::Stream;
    spec.stream_output = true;
    spec.max_output_bytes = u64::MAX;
    let call = a.client.open(Op::Exec(spec)).await.unwrap();
    let (tx, mut rx) = call.into_split();
    let input = data.clone();
    let sender = tokio::spawn(async move {
        tx.send_data(&input).await.unwrap();
        tx.send_eof().unwrap();
    });
    let mut out = Vec::new();
    let result = loop {
        match rx.recv().await.unwrap().unwrap() {
            CallEvent::Data { stream: Stream::Stdout, data } => {
                assert!(data.len() <= dsec_agent_proto::MAX_CHUNK_BYTES);
                out.extend(data);
            }
            CallEvent::Data { stream, .. } => panic!("unexpected {stream:?}"),
            CallEvent::Reply(r) => break r.unwrap(),
        }
    };
    sender.await.unwrap();
    assert!(out == data, "streamed output differs ({} vs {} bytes)", out.len(), data.len());
    let Reply::Exited(r) = result else { panic!() };
    assert_eq!(r.exit_code, Some(0));
    assert!(r.stdout.is_empty(), "streamed output is not repeated in the reply");
}

#[tokio::test]
async fn a_slow_consumer_blocks_the_producer() {
    let a = TestAgent::start().await;
    // With nobody reading, `yes` must stall once the window is full rather
    // than have the agent buffer its output.
    let mut spec = shell("yes");
    spec.stream_output = true;
    spec.max_output_bytes = u64::MAX;
    let mut call = a.client.open(Op::Exec(spec)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let rss = a.rss_kib();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(a.rss_kib() < rss + 1024, "agent grows while the consumer sleeps");
    // Reading resumes the flow.
    let mut got = 0;
    while got < 4 << 20 {
        if let Some(CallEvent::Data { data, .. }) = call.recv().await.unwrap() {
            got += data.len();
        }
    }
    call.signal(libc::SIGKILL).unwrap();
    loop {
        if let Some(CallEvent::Reply(r)) = call.recv().await.unwrap() {
            let Reply::Exited(r) = r.unwrap() else { panic!() };
            assert_eq!(r.signal, Some(9));
            break;
        }
    }
}

#[tokio::test]
async fn signal_and_cancel() {
    let a = TestAgent::start().await;
    let call = a.client.open(Op::Exec(shell("sleep 30"))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    call.signal(libc::SIGTERM).unwrap();
    let (_, reply) = collect(call, 10).await;
    let Reply::Exited(r) = reply.unwrap() else { panic!() };
    assert_eq!(r.signal, Some(libc::SIGTERM));

    let call = a.client.open(Op::Exec(shell("echo $$; exec sleep 30"))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    call.cancel().unwrap();
    let (_, reply) = collect(call, 10).await;
    assert_eq!(reply.unwrap_err().kind, ErrorKind::Cancelled);
}

#[tokio::test]
async fn dropping_a_call_kills_its_command() {
    let a = TestAgent::start().await;
    let mut spec = shell("echo $$; exec sleep 60");
    spec.stream_output = true;
    let mut call = a.client.open(Op::Exec(spec)).await.unwrap();
    let Some(CallEvent::Data { data, .. }) = call.recv().await.unwrap() else { panic!() };
    let pid: i32 = text(&data).trim().parse().unwrap();
    assert!(pid_alive(pid));
    drop(call);
    let deadline = Instant::now() + Duration::from_secs(5);
    while pid_alive(pid) {
        assert!(Instant::now() < deadline, "cancelled command still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn timeout_terms_then_kills() {
    let a = TestAgent::start().await;
    let mut spec = shell("sleep 30");
    spec.timeout_ms = Some(200);
    let t = Instant::now();
    let r = a.exec(spec).await;
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(r.timed_out);
    assert_eq!(r.signal, Some(libc::SIGTERM));

    // A command that ignores SIGTERM gets SIGKILL after the grace period.
    let mut spec = shell("trap '' TERM; sleep 30; echo survived");
    spec.timeout_ms = Some(200);
    spec.kill_grace_ms = 300;
    let t = Instant::now();
    let r = a.exec(spec).await;
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(450) && took < Duration::from_secs(5), "{took:?}");
    assert!(r.timed_out);
    assert_eq!(r.signal, Some(libc::SIGKILL));
    assert!(!text(&r.stdout).contains("survived"));
}

#[tokio::test]
async fn output_cap_keeps_memory_flat() {
    let a = TestAgent::start().await;
    let before = a.rss_kib();
    let mut spec = shell("yes");
    spec.max_output_bytes = 1000;
    spec.timeout_ms = Some(3000);
    spec.kill_grace_ms = 100;
    let r = a.exec(spec).await;
    assert!(r.truncated && r.timed_out);
    assert_eq!(r.stdout.len(), 1000);
    assert!(r.stdout.starts_with(b"y\ny\n"));
    let after = a.rss_kib();
    assert!(after < before + 2048, "agent RSS grew from {before} to {after} KiB under `yes`");

    // The cap applies to streamed output too.
    let mut spec = shell("head -c 5000000 /dev/zero");
    spec.stream_output = true;
    spec.max_output_bytes = 100_000;
    let call = a.client.open(Op::Exec(spec)).await.unwrap();
    let (out, reply) = collect(call, 30).await;
    let Reply::Exited(r) = reply.unwrap() else { panic!() };
    assert_eq!(out.stdout.len(), 100_000);
    assert!(r.truncated);
    assert_eq!(r.exit_code, Some(0));
}

#[tokio::test]
async fn background_children_do_not_hold_the_reply() {
    let a = TestAgent::start().await;
    let t = Instant::now();
    let r = a.sh("sleep 30 & echo started").await;
    assert!(t.elapsed() < Duration::from_secs(3), "reply waited for the background child: {:?}", t.elapsed());
    assert_eq!(text(&r.stdout), "started\n");
    assert_eq!(r.exit_code, Some(0));
    // Output written just before exit is not lost.
    let r = a.sh("head -c 200000 /dev/zero; echo; echo end").await;
    assert!(text(&r.stdout).ends_with("\nend\n"));
    assert_eq!(r.stdout.len(), 200_005);
}

#[tokio::test]
async fn orphans_are_reaped() {
    let a = TestAgent::start().await;
    // A double fork: the grandchild is orphaned and comes to the agent
    // (a child subreaper in plain mode; PID 1 in a container).
    let r = a.sh("(sleep 0.5 & echo $!) ").await;
    let orphan: i32 = text(&r.stdout).trim().parse().unwrap();
    assert!(children_of(a.pid).contains(&orphan), "orphan was not re-parented to the agent");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(proc_state(orphan), None, "orphan left behind (zombie?)");
    for c in children_of(a.pid) {
        assert_ne!(proc_state(c), Some('Z'), "zombie child {c}");
    }
}

#[tokio::test]
async fn many_concurrent_execs() {
    let a = TestAgent::start().await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let client = a.client.clone();
        tasks.push(tokio::spawn(async move {
            let Reply::Exited(r) = client.call(Op::Exec(shell(&format!("echo {i}")))).await.unwrap() else { panic!() };
            assert_eq!(text(&r.stdout), format!("{i}\n"));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // One thread, however much work: no pools, no blocking helpers.
    assert_eq!(status_field(a.pid, "Threads:"), 1);
}

/// Round trip of `true` through the channel, for the report; asserts a
/// generous bound only (the machine is shared and noisy).
#[tokio::test]
async fn exec_round_trip_cost() {
    let a = TestAgent::start().await;
    let spec = argv(&["/bin/true"]);
    for _ in 0..20 {
        a.exec(spec.clone()).await;
    }
    let mut times = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let r = a.exec(spec.clone()).await;
        times.push(t.elapsed());
        assert_eq!(r.exit_code, Some(0));
    }
    times.sort();
    let p50 = times[times.len() / 2];
    // The floor: the same fork + exec + wait done directly.
    let mut direct = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        assert!(std::process::Command::new("/bin/true").status().unwrap().success());
        direct.push(t.elapsed());
    }
    direct.sort();
    let d50 = direct[direct.len() / 2];
    eprintln!(
        "exec /bin/true through the agent: p50 {p50:?}, p90 {:?}; direct fork+exec+wait: p50 {d50:?}; overhead ~{:?}",
        times[times.len() * 9 / 10],
        p50.saturating_sub(d50)
    );
    assert!(p50 < Duration::from_millis(20));
}

/// The bounded version of a long `yes`: a few seconds of it, buffered with a
/// cap and then streamed to a reader, sampling the agent's memory four times
/// a second. After the first second (the cap is full within milliseconds)
/// the agent's memory must be flat, and it never holds much more than the
/// cap. The minute-long measurement is an example:
/// `cargo run --release -p dsec-agent --example yes_memory -- --seconds 60`.
#[tokio::test]
async fn yes_keeps_the_agents_memory_flat() {
    const RUN: Duration = Duration::from_secs(4);
    const EVERY: Duration = Duration::from_millis(250);
    const CAP: u64 = 1 << 20;
    let a = TestAgent::start().await;
    for streamed in [false, true] {
        let mut spec = shell("yes");
        spec.max_output_bytes = CAP;
        spec.timeout_ms = Some(RUN.as_millis() as u64);
        spec.kill_grace_ms = 100;
        spec.stream_output = streamed;
        let before = a.rss_kib();
        let mut call = a.client.open(Op::Exec(spec)).await.unwrap();
        let start = Instant::now();
        let mut samples: Vec<(Duration, u64)> = Vec::new();
        let mut next = start + EVERY;
        let mut streamed_bytes = 0usize;
        let reply = loop {
            if Instant::now() >= next {
                samples.push((start.elapsed(), a.rss_kib()));
                next += EVERY;
            }
            match tokio::time::timeout(Duration::from_millis(50), call.recv()).await {
                Ok(Ok(Some(CallEvent::Data { data, .. }))) => streamed_bytes += data.len(),
                Ok(Ok(Some(CallEvent::Reply(r)))) => break r,
                Ok(other) => panic!("{other:?}"),
                Err(_) => {}
            }
            assert!(start.elapsed() < RUN + Duration::from_secs(10), "yes outlived its timeout by 10 s");
        };
        let Reply::Exited(r) = reply.unwrap() else { panic!() };
        assert!(r.truncated && r.timed_out, "{r:?}");
        let kept = if streamed { streamed_bytes } else { r.stdout.len() };
        assert_eq!(kept as u64, CAP, "streamed: {streamed}");
        let rss: Vec<u64> = samples.iter().map(|(_, k)| *k).collect();
        eprintln!("yes for {:?} (streamed: {streamed}): agent VmRSS {before} KiB before, then (KiB) {rss:?}", start.elapsed());
        // Steady state: from 1 s until shortly before the timeout fires (the
        // reply, which carries the buffered output, is built after it).
        let steady: Vec<u64> = samples
            .iter()
            .filter(|(t, _)| *t >= Duration::from_secs(1) && *t + Duration::from_millis(300) < RUN)
            .map(|(_, k)| *k)
            .collect();
        assert!(steady.len() >= 8, "too few samples: {samples:?}");
        let (lo, hi) = (*steady.iter().min().unwrap(), *steady.iter().max().unwrap());
        assert!(hi - lo < 256, "agent memory not flat under `yes` (streamed: {streamed}): {rss:?}");
        let peak = *rss.iter().max().unwrap();
        assert!(peak < before + 1024 + 2048, "agent holds more than the cap (streamed: {streamed}): {before} KiB before, {rss:?}");
    }
}

#[tokio::test]
async fn a_plain_agent_leaves_nothing_behind() {
    let a = TestAgent::start().await;
    let r = a.sh("sleep 100 >/dev/null 2>&1 & echo $!; (setsid sleep 100 >/dev/null 2>&1 & echo $!)").await;
    let pids: Vec<i32> = text(&r.stdout).split_whitespace().map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2);
    assert!(pids.iter().all(|&p| pid_alive(p)));
    let agent = a.pid;
    drop(a);
    assert_eq!(proc_state(agent), None);
    for p in pids {
        assert_eq!(proc_state(p), None, "process {p} outlived its agent");
    }
}

#[tokio::test]
async fn children_do_not_inherit_the_agents_oom_score_adj() {
    let dir = tempfile::tempdir().unwrap();
    // Raising it needs no privilege; the agent must put children back to 0.
    let a = TestAgent::start_with(dir, |cmd| {
        // SAFETY: open/write/close only, between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(cmd, || {
                let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY);
                if fd < 0 || libc::write(fd, b"500".as_ptr().cast(), 3) != 3 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            });
        }
    })
    .await;
    assert_eq!(std::fs::read_to_string(format!("/proc/{}/oom_score_adj", a.pid)).unwrap().trim(), "500");
    assert_eq!(text(&a.sh("cat /proc/self/oom_score_adj").await.stdout), "0\n");
}
