//! One VM's QEMU process on the host: started inside its sandbox's cgroup
//! (and network namespace) before it execs, watched through its pidfd,
//! and asked, when it fails, what it and its guest last printed.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cmdline::VmFiles;
use super::{net, suspend};
use crate::backends::container::spawn::pidfd_open;
use crate::cgroup::Cgroups;
use crate::error::EdgeError;

/// Starts `qemu args` inside the cgroup of sandbox `id`, in a session of
/// its own, its output to `run_dir/qemu.log` (shared by both VM backends).
/// `incoming`, if given, becomes QEMU's fd `suspend::INCOMING_FD` (a
/// restore's saved state). With `net`, QEMU also joins the sandbox's
/// cgroup2 directory and network namespace before it execs (so no socket
/// of it is ever opened outside the sandbox's allowlist).
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn_qemu(
    cgroups: &Cgroups,
    qemu: &Path,
    id: &str,
    args: Vec<String>,
    run_dir: &Path,
    incoming: Option<&std::os::fd::OwnedFd>,
    net: Option<&net::QemuNet>,
) -> Result<(i32, std::os::fd::OwnedFd), EdgeError> {
    let fds: Vec<(&std::os::fd::OwnedFd, i32)> = incoming.map(|f| (f, suspend::INCOMING_FD)).into_iter().collect();
    spawn_qemu_fds(cgroups, qemu, id, args, run_dir, &fds, net)
}

/// `spawn_qemu` with descriptors QEMU inherits: each `(fd, n)` becomes
/// its fd `n` (at most 4 of them).
pub(crate) fn spawn_qemu_fds(
    cgroups: &Cgroups,
    qemu: &Path,
    id: &str,
    args: Vec<String>,
    run_dir: &Path,
    fds: &[(&std::os::fd::OwnedFd, i32)],
    net: Option<&net::QemuNet>,
) -> Result<(i32, std::os::fd::OwnedFd), EdgeError> {
    use std::os::fd::AsRawFd;
    if fds.len() > 4 {
        return Err(EdgeError::Invariant("QEMU inherits at most 4 descriptors"));
    }
    // Fixed-size and copied before the fork: the child only reads it.
    let mut inherit = [(-1i32, -1i32); 4];
    for (slot, (fd, n)) in inherit.iter_mut().zip(fds) {
        *slot = (fd.as_raw_fd(), *n);
    }
    let netns = net.map(|n| n.netns.as_raw_fd());
    let procs: Vec<CString> = cgroups
        .procs_files(id)
        .iter()
        .chain(net.map(|n| &n.procs))
        .filter_map(|p| CString::new(p.as_os_str().as_encoded_bytes()).ok())
        .collect();
    let log_path = run_dir.join("qemu.log");
    let log = std::fs::File::create(&log_path).map_err(EdgeError::io("creating", &log_path))?;
    let log2 = log.try_clone().map_err(EdgeError::sys("dup QEMU's log"))?;
    let mut cmd = std::process::Command::new(qemu);
    cmd.args(args).stdin(std::process::Stdio::null()).stdout(log).stderr(log2);
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (setsid, dup2, open, write, close, setns) on data
    // prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // First every source out of the way of the targets (one may
            // sit on another's number), then onto its target; dup2 clears
            // close-on-exec on the copy.
            let mut high = [-1i32; 4];
            for (h, &(fd, _)) in high.iter_mut().zip(&inherit) {
                if fd >= 0 {
                    *h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 16);
                    if *h < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            for (&h, &(_, n)) in high.iter().zip(&inherit) {
                if h >= 0 && libc::dup2(h, n) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for p in &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                libc::close(fd);
                if !ok {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(ns) = netns {
                if libc::setns(ns, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(EdgeError::io("starting", qemu))?;
    let pid = child.id() as i32;
    // Dropping the Child neither kills nor reaps: the exit watcher
    // reaps through the pidfd.
    drop(child);
    let pidfd = pidfd_open(pid).map_err(EdgeError::sys("pidfd_open of QEMU"))?;
    Ok((pid, pidfd))
}

/// The last lines QEMU and the guest printed, for an error message.
pub(crate) fn console_tail(files: &VmFiles) -> String {
    let mut out = String::new();
    for (what, path) in [("console", files.console_log()), ("qemu", files.run_dir.join("qemu.log"))] {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        // The agent's own words first (why it gave up), else the end
        // (a kernel's last messages).
        let agent: Vec<&str> = text.lines().filter(|l| l.contains("dsec-agent")).collect();
        let lines: Vec<&str> = if agent.is_empty() { text.lines().filter(|l| !l.trim().is_empty()).collect() } else { agent };
        let tail = &lines[lines.len().saturating_sub(6)..];
        if !tail.is_empty() {
            out.push_str(&format!("; {what}: {}", tail.join(" | ")));
        }
    }
    out
}

/// True once the process behind `pidfd` has exited.
pub fn process_exited(pidfd: &std::os::fd::OwnedFd) -> bool {
    wait_exit(pidfd, Duration::ZERO)
}

/// True once the process behind `pidfd` has exited (waits up to `wait`).
pub fn wait_exit(pidfd: &std::os::fd::OwnedFd, wait: Duration) -> bool {
    let mut p = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = wait.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: poll on one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// `find_program`, or why the backend is unavailable: `p` is missing,
/// and Debian's `package` installs it.
pub(crate) fn require_program(p: &Path, package: &'static str) -> Result<PathBuf, crate::backends::Unavailable> {
    find_program(p).ok_or_else(|| crate::backends::Unavailable::MissingProgram { program: p.to_path_buf(), package })
}

/// `p` if it names a file, else the first `p` on `PATH`.
fn find_program(p: &Path) -> Option<PathBuf> {
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(p)).find(|c| c.is_file())
}
