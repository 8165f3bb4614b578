//! Container mode, for real (root only): a busybox rootfs in an EROFS image
//! mounted straight from the file, the agent as PID 1 of new namespaces,
//! SetupContainer, what the sandbox can and cannot see, re-attachment after
//! the edge's channel dies, Shutdown, and a clean host afterwards.

mod common;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use common::*;
use dsec_agent_proto::client::{AgentClient, ClientError};
use dsec_agent_proto::{AgentState, ContainerSetup, ErrorKind, ExecResult, FileKind, Op, Reply};

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// Lazily unmounts on drop, so a failing test leaves no mount behind.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        // SAFETY: umount2 of a mount this test made.
        unsafe { libc::umount2(cpath(&self.0).as_ptr(), libc::MNT_DETACH) };
    }
}

/// A busybox root filesystem as an EROFS image, mounted read-only.
fn build_image(dir: &Path) -> Mount {
    let rootfs = dir.join("rootfs");
    for d in ["bin", "etc", "proc", "dev", "sys", "tmp", "root", "home/app"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    let list = StdCommand::new("/bin/busybox").arg("--list").output().unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
        }
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:App:/home/app:/bin/sh\n").unwrap();
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\napp:x:1000:\n").unwrap();
    std::fs::write(rootfs.join("etc/image-file"), "from the image\n").unwrap();
    let image = dir.join("image.erofs");
    let st = StdCommand::new("mkfs.erofs").arg("--quiet").arg(&image).arg(&rootfs).status().unwrap();
    assert!(st.success(), "mkfs.erofs failed");
    let mnt = dir.join("lower");
    std::fs::create_dir(&mnt).unwrap();
    // File-backed EROFS: mount(2) straight on the image file, no loop device.
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let r = unsafe { libc::mount(cpath(&image).as_ptr(), cpath(&mnt).as_ptr(), c"erofs".as_ptr(), libc::MS_RDONLY, std::ptr::null()) };
    assert_eq!(r, 0, "mount erofs: {}", std::io::Error::last_os_error());
    Mount(mnt)
}

async fn sh(c: &AgentClient, cmd: &str) -> ExecResult {
    match c.call(Op::Exec(shell(cmd))).await.unwrap() {
        Reply::Exited(r) => r,
        other => panic!("{other:?}"),
    }
}

/// pidfd_getfd(2) of `fd` in process `pid`: how a restarted edge picks up
/// the agent's re-attach socket.
fn grab_fd(pid: i32, fd: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open/pidfd_getfd return new fds we own (or -1).
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
        let got = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        if got < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(got as i32))
    }
}

fn is_socket(fd: &OwnedFd) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|s| rustix::fs::FileType::from_raw_mode(s.st_mode) == rustix::fs::FileType::Socket)
}

/// Waits until the agent parks a fresh socket at fd 4, then connects to it.
async fn reattach(agent_pid: i32) -> (AgentClient, dsec_agent_proto::AgentHello) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(fd) = grab_fd(agent_pid, 4) {
            if is_socket(&fd) {
                let s = StdUnixStream::from(fd);
                s.set_nonblocking(true).unwrap();
                return AgentClient::answer(tokio::net::UnixStream::from_std(s).unwrap()).await.unwrap();
            }
        }
        assert!(Instant::now() < deadline, "the agent never offered a re-attach socket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn mounts_mentioning(p: &Path) -> usize {
    let s = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    s.lines().filter(|l| l.contains(p.to_str().unwrap())).count()
}

fn smaps_rollup(pid: i32) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    s.lines().filter(|l| l.starts_with("Rss") || l.starts_with("Private") || l.starts_with("Anonymous")).collect::<Vec<_>>().join("; ")
}

#[tokio::test]
async fn container_mode_end_to_end() {
    if !is_root() {
        eprintln!("skipped: container mode needs root");
        return;
    }
    // Drop order (reverse of declaration): agent process, image mount, dir.
    let dir = tempfile::Builder::new().prefix("dsec-ctr-test-").tempdir().unwrap();
    let lower = build_image(dir.path());
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();

    let (ours, theirs) = StdUnixStream::pair().unwrap();
    let mut cmd = StdCommand::new("unshare");
    cmd.args(["--mount", "--pid", "--net", "--uts", "--ipc", "--fork", "--kill-child", "--propagation", "private"])
        .arg(agent_bin())
        .arg("container");
    cmd.env_clear().env("PATH", "/usr/bin:/bin").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
    pass_as_fd3(&mut cmd, &theirs);
    let child = ChildGuard(Some(cmd.spawn().unwrap()));
    drop(theirs);
    let unshare_pid = child.0.as_ref().unwrap().id() as i32;
    let hangup: OwnedFd = ours.try_clone().unwrap().into();
    ours.set_nonblocking(true).unwrap();
    let (client, hello) = AgentClient::answer(tokio::net::UnixStream::from_std(ours).unwrap()).await.unwrap();
    assert_eq!(hello.state, AgentState::Fresh);
    let agent_pid = children_of(unshare_pid)[0];

    // Anything but setup first is refused.
    assert!(matches!(client.call(Op::Ping).await, Err(ClientError::Agent(ref e)) if e.kind == ErrorKind::Protocol));

    let setup = ContainerSetup {
        sandbox_id: "sbx-1".into(),
        hostname: "sbx-test".into(),
        lower_dirs: vec![lower.0.to_string_lossy().into_owned()],
        scratch_mount: scratch.to_string_lossy().into_owned(),
        disk_limit_bytes: 8 << 20,
        sys_dir: String::new(),
        masked_paths: vec![
            "/proc/kcore".into(),
            "/proc/keys".into(),
            "/proc/timer_list".into(),
            "/sys/firmware".into(),
            "/proc/does-not-exist".into(),
        ],
        // (Missing paths, like /proc/sysrq-trigger on some kernels, are skipped.)
        readonly_paths: vec!["/proc/sys".into(), "/proc/sysrq-trigger".into(), "/proc/irq".into(), "/proc/bus".into()],
        syscall_filter: true,
        env: vec![("PATH".into(), "/bin".into()), ("IMAGE_VAR".into(), "1".into())],
        workdir: "/root".into(),
        default_user: "root".into(),
        resolv_conf: Some("nameserver 192.0.2.53\n".into()),
        scratch_source: None,
        volumes: vec![],
    };
    let t = Instant::now();
    assert_eq!(client.call(Op::SetupContainer(setup.clone())).await.unwrap(), Reply::Ready);
    eprintln!("SetupContainer round trip: {:?}", t.elapsed());
    tokio::time::sleep(Duration::from_millis(100)).await;
    eprintln!("idle agent after setup: {}", smaps_rollup(agent_pid));

    // PID 1, hostname, image env and workdir.
    let r = sh(&client, "echo $PPID; cat /proc/1/comm; hostname; echo $IMAGE_VAR; pwd; cat /etc/image-file").await;
    assert_eq!(text(&r.stdout), "1\ndsec-agent\nsbx-test\n1\n/root\nfrom the image\n", "{}", text(&r.stderr));
    // The resolver the setup named, in the sandbox's own root.
    assert_eq!(text(&sh(&client, "cat /etc/resolv.conf").await.stdout), "nameserver 192.0.2.53\n");

    // Writes land in the tmpfs upper layer, never in the image.
    sh(&client, "echo data > /newfile").await;
    assert!(!lower.0.join("newfile").exists());
    assert!(!dir.path().join("rootfs/newfile").exists());
    assert_eq!(std::fs::read_to_string(format!("/proc/{agent_pid}/root/newfile")).unwrap(), "data\n");
    assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0, "the scratch tmpfs must be private to the sandbox");

    // The disk limit is enforced by the kernel.
    let r = sh(&client, "dd if=/dev/zero of=/fill bs=1M count=20").await;
    assert_ne!(r.exit_code, Some(0));
    assert!(text(&r.stderr).contains("No space left"), "{}", text(&r.stderr));
    let mut spec = write_spec("/upload");
    spec.max_bytes = 1 << 30;
    let call = client.open(Op::WriteFile(spec)).await.unwrap();
    assert_eq!(upload(call, &noise(4 << 20, 5)).await.unwrap_err().kind, ErrorKind::NoSpace);
    let Reply::Dir(names) = client.call(Op::ListDir { path: "/".into() }).await.unwrap() else { panic!() };
    assert!(!names.iter().any(|e| e.name.starts_with(".dsec-upload") || e.name == "upload"), "an upload was left behind");
    sh(&client, "rm /fill").await;

    // Masked and read-only paths.
    // (Kernels without CONFIG_PROC_KCORE have no /proc/kcore: skipped.)
    let kcore = std::path::Path::new("/proc/kcore").exists();
    for p in ["/proc/keys", "/proc/timer_list"].into_iter().chain(kcore.then_some("/proc/kcore")) {
        let Reply::Stat(st) = client.call(Op::Stat { path: p.into() }).await.unwrap() else { panic!() };
        assert_eq!((st.kind, st.size), (FileKind::File, 0), "{p} is not the empty mask file");
    }
    let r = sh(&client, "cat /proc/keys /proc/timer_list | wc -c; ls -A /sys/firmware | wc -l; ls /proc/kcore 2>/dev/null | wc -c").await;
    let expect_kcore = if kcore { "12" } else { "0" };
    assert_eq!(text(&r.stdout).split_whitespace().collect::<Vec<_>>(), ["0", "0", expect_kcore]);
    let r =
        sh(&client, "touch /sys/x; echo x > /proc/sys/kernel/hostname; echo 1 > /proc/irq/default_smp_affinity; echo x > /proc/keys").await;
    let err = text(&r.stderr);
    assert_eq!(err.matches("Read-only file system").count(), 4, "{err}");

    // Only loopback, and it is up.
    let r = sh(&client, "tail -n +3 /proc/net/dev | cut -d: -f1; ip link").await;
    let out = text(&r.stdout);
    let ifaces: Vec<&str> = out.lines().take_while(|l| !l.contains(": <")).map(str::trim).collect();
    assert_eq!(ifaces, ["lo"], "{out}");
    assert!(out.contains("lo: <LOOPBACK,UP"), "{out}");

    // The sandbox cannot reach the agent's fds, memory or binary.
    // (Root may list /proc/1/fd's numbers, as in Docker, but not open them.)
    let r = sh(&client, "cat /proc/1/fd/3; cat /proc/1/exe | wc -c; cat /proc/1/environ; cat /proc/1/mem; readlink /proc/1/exe || echo no-exe; grep CapBnd /proc/self/status").await;
    let err = text(&r.stderr);
    assert_eq!(err.matches("Permission denied").count(), 4, "{err}");
    let out = text(&r.stdout);
    assert_eq!(out, "0\nno-exe\nCapBnd:\t00000000a00425fb\n");
    // The agent's own file operations do not follow magic links either.
    for p in ["/proc/1/fd/3", "/proc/self/root/etc/passwd", "/proc/1/exe"] {
        let e = client.call(Op::ReadFile { path: p.into(), offset: 0, limit: None }).await.unwrap_err();
        assert!(matches!(e, ClientError::Agent(ref e) if e.kind == ErrorKind::InvalidPath), "{p}: {e}");
    }

    // The system-call filter: inherited by every command, refusals audited.
    let r = sh(&client, "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status; mount -t tmpfs x /mnt").await;
    assert_eq!(text(&r.stdout), "NoNewPrivs:\t1\nSeccomp:\t2\n");
    let Reply::Audit(log) = client.call(Op::AuditEvents { after: 0 }).await.unwrap() else { panic!() };
    assert_eq!((log.total, log.dropped), (1, 0), "{log:?}");
    assert!(log.events[0].detail.starts_with("mount refused with EPERM"), "{log:?}");
    assert_eq!(log.events[0].kind, "syscall");

    // Users from the image.
    let mut spec = shell("id -u; echo $HOME");
    spec.user = Some("app".into());
    let Reply::Exited(r) = client.call(Op::Exec(spec)).await.unwrap() else { panic!() };
    assert_eq!(text(&r.stdout), "1000\n/home/app\n");

    // A session with busybox ash (its `export -p` differs from bash's).
    let Reply::Session { session_id } =
        client.call(Op::OpenSession(dsec_agent_proto::SessionSpec { env: vec![], cwd: None, user: None })).await.unwrap()
    else {
        panic!()
    };
    let mut spec = shell("cd /tmp && export X='a b' && echo ok");
    spec.session = Some(session_id.clone());
    let Reply::Exited(r) = client.call(Op::Exec(spec)).await.unwrap() else { panic!() };
    assert_eq!(text(&r.stdout), "ok\n");
    let mut spec = shell("pwd; echo \"$X\"");
    spec.session = Some(session_id.clone());
    let Reply::Exited(r) = client.call(Op::Exec(spec)).await.unwrap() else { panic!() };
    assert_eq!(text(&r.stdout), "/tmp\na b\n");
    client.call(Op::CloseSession { session_id }).await.unwrap();

    // Orphans are reaped by PID 1.
    sh(&client, "(sleep 0.3 &); true").await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    let r = sh(&client, "cat /proc/[0-9]*/stat 2>/dev/null | cut -d')' -f2 | cut -c2").await;
    assert!(!text(&r.stdout).contains('Z'), "zombies: {}", text(&r.stdout));
    assert!(children_of(agent_pid).iter().all(|&c| proc_state(c) != Some('Z')));

    // Idle memory of the agent, for the record (it trims its heap 0.5 s
    // after the last request).
    tokio::time::sleep(Duration::from_millis(800)).await;
    eprintln!("idle agent after work: {}", smaps_rollup(agent_pid));

    // --- The edge dies: the sandbox lives on and a new edge re-attaches.
    let r = sh(&client, "sleep 1000 >/dev/null 2>&1 & echo $!").await;
    let survivor = text(&r.stdout).trim().to_string();
    // SAFETY: shutdown(2) on our socket: the agent sees end of stream.
    unsafe { libc::shutdown(hangup.as_raw_fd(), libc::SHUT_RDWR) };
    drop(client);
    drop(hangup);
    for round in 0..2 {
        let (client, hello) = reattach(agent_pid).await;
        assert_eq!(hello.state, AgentState::Ready { sandbox_id: "sbx-1".into() }, "round {round}");
        let r = sh(&client, &format!("kill -0 {survivor} && echo alive; echo $PPID")).await;
        assert_eq!(text(&r.stdout), "alive\n1\n", "round {round}: {}", text(&r.stderr));
        // After the edge's Hello the agent no longer holds the edge's end.
        let deadline = Instant::now() + Duration::from_secs(5);
        while grab_fd(agent_pid, 4).is_ok_and(|fd| is_socket(&fd)) {
            assert!(Instant::now() < deadline, "fd 4 still holds the edge's socket");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if round == 0 {
            // Dying again is again seen as end of stream.
            drop(client);
            continue;
        }
        assert_eq!(client.call(Op::Shutdown).await.unwrap(), Reply::Done);
        tokio::time::timeout(Duration::from_secs(5), client.closed()).await.unwrap();
    }

    // Everything is gone: the namespace's processes, and its mounts (they
    // never were visible here).
    let mut child = child;
    let st = child.0.as_mut().unwrap().wait().unwrap();
    assert!(st.success(), "{st:?}");
    child.0 = None;
    assert_eq!(proc_state(agent_pid), None);
    assert_eq!(mounts_mentioning(&scratch), 0);
    drop(lower);
    assert_eq!(mounts_mentioning(dir.path()), 0);
}

/// A setup that cannot work fails with SetupFailed naming the step, and the
/// agent exits.
#[tokio::test]
async fn container_setup_failure_is_reported() {
    if !is_root() {
        return;
    }
    let dir = tempfile::Builder::new().prefix("dsec-ctr-test-").tempdir().unwrap();
    let (ours, theirs) = StdUnixStream::pair().unwrap();
    let mut cmd = StdCommand::new("unshare");
    cmd.args(["--mount", "--pid", "--net", "--uts", "--ipc", "--fork", "--kill-child", "--propagation", "private"])
        .arg(agent_bin())
        .arg("container");
    cmd.env_clear().stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    pass_as_fd3(&mut cmd, &theirs);
    let mut child = ChildGuard(Some(cmd.spawn().unwrap()));
    drop(theirs);
    ours.set_nonblocking(true).unwrap();
    let (client, _) = AgentClient::answer(tokio::net::UnixStream::from_std(ours).unwrap()).await.unwrap();
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let setup = ContainerSetup {
        sandbox_id: "bad".into(),
        hostname: "bad".into(),
        lower_dirs: vec![dir.path().join("no-such-lower").to_string_lossy().into_owned()],
        scratch_mount: scratch.to_string_lossy().into_owned(),
        disk_limit_bytes: 1 << 20,
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
    let e = client.call(Op::SetupContainer(setup)).await.unwrap_err();
    let ClientError::Agent(e) = e else { panic!("{e}") };
    assert_eq!(e.kind, ErrorKind::SetupFailed);
    assert!(e.message.starts_with("mount the overlay root: "), "{}", e.message);
    let st = child.0.as_mut().unwrap().wait().unwrap();
    assert!(!st.success());
    child.0 = None;
    assert_eq!(mounts_mentioning(dir.path()), 0);
}
