//! The long measurement behind the `yes_keeps_the_agents_memory_flat` test:
//! `yes` for a minute (by default) through the real agent in plain mode,
//! buffered with a 1 MiB cap and then streamed to a reader, sampling the
//! agent's resident memory every 5 s. Exits non-zero if the memory was not
//! flat or exceeded the cap plus slack.
//!
//! ```sh
//! cargo build --release -p dsec-agent
//! cargo run --release -p dsec-agent --example yes_memory -- --seconds 60 [--agent target/release/dsec-agent]
//! ```

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command as StdCommand, ExitCode, Stdio};
use std::time::{Duration, Instant};

use dsec_agent_proto::client::{AgentClient, CallEvent};
use dsec_agent_proto::{Command, ExecSpec, Op, Reply, Stdin};

const CAP: u64 = 1 << 20;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn main() -> ExitCode {
    let mut seconds = 60u64;
    // target/<profile>/examples/yes_memory -> target/<profile>/dsec-agent
    let mut agent = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().and_then(|d| d.parent()).map(|d| d.join("dsec-agent")))
        .unwrap_or_else(|| PathBuf::from("dsec-agent"));
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--seconds", Some(v)) => seconds = v.parse().expect("--seconds N"),
            ("--agent", Some(v)) => agent = PathBuf::from(v),
            _ => {
                eprintln!("usage: yes_memory [--seconds N] [--agent PATH]");
                return ExitCode::from(2);
            }
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(run(agent, Duration::from_secs(seconds)))
}

async fn run(agent: PathBuf, length: Duration) -> ExitCode {
    let root = tempfile::tempdir().unwrap();
    let (ours, theirs) = StdUnixStream::pair().unwrap();
    let fd = theirs.as_raw_fd();
    let mut cmd = StdCommand::new(&agent);
    cmd.args(["plain", "--root"]).arg(root.path()).args(["--sandbox-id", "yes-memory"]);
    cmd.env_clear().env("PATH", "/usr/local/bin:/usr/bin:/bin").env("LANG", "C");
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
    // SAFETY: only dup2/fcntl between fork and exec: the channel becomes fd 3.
    unsafe {
        cmd.pre_exec(move || {
            let r = if fd == 3 { libc::fcntl(3, libc::F_SETFD, 0) } else { libc::dup2(fd, 3) };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot start {}: {e} (build it: cargo build --release -p dsec-agent)", agent.display());
            return ExitCode::FAILURE;
        }
    };
    drop(theirs);
    ours.set_nonblocking(true).unwrap();
    let (client, _) = AgentClient::connect(tokio::net::UnixStream::from_std(ours).unwrap()).await.unwrap();
    let pid = child.id();
    let mut ok = true;
    for streamed in [false, true] {
        let spec = ExecSpec {
            command: Command::Shell("yes".into()),
            env: vec![],
            cwd: None,
            user: None,
            stdin: Stdin::Null,
            stream_output: streamed,
            timeout_ms: Some(length.as_millis() as u64),
            kill_grace_ms: 100,
            max_output_bytes: CAP,
            session: None,
        };
        let before = rss_kib(pid);
        let mut call = client.open(Op::Exec(spec)).await.unwrap();
        let start = Instant::now();
        let mut samples = Vec::new();
        let mut next = start + Duration::from_secs(5);
        let mut bytes = 0usize;
        loop {
            if Instant::now() >= next {
                samples.push((start.elapsed(), rss_kib(pid)));
                next += Duration::from_secs(5);
            }
            match tokio::time::timeout(Duration::from_millis(100), call.recv()).await {
                Ok(Ok(Some(CallEvent::Data { data, .. }))) => bytes += data.len(),
                Ok(Ok(Some(CallEvent::Reply(r)))) => {
                    match r {
                        Ok(Reply::Exited(r)) if r.truncated && r.timed_out => {}
                        other => {
                            eprintln!("unexpected end of `yes`: {other:?}");
                            ok = false;
                        }
                    }
                    break;
                }
                Ok(other) => panic!("{other:?}"),
                Err(_) => {}
            }
        }
        let rss: Vec<u64> = samples.iter().map(|(_, k)| *k).collect();
        println!(
            "yes for {:?} (streamed: {streamed}, {bytes} bytes delivered): agent VmRSS {before} KiB before, every 5 s (KiB) {rss:?}",
            start.elapsed()
        );
        // Flat while `yes` runs; the reply (with the buffered output) is
        // built once the timeout fires, so samples near the end only count
        // against the cap.
        let steady: Vec<u64> = samples.iter().filter(|(t, _)| *t + Duration::from_millis(300) < length).map(|(_, k)| *k).collect();
        let (Some(lo), Some(hi)) = (steady.iter().min(), steady.iter().max()) else {
            eprintln!("run longer than 5 s to get samples");
            ok = false;
            continue;
        };
        if hi - lo >= 256 {
            eprintln!("agent memory not flat (streamed: {streamed}): {rss:?}");
            ok = false;
        }
        if rss.iter().any(|k| *k >= before + 1024 + 2048) {
            eprintln!("agent holds more than the cap (streamed: {streamed}): {before} KiB before, {rss:?}");
            ok = false;
        }
    }
    drop(client);
    let _ = child.kill();
    let _ = child.wait();
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
