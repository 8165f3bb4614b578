//! The `dsec` binary end to end: `dsec up` on a temp data dir, and the
//! sandbox, image and shell commands against it, through DSEC_ENDPOINT and
//! DSEC_TOKEN. Needs root (CI runs as root). Each test has its own platform
//! (node name, port, data dir, image store) and checks that a graceful stop
//! leaves no cgroup, process or mount behind.

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn ps_json(p: &Platform, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["ps", "--json"];
    args.extend_from_slice(extra);
    let out = p.dsec(&args);
    match serde_json::from_str::<Value>(out.ok()) {
        Ok(Value::Array(v)) => v,
        other => panic!("ps --json printed {other:?}: {out:?}"),
    }
}

fn ids(list: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = list.iter().map(|s| s["id"].as_str().unwrap().to_string()).collect();
    v.sort();
    v
}

#[test]
fn run_ps_exec_stop_rm() {
    let p = Platform::start(true);

    // A one-shot command: its output, and no sandbox (not even a record) left;
    // also when the command fails or cannot be started.
    let out = p.dsec(&["run", "busybox", "--", "echo", "hi"]);
    assert_eq!(out.ok(), "hi\n");
    assert_eq!(p.dsec(&["run", "busybox", "--", "false"]).code(), Some(1));
    p.dsec(&["run", "busybox", "--", "no-such-program"]).fails_with("spawn_failed");
    assert!(ps_json(&p, &["-a"]).is_empty(), "dsec run -- CMD left a sandbox");

    // Sandboxes that stay: `run` prints the id.
    let a = p.dsec(&["run", "busybox", "--memory-mb", "64", "--label", "suite=cli", "--label", "role=a"]).ok().trim().to_string();
    let b = p.dsec(&["run", "busybox", "--memory-mb", "64", "--label", "suite=other"]).ok().trim().to_string();
    for id in [&a, &b] {
        assert!(id.starts_with(&format!("{}.", p.node)) && !id.contains(char::is_whitespace), "not an id: {id:?}");
    }

    // ps: the table, the JSON and the label filter.
    let table = p.dsec(&["ps"]).ok().to_string();
    let mut lines = table.lines();
    assert!(lines.next().unwrap().starts_with("ID "), "{table}");
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 2, "{table}");
    for id in [&a, &b] {
        let row = rows.iter().find(|r| r.starts_with(id.as_str())).unwrap_or_else(|| panic!("{id} not in\n{table}"));
        assert!(row.contains(" busybox ") && row.contains(" running "), "{row}");
    }
    let all = ps_json(&p, &[]);
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(ids(&all), both);
    let sa = all.iter().find(|s| s["id"] == a.as_str()).unwrap();
    assert_eq!(sa["state"], "running");
    assert_eq!(sa["node"], p.node.as_str());
    assert_eq!(sa["labels"], serde_json::json!({"suite": "cli", "role": "a"}));
    assert_eq!(sa["limits"]["memory_limit_mb"], 64);
    assert_eq!(ids(&ps_json(&p, &["--label", "suite=cli"])), vec![a.clone()]);
    assert_eq!(ids(&ps_json(&p, &["--label", "suite=cli", "--label", "role=a"])), vec![a.clone()]);
    assert!(ps_json(&p, &["--label", "suite=cli", "--label", "role=b"]).is_empty());
    assert!(ps_json(&p, &["--label", "suite=nothing"]).is_empty());
    assert_eq!(p.dsec(&["ps", "--label", "suite=nothing"]).ok().lines().count(), 1, "only the header");

    // exec: stdout, stderr and the exit code come through separately.
    let out = p.dsec(&["exec", &a, "--", "sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!((out.code(), out.stdout.as_str(), out.stderr.as_str()), (Some(3), "out\n", "err\n"), "{out:?}");
    let out = p.dsec(&["exec", &a, "--", "cat", "/proc/1/cmdline"]);
    assert!(out.ok().contains("dsec-agent"), "{out:?}");

    // A command past its --timeout is stopped.
    let out = p.dsec(&["exec", "--timeout", "0.5", &a, "--", "sleep", "30"]);
    assert!(out.code() != Some(0) && out.stderr.contains("[timed out]"), "{out:?}");

    // stop: the record stays, as stopped, listed only with -a; stopping
    // again is a no-op.
    assert_eq!(p.dsec(&["stop", &a]).ok(), format!("{a} stopped\n"));
    assert_eq!(p.dsec(&["stop", &a]).ok(), format!("{a} stopped\n"));
    assert_eq!(ids(&ps_json(&p, &[])), vec![b.clone()]);
    let all = ps_json(&p, &["-a"]);
    assert_eq!(all.len(), 2);
    let sa = all.iter().find(|s| s["id"] == a.as_str()).unwrap();
    assert_eq!(sa["state"], "stopped");
    assert!(sa["stopped_at"].is_string(), "{sa}");
    let table = p.dsec(&["ps", "-a"]).ok().to_string();
    assert!(table.lines().any(|l| l.starts_with(a.as_str()) && l.contains(" stopped ")), "{table}");
    assert!(p.cgroup_dirs_of(&a).is_empty(), "a stopped sandbox keeps no cgroup: {:?}", p.cgroup_dirs_of(&a));
    p.dsec(&["exec", &a, "--", "true"]).fails_with("sandbox_not_running");

    // rm: both go, records included; a second rm fails.
    assert_eq!(p.dsec(&["rm", &a, &b]).ok(), format!("{a}\n{b}\n"));
    assert!(ps_json(&p, &["-a"]).is_empty());
    p.dsec(&["rm", &a]).fails_with("sandbox_not_found");
    p.finish();
}

#[test]
fn image_build_ls_run_rm() {
    let p = Platform::start(true);
    let images = p.images_dir().display().to_string();
    let name = format!("clitest-{}", hex_id());

    // A tiny root: static busybox, a shell, and a file to recognise it by.
    let root = p.dir.path().join("rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::copy("/usr/bin/busybox", root.join("bin/busybox")).expect("static busybox (busybox-static) on the host");
    for applet in ["sh", "cat", "ls"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("etc/motd"), format!("hello from {name}\n")).unwrap();

    let out = p.dsec(&["image", "build", &name, "--from-dir", &root.display().to_string(), "--images-dir", &images]);
    out.ok();
    assert!(out.stderr.contains(&format!("built {name}")), "{out:?}");

    let ls = p.dsec(&["image", "ls", "--images-dir", &images]).ok().to_string();
    let mut lines = ls.lines();
    assert!(lines.next().unwrap().starts_with("NAME "), "{ls}");
    let names: Vec<&str> = lines.map(|l| l.split_whitespace().next().unwrap()).collect();
    assert!(names.contains(&format!("{name}:latest").as_str()), "{ls}");
    assert!(names.contains(&"busybox:latest"), "{ls}");
    // The running platform lists it too.
    let (status, body) = http_get(&p.addr, "/v1/images", Some(&p.token)).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("\"{name}:latest\"")), "{body}");

    // A sandbox from it sees its files.
    assert_eq!(p.dsec(&["run", &name, "--", "cat", "/etc/motd"]).ok(), format!("hello from {name}\n"));
    let id = p.dsec(&["run", &name]).ok().trim().to_string();
    let out = p.dsec(&["exec", &id, "--", "sh", "-c", "ls /bin; echo written > /etc/new && cat /etc/new"]);
    assert_eq!(out.ok(), "busybox\ncat\nls\nsh\nwritten\n");
    p.dsec(&["rm", &id]).ok();

    // rm: gone from the list, and sandboxes can no longer be made from it.
    assert_eq!(p.dsec(&["image", "rm", &name, "--images-dir", &images]).ok(), format!("{name}\n"));
    let ls = p.dsec(&["image", "ls", "--images-dir", &images]).ok().to_string();
    assert!(!ls.contains(&name), "{ls}");
    p.dsec(&["run", &name, "--", "true"]).fails_with("image_not_found");
    let out = p.dsec(&["image", "rm", &name, "--images-dir", &images]);
    assert!(!out.status.success() && out.stderr.contains(&name), "{out:?}");
    assert!(ps_json(&p, &["-a"]).is_empty());
    p.finish();
}

/// A pseudo-terminal pair: (master, slave).
fn openpty(rows: u16, cols: u16) -> (OwnedFd, OwnedFd) {
    let (mut m, mut s) = (-1, -1);
    let ws = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: openpty writes two fds into the out pointers; no name buffer,
    // default termios, a valid winsize.
    let r = unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &ws) };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both fds were just opened and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) }
}

fn lflag(fd: &OwnedFd) -> libc::tcflag_t {
    // SAFETY: termios is plain data; tcgetattr fills it for a valid tty fd.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(fd.as_raw_fd(), &mut t), 0, "tcgetattr: {}", std::io::Error::last_os_error());
        t.c_lflag
    }
}

#[test]
fn shell_through_a_real_pty() {
    shell_session(Platform::start(true));
}

/// The same over HTTPS: every CLI call checks the server's certificate
/// against the CA it is given, and the terminal is a `wss://` WebSocket.
#[test]
fn shell_through_a_real_pty_over_tls() {
    let p = Platform::start_tls(true);
    assert!(p.endpoint().starts_with("https://"));
    // Without the CA the CLI refuses the server, naming why.
    let mut untrusting = p.cli_command(&["ps"]);
    untrusting.env_remove("DSEC_CA_CERT");
    let out = untrusting.output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("certificate"), "{err}");
    shell_session(p);
}

fn shell_session(p: Platform) {
    let id = p.dsec(&["run", "busybox"]).ok().trim().to_string();

    let (master, slave) = openpty(33, 101);
    let cooked = libc::ICANON | libc::ECHO;
    assert_eq!(lflag(&master) & cooked, cooked, "a new pty starts cooked");
    let mut cmd = p.cli_command(&["shell", &id]);
    cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    // SAFETY: setsid and ioctl are async-signal-safe; the child gets its own
    // session with the pty as its controlling terminal, like a login shell.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawning dsec shell");
    // Only the child holds the terminal now (the Command keeps its copies
    // of the slave until dropped): the master reads EIO once it exits.
    drop(cmd);
    drop(slave);

    let screen = Arc::new(Mutex::new(Vec::<u8>::new()));
    let mut reader = std::fs::File::from(master.try_clone().unwrap());
    let sink = screen.clone();
    let reader_t = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let text = |s: &Arc<Mutex<Vec<u8>>>| String::from_utf8_lossy(&s.lock().unwrap()).into_owned();
    let guard = KillOnDrop(Some(child.id() as i32));

    // Wait for the shell's prompt, then type like a user would.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !text(&screen).contains("# ") {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("dsec shell exited ({s}) before a prompt: {:?}", text(&screen));
        }
        assert!(Instant::now() < deadline, "no prompt within 20 s: {:?}", text(&screen));
        std::thread::sleep(Duration::from_millis(20));
    }
    // While the shell runs, the local terminal is raw.
    assert_eq!(lflag(&master) & cooked, 0, "dsec shell did not put the terminal in raw mode");
    let mut writer = std::fs::File::from(master.try_clone().unwrap());
    writer.write_all(b"stty size; tty; echo hi-from-pty; exit 7\r").unwrap();
    let status = wait_bounded(&mut child, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("dsec shell did not exit after `exit`: {:?}", text(&screen)));
    drop(guard);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !reader_t.is_finished() {
        assert!(Instant::now() < deadline, "the terminal stayed open after dsec shell exited: {:?}", text(&screen));
        std::thread::sleep(Duration::from_millis(10));
    }
    reader_t.join().unwrap();
    let screen = text(&screen);
    let lines: Vec<&str> = screen.split('\n').map(|l| l.trim_end_matches('\r')).collect();
    assert!(lines.contains(&"hi-from-pty"), "no output line hi-from-pty in {screen:?}");
    assert!(lines.contains(&"33 101"), "the sandbox's terminal does not have our window size: {screen:?}");
    assert!(lines.iter().any(|l| l.starts_with("/dev/pts/")), "the shell has no tty: {screen:?}");
    assert_eq!(status.code(), Some(7), "the shell's exit code: {screen:?}");
    // The terminal is given back as it was found.
    assert_eq!(lflag(&master) & cooked, cooked, "dsec shell left the terminal raw");

    // The sandbox is still there and usable after the shell left.
    assert_eq!(p.dsec(&["exec", &id, "--", "echo", "still-here"]).ok(), "still-here\n");
    p.dsec(&["rm", &id]).ok();
    p.finish();
}

/// SIGKILLs a process this test started (by PID) unless disarmed.
struct KillOnDrop(Option<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            if std::thread::panicking() {
                // SAFETY: kill(2) of our own child; its Child handle reaps it.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

#[test]
fn error_paths() {
    let p = Platform::start(true);

    p.dsec(&["run", "no-such-image", "--", "true"]).fails_with("image_not_found");
    p.dsec(&["run", "no-such-image"]).fails_with("image_not_found");
    assert!(ps_json(&p, &["-a"]).is_empty(), "a refused create left a record");
    p.dsec(&["exec", &format!("{}.000000000000", p.node), "--", "true"]).fails_with("sandbox_not_found");
    p.dsec(&["stop", &format!("{}.000000000000", p.node)]).fails_with("sandbox_not_found");

    // Wrong or missing token.
    let mut cmd = p.cli_command(&["ps"]);
    cmd.env("DSEC_TOKEN", "wrong");
    run_bounded(cmd, CLI_TIMEOUT).fails_with("unauthorized");
    let mut cmd = p.cli_command(&["run", "busybox", "--", "true"]);
    cmd.env("DSEC_TOKEN", "wrong");
    run_bounded(cmd, CLI_TIMEOUT).fails_with("unauthorized");
    let mut cmd = p.cli_command(&["ps"]);
    cmd.env_remove("DSEC_TOKEN").env("DSEC_TOKEN_FILE", p.dir.path().join("no-such-token"));
    run_bounded(cmd, CLI_TIMEOUT).fails_with("unauthorized");
    // Without DSEC_TOKEN the CLI falls back to the admin token file.
    let mut cmd = p.cli_command(&["ps", "--json"]);
    cmd.env_remove("DSEC_TOKEN").env("DSEC_TOKEN_FILE", p.data_dir().join("admin-token"));
    assert_eq!(run_bounded(cmd, CLI_TIMEOUT).ok().trim(), "[]");

    // FnCall: an unknown language, and runners that cannot start (this
    // store has no `judge` image) are clear errors, not hangs.
    p.dsec(&["fncall", "-l", "cobol", "--code", "x"]).fails_with("unsupported_language");
    let out = p.dsec(&["fncall", "-l", "python", "--code", "print(1)"]);
    out.fails_with("runner_failed");
    out.fails_with("judge");
    assert!(ps_json(&p, &["-a"]).is_empty(), "a runner that failed to start left a record");

    // Nothing listens there: a clear failure naming the endpoint.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cmd = p.cli_command(&["ps"]);
    cmd.env("DSEC_ENDPOINT", format!("http://{dead}"));
    run_bounded(cmd, CLI_TIMEOUT).fails_with(&dead.to_string());

    // A second `dsec up` on a data dir in use refuses, and leaves the first alone.
    let out = run_bounded(p.up_command(false), Duration::from_secs(20));
    out.fails_with(&format!("another dsec is already running on {}", p.data_dir().display()));
    assert!(matches!(http_get(&p.addr, "/healthz", None), Ok((200, _))));
    assert_eq!(p.dsec(&["run", "busybox", "--", "echo", "ok"]).ok(), "ok\n");
    p.finish();
}

#[test]
fn shell_refuses_a_stopped_sandbox_with_the_usual_message() {
    let p = Platform::start(true);
    p.dsec(&["shell", &format!("{}.000000000000", p.node)]).fails_with("sandbox_not_found");
    let id = p.dsec(&["run", "busybox"]).ok().trim().to_string();
    p.dsec(&["stop", &id]).ok();
    let out = p.dsec(&["shell", &id]);
    out.fails_with("sandbox_not_running");
    // Every other command prints API errors as `error: CODE: MESSAGE`.
    let exec = p.dsec(&["exec", &id, "--", "true"]);
    assert!(exec.stderr.starts_with("error: sandbox_not_running: "), "{exec:?}");
    assert!(out.stderr.starts_with("error: sandbox_not_running: "), "dsec shell prints the error as JSON values: {:?}", out.stderr);
    p.dsec(&["rm", &id]).ok();
    p.finish();
}

/// A `dsec up` that fails half-way through starting (no guest agent
/// binary; a bad `--fncall-pools`; a network configuration that does not
/// parse) says why and leaves none of the node's mounts or cgroups behind
/// (the layer mount point and the node's cgroup levels are made before the
/// failure).
#[test]
fn a_failed_start_leaves_no_mount() {
    let bad_network = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bad_network.path(), r#"{"services": {"pypi": [{"domain": "not a name"}]}}"#).unwrap();
    let bad_network = bad_network.path().display().to_string();
    let dir = tempfile::Builder::new().prefix("dsec-cli-test-").tempdir().unwrap();
    let no_agent = dir.path().join("no-such-agent").display().to_string();
    let cases: [(&[&str], &str); 3] = [
        (&["--no-fncall", "--agent", &no_agent], "guest agent binary not found"),
        (&["--fncall-pools", "python=nine"], "python=nine"),
        (&["--no-fncall", "--network-config", &bad_network], "service pypi"),
    ];
    for (args, why) in cases {
        let dir = tempfile::Builder::new().prefix("dsec-cli-test-").tempdir().unwrap();
        let node = format!("cli{}", hex_id());
        let mut cmd = std::process::Command::new(DSEC);
        cmd.arg("up")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--images-dir")
            .arg(dir.path().join("images"))
            .args(["--listen", "127.0.0.1:0", "--node", &node])
            .args(args);
        run_bounded(cmd, Duration::from_secs(30)).fails_with(why);
        let root = dir.path().to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let left: Vec<&str> = mounts.lines().filter(|l| l.contains(root.as_str())).collect();
        assert!(left.is_empty(), "a failed start ({args:?}) left mounts: {left:#?}");
        let cgroups = std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten().map(|h| h.path().join("dsec").join(&node));
        let left: Vec<_> =
            cgroups.chain([std::path::PathBuf::from("/sys/fs/cgroup/unified/dsec").join(&node)]).filter(|p| p.exists()).collect();
        assert!(left.is_empty(), "a failed start ({args:?}) left cgroups: {left:#?}");
    }
}

/// Agents are forks of the spawn helper by default, and exec'd afresh with
/// `--agent-exec`; either way they serve the same.
#[test]
fn agents_start_forked_from_the_helper_or_exec_d() {
    for (flags, started_as) in [(&[][..], "spawner"), (&["--agent-exec"][..], "container")] {
        let p = Platform::start_with(true, flags);
        let id = p.dsec(&["run", "busybox", "--memory-mb", "64"]).ok().trim().to_string();
        assert_eq!(p.dsec(&["exec", &id, "--", "echo", "ok"]).ok(), "ok\n");
        let pid = p.agent_pid(&id).expect("the sandbox's agent");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).collect();
        assert_eq!(
            args.last().copied(),
            Some(started_as.as_bytes()),
            "agent of dsec up {flags:?}: {:?}",
            String::from_utf8_lossy(&cmdline)
        );
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        assert_eq!(comm.trim(), "dsec-agent");
        // The agent's own hardening happened in both cases.
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{status}");
        p.dsec(&["rm", &id]).ok();
    }
}
