//! A misbehaving edge: raw frames straight onto the channel. The agent must
//! never panic, must answer what it can, and must keep serving.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::process::{Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use common::*;
use dsec_agent_proto::codec::{read_frame, write_frame};
use dsec_agent_proto::{
    EdgeHello, ErrorKind, FromAgent, Offer, Op, Reply, Stdin, ToAgent, INITIAL_WINDOW, MAX_CHUNK_BYTES, MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
};

/// A plain agent whose Hello was read (and checked), with `stderr`.
fn spawn_plain(stderr: Stdio) -> (UnixStream, ChildGuard, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (mut ours, theirs) = UnixStream::pair().unwrap();
    let mut cmd = StdCommand::new(agent_bin());
    cmd.args(["plain", "--root"]).arg(dir.path());
    cmd.env_clear().env("PATH", "/usr/bin:/bin").stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr);
    pass_as_fd3(&mut cmd, &theirs);
    let child = cmd.spawn().unwrap();
    drop(theirs);
    ours.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let FromAgent::Hello(h) = read_frame::<_, FromAgent>(&mut ours).unwrap() else { panic!("no hello") };
    assert_eq!(h.protocol_version, PROTOCOL_VERSION);
    assert_eq!(h.offer.map(|o| o.min_version), Some(MIN_PROTOCOL_VERSION));
    (ours, ChildGuard(Some(child)), dir)
}

fn start() -> (UnixStream, ChildGuard, tempfile::TempDir) {
    let (mut ours, child, dir) = spawn_plain(Stdio::inherit());
    write_frame(&mut ours, &ToAgent::Hello(EdgeHello::ours(PROTOCOL_VERSION))).unwrap();
    (ours, child, dir)
}

/// An edge from before negotiation says only its version: served.
#[test]
fn an_edge_from_before_negotiation_is_served() {
    let (mut s, _child, _dir) = spawn_plain(Stdio::inherit());
    write_frame(&mut s, &ToAgent::Hello(EdgeHello { protocol_version: PROTOCOL_VERSION, offer: None })).unwrap();
    write_frame(&mut s, &ToAgent::Request { id: 1, op: Op::Ping }).unwrap();
    assert_eq!(reply_for(&mut s, 1).unwrap(), Reply::Pong);
}

/// An edge with no version in common: the agent says why (both ranges)
/// and exits.
#[test]
fn an_edge_without_a_common_version_is_refused() {
    let (mut s, mut child, _dir) = spawn_plain(Stdio::piped());
    let old = Offer { min_version: 1, features: vec![] };
    write_frame(&mut s, &ToAgent::Hello(EdgeHello { protocol_version: MIN_PROTOCOL_VERSION - 1, offer: Some(old) })).unwrap();
    let out = child.0.take().unwrap().wait_with_output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "the edge speaks protocols 1 to {}, this agent protocols {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}",
        MIN_PROTOCOL_VERSION - 1
    );
    assert!(stderr.contains(&want), "{stderr}");
}

/// Reads frames until the reply for `id`.
fn reply_for(s: &mut UnixStream, id: u64) -> Result<Reply, dsec_agent_proto::AgentError> {
    loop {
        if let FromAgent::Reply { id: got, result } = read_frame::<_, FromAgent>(s).unwrap() {
            if got == id {
                return result;
            }
        }
    }
}

#[test]
fn garbage_and_stray_frames_are_survived() {
    let (mut s, _child, _dir) = start();
    // An undecodable frame of a valid length.
    let mut junk = 6u32.to_le_bytes().to_vec();
    junk.extend([0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    s.write_all(&junk).unwrap();
    // Frames for requests that do not exist, and a second Hello.
    for m in [
        ToAgent::Data { id: 77, data: vec![1, 2, 3] },
        ToAgent::Credit { id: 77, bytes: 5 },
        ToAgent::Cancel { id: 78 },
        ToAgent::Hello(EdgeHello::ours(PROTOCOL_VERSION)),
    ] {
        write_frame(&mut s, &m).unwrap();
    }
    write_frame(&mut s, &ToAgent::Request { id: 1, op: Op::Ping }).unwrap();
    assert_eq!(reply_for(&mut s, 1).unwrap(), Reply::Pong);

    // Absurd numbers are not a crash.
    let mut spec = shell("echo fine");
    spec.timeout_ms = Some(u64::MAX);
    spec.kill_grace_ms = u64::MAX;
    spec.max_output_bytes = u64::MAX;
    write_frame(&mut s, &ToAgent::Request { id: 3, op: Op::Exec(spec) }).unwrap();
    let Reply::Exited(r) = reply_for(&mut s, 3).unwrap() else { panic!() };
    assert_eq!(r.stdout, b"fine\n");
    write_frame(&mut s, &ToAgent::Request { id: 4, op: Op::ReadFile { path: "/".into(), offset: u64::MAX, limit: Some(u64::MAX) } })
        .unwrap();
    assert_eq!(reply_for(&mut s, 4).unwrap_err().kind, ErrorKind::IsADirectory);
    write_frame(&mut s, &ToAgent::Signal { id: 999, signal: 12345 }).unwrap();

    // SetupContainer in plain mode is refused, not attempted.
    let setup = dsec_agent_proto::ContainerSetup {
        sandbox_id: "x".into(),
        hostname: "x".into(),
        lower_dirs: vec!["/".into()],
        scratch_mount: "/tmp".into(),
        disk_limit_bytes: 1,
        sys_dir: String::new(),
        masked_paths: vec![],
        readonly_paths: vec![],
        syscall_filter: false,
        env: vec![],
        workdir: "/".into(),
        default_user: "root".into(),
        resolv_conf: None,
        scratch_source: None,
        volumes: vec![],
    };
    write_frame(&mut s, &ToAgent::Request { id: 2, op: Op::SetupContainer(setup) }).unwrap();
    assert_eq!(reply_for(&mut s, 2).unwrap_err().kind, ErrorKind::Unsupported);
}

#[test]
fn duplicate_ids_and_window_overruns_are_protocol_errors() {
    let (mut s, _child, _dir) = start();
    let mut spec = shell("sleep 1");
    spec.stdin = Stdin::Stream;
    write_frame(&mut s, &ToAgent::Request { id: 5, op: Op::Exec(spec) }).unwrap();
    write_frame(&mut s, &ToAgent::Request { id: 5, op: Op::Ping }).unwrap();
    assert_eq!(reply_for(&mut s, 5).unwrap_err().kind, ErrorKind::Protocol);

    // Nobody reads this command's stdin, so credit stops coming back: an
    // edge that keeps sending overruns its window.
    let mut spec = shell("sleep 30");
    spec.stdin = Stdin::Stream;
    write_frame(&mut s, &ToAgent::Request { id: 6, op: Op::Exec(spec) }).unwrap();
    let chunks = (INITIAL_WINDOW as usize + 2 * 65536) / MAX_CHUNK_BYTES + 1;
    for _ in 0..chunks {
        write_frame(&mut s, &ToAgent::Data { id: 6, data: vec![0; MAX_CHUNK_BYTES] }).unwrap();
    }
    assert_eq!(reply_for(&mut s, 6).unwrap_err().kind, ErrorKind::Protocol);
    // Still serving.
    write_frame(&mut s, &ToAgent::Request { id: 7, op: Op::Ping }).unwrap();
    assert_eq!(reply_for(&mut s, 7).unwrap(), Reply::Pong);
}

#[test]
fn a_corrupt_length_ends_the_connection_cleanly() {
    let (mut s, mut child, _dir) = start();
    s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let c = child.0.as_mut().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "agent did not exit");
        std::thread::sleep(Duration::from_millis(10));
    };
    // A plain agent exits when its edge is unusable; it did not crash.
    assert!(status.success(), "{status:?}");
}

#[test]
fn shutdown_replies_then_exits() {
    let (mut s, mut child, _dir) = start();
    write_frame(&mut s, &ToAgent::Request { id: 1, op: Op::Exec(shell("sleep 60")) }).unwrap();
    write_frame(&mut s, &ToAgent::Request { id: 2, op: Op::Shutdown }).unwrap();
    assert_eq!(reply_for(&mut s, 2).unwrap(), Reply::Done);
    let st = child.0.as_mut().unwrap().wait().unwrap();
    assert!(st.success());
}
