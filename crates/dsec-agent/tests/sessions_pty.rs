//! Sessions and PTYs through the real agent (plain mode).

mod common;

use std::time::{Duration, Instant};

use common::*;
use dsec_agent_proto::client::{Call, CallEvent, ClientError};
use dsec_agent_proto::{Command, ErrorKind, Op, PtySpec, Reply, SessionSpec, Stream};

async fn open_session(a: &TestAgent) -> String {
    let spec = SessionSpec { env: vec![("GREETING".into(), "hello".into())], cwd: None, user: None };
    match a.client.call(Op::OpenSession(spec)).await.unwrap() {
        Reply::Session { session_id } => session_id,
        other => panic!("{other:?}"),
    }
}

fn in_session(id: &str, cmd: &str) -> dsec_agent_proto::ExecSpec {
    let mut s = shell(cmd);
    s.session = Some(id.into());
    s
}

#[tokio::test]
async fn cwd_and_exports_carry_over() {
    let a = TestAgent::start().await;
    std::fs::create_dir_all(a.host("/work/dir")).unwrap();
    let root = std::fs::canonicalize(a.root()).unwrap();
    let id = open_session(&a).await;

    let r = a.exec(in_session(&id, "cd work/dir && export A='x y' B=$'two\\nlines'; NOT_EXPORTED=1; echo $GREETING")).await;
    assert_eq!((text(&r.stdout).as_str(), r.exit_code), ("hello\n", Some(0)));
    let r = a.exec(in_session(&id, "pwd; echo \"$A|$B|${NOT_EXPORTED:-unset}\"")).await;
    assert_eq!(text(&r.stdout), format!("{}/work/dir\nx y|two\nlines|unset\n", root.display()));

    // exit: the exit code is exact and the session keeps its state.
    let r = a.exec(in_session(&id, "cd / && export A=changed; exit 7")).await;
    assert_eq!(r.exit_code, Some(7));
    let r = a.exec(in_session(&id, "pwd; echo $A")).await;
    assert_eq!(text(&r.stdout), format!("{}/work/dir\nx y\n", root.display()));

    // A per-command variable does not stick; unset does.
    let mut spec = in_session(&id, "echo $ONCE; unset B");
    spec.env = vec![("ONCE".into(), "1".into())];
    assert_eq!(text(&a.exec(spec).await.stdout), "1\n");
    let r = a.exec(in_session(&id, "echo \"${ONCE:-none}|${B:-gone}\"")).await;
    assert_eq!(text(&r.stdout), "none|gone\n");

    // A timed-out command leaves the state alone too.
    let mut spec = in_session(&id, "cd /; export A=late; sleep 30");
    spec.timeout_ms = Some(200);
    assert!(a.exec(spec).await.timed_out);
    let r = a.exec(in_session(&id, "echo $A")).await;
    assert_eq!(text(&r.stdout), "x y\n");

    // Argv commands run in the session too.
    let mut spec = argv(&["printf", "%s", "$A"]);
    spec.session = Some(id.clone());
    assert_eq!(text(&a.exec(spec).await.stdout), "$A");

    // Explicit cwd overrides for one command.
    let mut spec = in_session(&id, "pwd");
    spec.cwd = Some("/work".into());
    assert_eq!(text(&a.exec(spec).await.stdout), format!("{}/work\n", root.display()));
}

#[tokio::test]
async fn close_kills_the_sessions_processes() {
    let a = TestAgent::start().await;
    let id = open_session(&a).await;
    let r = a.exec(in_session(&id, "sleep 60 & echo $!")).await;
    let bg: i32 = text(&r.stdout).trim().parse().unwrap();
    assert!(pid_alive(bg));
    assert_eq!(a.client.call(Op::CloseSession { session_id: id.clone() }).await.unwrap(), Reply::Done);
    let deadline = Instant::now() + Duration::from_secs(5);
    while pid_alive(bg) {
        assert!(Instant::now() < deadline, "background process survived CloseSession");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let e = a.client.call(Op::Exec(in_session(&id, "true"))).await.unwrap_err();
    assert!(matches!(e, ClientError::Agent(ref e) if e.kind == ErrorKind::UnknownSession), "{e}");
    let e = a.client.call(Op::CloseSession { session_id: "nope".into() }).await.unwrap_err();
    assert!(matches!(e, ClientError::Agent(ref e) if e.kind == ErrorKind::UnknownSession), "{e}");
}

/// Reads PTY output until `needle` appears (or panics after a while).
async fn read_until(call: &mut Call, seen: &mut String, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, call.recv()).await {
            Ok(Ok(Some(CallEvent::Data { stream: Stream::Pty, data }))) => seen.push_str(&text(&data)),
            Ok(other) => panic!("unexpected {other:?} while waiting for {needle:?}; seen {seen:?}"),
            Err(_) => panic!("timed out waiting for {needle:?}; seen {seen:?}"),
        }
    }
}

#[tokio::test]
async fn pty_shell_echo_resize_exit() {
    let a = TestAgent::start().await;
    let spec = PtySpec {
        command: Some(Command::Argv(vec!["/bin/sh".into()])),
        env: vec![("PS1".into(), "$ ".into())],
        cwd: None,
        user: None,
        rows: 24,
        cols: 80,
    };
    let mut call = a.client.open(Op::OpenPty(spec)).await.unwrap();
    let mut seen = String::new();
    call.send_data(b"echo hi$((1+1))\n").await.unwrap();
    // The terminal echoes what we type, then the command prints "hi2".
    read_until(&mut call, &mut seen, "hi2\r\n").await;
    call.send_data(b"stty size; tty\n").await.unwrap();
    read_until(&mut call, &mut seen, "24 80\r\n").await;
    read_until(&mut call, &mut seen, "/dev/pts/").await;
    call.resize(30, 100).unwrap();
    call.send_data(b"stty size\n").await.unwrap();
    read_until(&mut call, &mut seen, "30 100\r\n").await;
    call.send_data(b"exit 5\n").await.unwrap();
    let reply = loop {
        match tokio::time::timeout(Duration::from_secs(10), call.recv()).await.unwrap().unwrap() {
            Some(CallEvent::Reply(r)) => break r,
            Some(CallEvent::Data { .. }) => {}
            None => panic!("no reply"),
        }
    };
    let Reply::Exited(r) = reply.unwrap() else { panic!() };
    assert_eq!(r.exit_code, Some(5));
}

#[tokio::test]
async fn pty_ctrl_c_reaches_the_foreground_program() {
    let a = TestAgent::start().await;
    let spec =
        PtySpec { command: Some(Command::Shell("sleep 30; echo after".into())), env: vec![], cwd: None, user: None, rows: 10, cols: 40 };
    let call = a.client.open(Op::OpenPty(spec)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ^C through the line discipline: SIGINT to the foreground group.
    call.send_data(b"\x03").await.unwrap();
    let (_, reply) = collect(call, 10).await;
    let Reply::Exited(r) = reply.unwrap() else { panic!() };
    assert!(r.signal == Some(libc::SIGINT) || r.exit_code == Some(130), "{r:?}");
}
