//! Running the external tools of a build (mkfs.erofs, debootstrap) with
//! their output relayed line by line and its tail kept for error messages.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::process::{Command, Stdio};

use rustix::pipe::{pipe_with, PipeFlags};

use super::BuildError;
use crate::progress::Progress;

/// Lines of output quoted in a `ToolFailed` error.
const TAIL_LINES: usize = 25;

pub(crate) struct Tool {
    pub name: &'static str,
    pub package: &'static str,
}

pub(crate) const MKFS_EROFS: Tool = Tool { name: "mkfs.erofs", package: "erofs-utils" };
pub(crate) const DEBOOTSTRAP: Tool = Tool { name: "debootstrap", package: "debootstrap" };
/// Runs a tool of the tree being built inside it (the judge image's g++).
pub(crate) const CHROOT: Tool = Tool { name: "chroot", package: "coreutils" };
/// Gives a command in a tree being built a private mount namespace (for
/// its /proc; the judge image's Java archives).
pub(crate) const UNSHARE: Tool = Tool { name: "unshare", package: "util-linux" };
pub(crate) const APT_GET: Tool = Tool { name: "apt-get", package: "apt" };
pub(crate) const DPKG_DEB: Tool = Tool { name: "dpkg-deb", package: "dpkg" };
pub(crate) const BUSYBOX: Tool = Tool { name: "busybox", package: "busybox-static" };
pub(crate) const MKFS_FAT: Tool = Tool { name: "mkfs.fat", package: "dosfstools" };
pub(crate) const SYSLINUX: Tool = Tool { name: "syslinux", package: "syslinux" };
pub(crate) const MTOOLS: Tool = Tool { name: "mcopy", package: "mtools" };
pub(crate) const MKFS_EXT4: Tool = Tool { name: "mkfs.ext4", package: "e2fsprogs" };
pub(crate) const QEMU_IMG: Tool = Tool { name: "qemu-img", package: "qemu-utils" };

/// Runs `cmd` to completion. stdout and stderr share one pipe so lines keep
/// their order; each non-empty line goes to `progress` (if any) as stage
/// text. Fails with the output tail when the tool exits non-zero.
pub(crate) fn run(tool: &Tool, mut cmd: Command, progress: Option<&dyn Progress>) -> Result<Vec<String>, BuildError> {
    let pipe_err = |e: io::Error| BuildError::Io { context: "creating a pipe for", path: tool.name.into(), source: e };
    // CLOEXEC: only the dup2'ed copies on fds 1 and 2 reach the child.
    let (read_end, write_end) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| pipe_err(e.into()))?;
    let write_clone = write_end.try_clone().map_err(pipe_err)?;
    cmd.stdin(Stdio::null()).stdout(Stdio::from(write_end)).stderr(Stdio::from(write_clone));
    let mut child = cmd.spawn().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            BuildError::ToolMissing { tool: tool.name, package: tool.package }
        } else {
            BuildError::Io { context: "starting", path: tool.name.into(), source: e }
        }
    })?;
    // The Command still holds the parent's copies of the write end; drop
    // them or the read below never sees end-of-file.
    drop(cmd);

    let mut lines = Vec::new();
    let mut tail = VecDeque::with_capacity(TAIL_LINES);
    let mut reader = BufReader::new(File::from(read_end));
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(BuildError::Io { context: "reading output of", path: tool.name.into(), source: e });
            }
        }
        // Tools that redraw a line end it with '\r'; keep the last redraw.
        let text = String::from_utf8_lossy(&buf);
        let Some(line) = text.split('\r').map(str::trim_end).rfind(|l| !l.is_empty()) else {
            continue;
        };
        if let Some(p) = progress {
            p.stage(line);
        }
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line.to_string());
        lines.push(line.to_string());
    }
    let status = child.wait().map_err(|e| BuildError::Io { context: "waiting for", path: tool.name.into(), source: e })?;
    if status.success() {
        return Ok(lines);
    }
    let output_tail = Vec::from(tail).join("\n");
    if output_tail.contains("No space left on device") {
        return Err(BuildError::DiskFull(format!("{} ran out of space", tool.name)));
    }
    Err(BuildError::ToolFailed { tool: tool.name, status: status.to_string(), output_tail })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::{ProgressEvent, ProgressFn};
    use std::sync::Mutex;

    #[test]
    fn relays_lines_and_reports_failure_with_tail() {
        let seen = Mutex::new(Vec::new());
        let progress = ProgressFn(|e: ProgressEvent<'_>| {
            if let ProgressEvent::Stage(s) = e {
                seen.lock().unwrap().push(s.to_string());
            }
        });
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo one; echo two >&2; printf 'x\\rthree\\n'; exit 3"]);
        let tool = Tool { name: "sh", package: "dash" };
        let err = run(&tool, cmd, Some(&progress)).unwrap_err();
        assert_eq!(*seen.lock().unwrap(), ["one", "two", "three"]);
        match err {
            BuildError::ToolFailed { tool, output_tail, status } => {
                assert_eq!(tool, "sh");
                assert_eq!(output_tail, "one\ntwo\nthree");
                assert!(status.contains('3'), "{status}");
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn missing_tool_is_typed() {
        let tool = Tool { name: "dsec-no-such-tool", package: "none" };
        let err = run(&tool, Command::new("dsec-no-such-tool"), None).unwrap_err();
        assert!(matches!(err, BuildError::ToolMissing { tool: "dsec-no-such-tool", .. }), "{err}");
    }
}
