//! Test harness: the real agent binary on a socketpair, driven through
//! `AgentClient`.
#![allow(dead_code)]

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use dsec_agent_proto::client::{AgentClient, Call, CallEvent, CallOutput};
use dsec_agent_proto::{AgentError, AgentHello, Command, ExecResult, ExecSpec, Op, Reply, Stdin, WriteFileSpec};

/// The agent binary under test: the one cargo built for this test run, or
/// another build (say the static release binary) named by DSEC_AGENT_BIN.
pub fn agent_bin() -> String {
    std::env::var("DSEC_AGENT_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_dsec-agent").to_string())
}

/// Hands `sock` to a child as fd 3 (not CLOEXEC).
pub fn pass_as_fd3(cmd: &mut StdCommand, sock: &StdUnixStream) {
    let fd = sock.as_raw_fd();
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // dup2(3, 3) would keep CLOEXEC set: clear it instead.
            let r = if fd == 3 { libc::fcntl(3, libc::F_SETFD, 0) } else { libc::dup2(fd, 3) };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Kills a child process (SIGKILL) and waits for it; for Drop guards.
pub struct ChildGuard(pub Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One agent in plain mode over a temporary root directory.
pub struct TestAgent {
    pub client: AgentClient,
    pub hello: AgentHello,
    pub pid: i32,
    /// A second handle on our end of the socket, to hang up from Drop.
    hangup: OwnedFd,
    child: Option<Child>,
    // Dropped last: the root directory.
    pub dir: tempfile::TempDir,
}

impl TestAgent {
    pub async fn start() -> TestAgent {
        let dir = tempfile::Builder::new().prefix("dsec-agent-test-").tempdir().unwrap();
        Self::start_in(dir).await
    }

    pub async fn start_in(dir: tempfile::TempDir) -> TestAgent {
        Self::start_with(dir, |_| {}).await
    }

    /// Starts the agent after `customize` had its say on the command.
    pub async fn start_with(dir: tempfile::TempDir, customize: impl FnOnce(&mut StdCommand)) -> TestAgent {
        let (ours, theirs) = StdUnixStream::pair().unwrap();
        let mut cmd = StdCommand::new(agent_bin());
        cmd.args(["plain", "--root"]).arg(dir.path()).args(["--sandbox-id", "test"]);
        cmd.env_clear().env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin").env("LANG", "C");
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
        pass_as_fd3(&mut cmd, &theirs);
        customize(&mut cmd);
        let child = cmd.spawn().unwrap();
        drop(theirs);
        let hangup = ours.try_clone().unwrap().into();
        ours.set_nonblocking(true).unwrap();
        let stream = tokio::net::UnixStream::from_std(ours).unwrap();
        let (client, hello) = AgentClient::answer(stream).await.unwrap();
        TestAgent { client, hello, pid: child.id() as i32, hangup, child: Some(child), dir }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn host(&self, sandbox_path: &str) -> PathBuf {
        self.dir.path().join(sandbox_path.trim_start_matches('/'))
    }

    pub async fn exec(&self, spec: ExecSpec) -> ExecResult {
        match self.client.call(Op::Exec(spec)).await.unwrap() {
            Reply::Exited(r) => r,
            other => panic!("unexpected reply {other:?}"),
        }
    }

    pub async fn sh(&self, cmd: &str) -> ExecResult {
        self.exec(shell(cmd)).await
    }

    pub async fn try_exec(&self, spec: ExecSpec) -> Result<ExecResult, AgentError> {
        match self.client.call(Op::Exec(spec)).await {
            Ok(Reply::Exited(r)) => Ok(r),
            Ok(other) => panic!("unexpected reply {other:?}"),
            Err(dsec_agent_proto::client::ClientError::Agent(e)) => Err(e),
            Err(e) => panic!("channel error {e}"),
        }
    }

    pub async fn write_file(&self, spec: WriteFileSpec, data: &[u8]) -> Result<Reply, AgentError> {
        let call = self.client.open(Op::WriteFile(spec)).await.unwrap();
        upload(call, data).await
    }

    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, AgentError> {
        let call = self.client.open(Op::ReadFile { path: path.into(), offset: 0, limit: None }).await.unwrap();
        let (out, reply) = call.collect().await.unwrap();
        reply.map(|_| out.content)
    }

    /// Resident memory of the agent process, in KiB.
    pub fn rss_kib(&self) -> u64 {
        status_field(self.pid, "VmRSS:")
    }
}

/// Sends `data` then Eof, and waits for the reply (reading while sending,
/// since the reply may come early, e.g. TooLarge).
pub async fn upload(call: Call, data: &[u8]) -> Result<Reply, AgentError> {
    let (tx, mut rx) = call.into_split();
    let data = data.to_vec();
    let sender = tokio::spawn(async move {
        if tx.send_data(&data).await.is_ok() {
            let _ = tx.send_eof();
        }
        tx
    });
    let reply = loop {
        match rx.recv().await.unwrap() {
            Some(CallEvent::Reply(r)) => break r,
            Some(CallEvent::Data { .. }) => {}
            None => panic!("no reply"),
        }
    };
    drop(sender.await.unwrap());
    reply
}

pub fn status_field(pid: i32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        // Hang up: a plain agent kills what it started and exits on EOF.
        // SAFETY: shutdown(2) on a socket fd we own.
        unsafe { libc::shutdown(self.hangup.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }
}

pub fn shell(cmd: &str) -> ExecSpec {
    ExecSpec {
        command: Command::Shell(cmd.into()),
        env: vec![],
        cwd: None,
        user: None,
        stdin: Stdin::Null,
        stream_output: false,
        timeout_ms: Some(60_000),
        kill_grace_ms: 1000,
        max_output_bytes: 1 << 20,
        session: None,
    }
}

pub fn argv(args: &[&str]) -> ExecSpec {
    ExecSpec { command: Command::Argv(args.iter().map(|s| s.to_string()).collect()), ..shell("") }
}

pub fn write_spec(path: &str) -> WriteFileSpec {
    WriteFileSpec { path: path.into(), mode: 0o644, append: false, create_parents: false, max_bytes: 1 << 30, owner: None }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Everything a call produced, with a deadline.
pub async fn collect(call: Call, secs: u64) -> (CallOutput, Result<Reply, AgentError>) {
    tokio::time::timeout(Duration::from_secs(secs), call.collect()).await.expect("call timed out").unwrap()
}

/// Deterministic pseudo-random bytes (xorshift), so no RNG crate is needed.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Pids of the direct children of `pid`.
pub fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let s = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    out
}

/// The state letter of a process (`Z` for a zombie), if it exists.
pub fn proc_state(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = s.rsplit_once(')')?.1;
    after.trim_start().chars().next()
}

pub fn pid_alive(pid: i32) -> bool {
    matches!(proc_state(pid), Some(c) if c != 'Z')
}
