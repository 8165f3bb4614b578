//! Turning the fresh namespaces the edge cloned us into a sandbox.
//!
//! Direct system calls only (spawning mount(8) or ip(8) would cost 10-30x
//! more). The writable layer is a size-limited tmpfs mounted inside our own
//! mount namespace, so the host's mount table never grows with sandboxes and
//! the disk limit is enforced by the kernel (ENOSPC), not by polling.
//!
//! Order matters: the mounts that build the root happen before pivot_root;
//! masking and read-only remounts happen after it, so the paths the edge
//! names resolve inside the sandbox (an image's symlink cannot point a mask
//! at a host path).

use std::ffi::{CStr, CString};

use dsec_agent_proto::ContainerSetup;
use rustix::io::Errno;

pub use crate::setup_error::SetupError;
pub(crate) use crate::setup_error::{fail, Result};

fn errno() -> Errno {
    Errno::from_raw_os_error(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
}

pub(crate) fn cstr(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| SetupError { step: format!("path {s:?}"), errno: Errno::INVAL })
}

/// mount(2) with optional source, type and data.
pub(crate) fn mount(
    src: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> std::result::Result<(), Errno> {
    let p = |c: Option<&CStr>| c.map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is either null or a NUL-terminated string that
    // outlives the call.
    let r = unsafe { libc::mount(p(src), target.as_ptr(), p(fstype), flags, p(data).cast()) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

pub(crate) fn mkdir(path: &CStr, mode: libc::mode_t) -> std::result::Result<(), Errno> {
    // SAFETY: NUL-terminated path.
    match unsafe { libc::mkdir(path.as_ptr(), mode) } {
        0 => Ok(()),
        _ => match errno() {
            Errno::EXIST => Ok(()),
            e => Err(e),
        },
    }
}

/// Overlay options quote `\`, `:` and `,` with a backslash.
fn escape_overlay(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if matches!(c, '\\' | ':' | ',') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

pub fn overlay_options(lower: &[String], upper: &str, work: &str) -> String {
    let lower: Vec<String> = lower.iter().map(|l| escape_overlay(l)).collect();
    // index/redirect_dir/metacopy off: none of their features matter for a
    // throwaway upper, and each costs lookups on every copy-up. volatile:
    // no fsync per copied-up file (a `chown -R` over an image's tree copies
    // up every file); an upper never outlives its host's uptime anyway.
    format!(
        "lowerdir={},upperdir={},workdir={},index=off,redirect_dir=off,metacopy=off,volatile",
        lower.join(":"),
        escape_overlay(upper),
        escape_overlay(work)
    )
}

pub(crate) fn check_abs(what: &str, p: &str) -> Result<()> {
    if !p.starts_with('/') || p.split('/').any(|c| c == "..") {
        return Err(SetupError { step: format!("{what} {p:?} must be an absolute path without `..`"), errno: Errno::INVAL });
    }
    Ok(())
}

/// Returns an O_PATH fd of the overlay's upper directory (tamper.rs,
/// changes.rs).
pub fn setup(cfg: &ContainerSetup) -> Result<std::os::fd::OwnedFd> {
    check_abs("scratch_mount", &cfg.scratch_mount)?;
    if cfg.lower_dirs.is_empty() {
        return Err(SetupError { step: "lower_dirs is empty".into(), errno: Errno::INVAL });
    }
    for l in &cfg.lower_dirs {
        check_abs("lower dir", l)?;
    }
    for p in cfg.masked_paths.iter().chain(&cfg.readonly_paths) {
        check_abs("path", p)?;
    }

    // SAFETY: a new cgroup namespace changes neither our fd table nor our
    // memory, which is what makes unshare unsafe in general.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWCGROUP) }.map_err(fail("unshare cgroup namespace"))?;
    // Nothing we mount may propagate back to the host (or to other sandboxes
    // sharing a peer group with it).
    mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None).map_err(fail("make / private"))?;

    let scratch = cfg.scratch_mount.trim_end_matches('/');
    match &cfg.scratch_source {
        // The sandbox's subvolume on the node's disk, bounded by its quota.
        Some(src) => {
            check_abs("scratch_source", src)?;
            bind(&cstr(src)?, &cstr(scratch)?, libc::MS_NOSUID | libc::MS_NODEV)?;
        }
        None => {
            let size = cstr(&format!("size={},mode=0755", cfg.disk_limit_bytes.max(4096)))?;
            mount(Some(c"tmpfs"), &cstr(scratch)?, Some(c"tmpfs"), libc::MS_NOSUID | libc::MS_NODEV, Some(&size))
                .map_err(fail("mount the writable tmpfs"))?;
        }
    }
    // Detached copies of the volumes' directories, taken while their host
    // paths are reachable and placed after pivot_root, where their targets
    // resolve inside the sandbox's root (an image's symlink cannot send a
    // volume anywhere else).
    let volumes = cfg.volumes.iter().map(PreparedVolume::clone_of).collect::<Result<Vec<_>>>()?;
    let root = format!("{scratch}/root");
    let plan = RootPlan {
        scratch,
        root: &root,
        lower_dirs: &cfg.lower_dirs,
        sys_dir: &cfg.sys_dir,
        masked_paths: &cfg.masked_paths,
        readonly_paths: &cfg.readonly_paths,
        hostname: &cfg.hostname,
        volumes: &volumes,
    };
    let upper = assemble(&plan, pivot)?;
    if let Some(conf) = &cfg.resolv_conf {
        write_resolv_conf(conf)?;
    }
    Ok(upper)
}

/// Replaces the new root's /etc/resolv.conf with a file of `conf` (a
/// symlink the image had there is removed, never followed).
fn write_resolv_conf(conf: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let step = |what: &str| {
        let what = what.to_string();
        move |e: std::io::Error| SetupError::io(format!("{what} /etc/resolv.conf"), &e)
    };
    std::fs::create_dir_all("/etc").map_err(step("mkdir for"))?;
    match std::fs::remove_file("/etc/resolv.conf") {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(step("remove")(e)),
    }
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open("/etc/resolv.conf").map_err(step("create"))?;
    f.write_all(conf.as_bytes()).map_err(step("write"))
}

/// The root a sandbox gets, whatever holds its writable layer.
pub struct RootPlan<'a> {
    /// A mounted, empty, writable directory: the overlay's upper and work,
    /// /dev and /dev/shm live in it.
    pub scratch: &'a str,
    /// An empty directory where the merged root is mounted.
    pub root: &'a str,
    pub lower_dirs: &'a [String],
    /// A shared read-only sysfs to bind at /sys; empty: a sysfs of its own.
    pub sys_dir: &'a str,
    pub masked_paths: &'a [String],
    pub readonly_paths: &'a [String],
    pub hostname: &'a str,
    /// Named volumes, placed right after the root is entered.
    pub volumes: &'a [PreparedVolume],
}

/// A volume's directory as a detached mount, and where it goes.
pub struct PreparedVolume {
    tree: std::os::fd::OwnedFd,
    target: String,
    read_only: bool,
}

impl PreparedVolume {
    fn clone_of(v: &dsec_agent_proto::VolumeBind) -> Result<PreparedVolume> {
        check_abs("volume source", &v.source)?;
        check_abs("volume target", &v.target)?;
        if v.target.trim_end_matches('/').is_empty() {
            return Err(SetupError { step: "a volume cannot be mounted at /".into(), errno: Errno::INVAL });
        }
        let tree = rustix::mount::open_tree(
            rustix::fs::CWD,
            cstr(&v.source)?.as_c_str(),
            rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )
        .map_err(fail(format!("clone volume {}", v.source)))?;
        Ok(PreparedVolume { tree, target: v.target.clone(), read_only: v.read_only })
    }

    /// Moves the volume to its target (made if missing) in the entered
    /// root, then sets its flags: nosuid and nodev always, read-only if
    /// asked (the sandbox's root cannot remount it: no CAP_SYS_ADMIN).
    fn place(&self) -> Result<()> {
        std::fs::create_dir_all(&self.target).map_err(|e| SetupError::io(format!("mkdir volume target {}", self.target), &e))?;
        let target = cstr(&self.target)?;
        rustix::mount::move_mount(
            &self.tree,
            c"",
            rustix::fs::CWD,
            target.as_c_str(),
            rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .map_err(fail(format!("mount volume at {}", self.target)))?;
        let ro = if self.read_only { libc::MS_RDONLY } else { 0 };
        mount(None, &target, None, libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV | ro, None)
            .map_err(fail(format!("set the flags of volume {}", self.target)))
    }
}

/// Mounts the overlay root over `plan.lower_dirs` with its /proc, /dev and
/// /sys, enters it with `enter` (pivot_root in a container; a move of the
/// root mount in a VM, whose initramfs cannot be pivoted away), then masks,
/// hostname, loopback and the agent's own protections. Returns an O_PATH fd
/// of the overlay's upper directory.
pub fn assemble(plan: &RootPlan<'_>, enter: fn(&CStr) -> Result<()>) -> Result<std::os::fd::OwnedFd> {
    let (scratch, root) = (plan.scratch, plan.root.to_string());
    let (upper, work) = (format!("{scratch}/upper"), format!("{scratch}/work"));
    // /dev, /dev/shm and the masks are directories of this same tmpfs,
    // bind-mounted into place, not filesystems of their own: every
    // superblock registers a memcg-aware shrinker, and each memory cgroup
    // on the host carries state for every shrinker id ever handed out, so
    // superblocks per sandbox multiply into memory per sandbox (and into
    // creation time) as a node fills.
    let (devdir, shmdir, maskdir) = (format!("{scratch}/dev"), format!("{scratch}/shm"), format!("{scratch}/masked"));
    for (d, mode) in [(&upper, 0o755), (&work, 0o755), (&root, 0o755), (&devdir, 0o755), (&shmdir, 0o1777), (&maskdir, 0o555)] {
        mkdir(&cstr(d)?, mode).map_err(fail(format!("mkdir {d}")))?;
    }
    let maskfile = format!("{scratch}/masked-file");
    let maskfile_c = cstr(&maskfile)?;
    // A VM started from a snapshot finds the previous boot's file on its
    // writable disk: reuse it, emptied.
    drop(
        rustix::fs::open(
            maskfile_c.as_c_str(),
            rustix::fs::OFlags::CREATE | rustix::fs::OFlags::TRUNC | rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
            0o444.into(),
        )
        .map_err(fail("create the empty mask file"))?,
    );
    let opts = cstr(&overlay_options(plan.lower_dirs, &upper, &work))?;
    let root_c = cstr(&root)?;
    // nodev: a device node shipped in an image layer must not open the
    // host's device behind it. nosuid: a setuid binary in the image (or one
    // the sandbox's root makes) never raises anyone's privileges; with the
    // system-call filter, no_new_privs says the same for every path.
    mount(Some(c"overlay"), &root_c, Some(c"overlay"), libc::MS_NODEV | libc::MS_NOSUID, Some(&opts))
        .map_err(fail("mount the overlay root"))?;
    // Kept (close-on-exec, in a process nobody may ptrace) to see which
    // image files the sandbox has changed; its path is gone after pivot_root.
    let upper_fd = crate::changes::open_upper(&cstr(&upper)?).map_err(fail("open the upper directory"))?;
    // A copy at a well-known fd for the edge's `pack_diff` (see
    // reattach::UPPER_FD); best effort, since a sandbox that cannot be
    // packed is still a working sandbox.
    if let Ok(copy) = rustix::io::fcntl_dupfd_cloexec(&upper_fd, 0) {
        let _ = crate::reattach::park(copy, crate::reattach::UPPER_FD);
    }

    let at = |p: &str| cstr(&format!("{root}{p}"));
    for d in ["/proc", "/dev", "/sys"] {
        mkdir(&at(d)?, 0o755).map_err(fail(format!("mkdir {d}")))?;
    }
    mount(Some(c"proc"), &at("/proc")?, Some(c"proc"), libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, None)
        .map_err(fail("mount /proc"))?;
    dev(&root, &devdir, &shmdir)?;
    if plan.sys_dir.is_empty() {
        mount(Some(c"sysfs"), &at("/sys")?, Some(c"sysfs"), libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, None)
            .map_err(fail("mount /sys"))?;
    } else {
        // The node's shared sysfs: no filesystem of our own (a new sysfs
        // also scans every sysfs on the host when it mounts).
        check_abs("sys_dir", plan.sys_dir)?;
        bind(&cstr(plan.sys_dir)?, &at("/sys")?, libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC)?;
    }

    // The empty directory that hides masked directories and the empty file
    // that hides masked files: each made read-only once (binds of it
    // inherit that), and cloned into a detached mount tree because its
    // path is gone after pivot_root. The first masked directory (file)
    // receives that tree; the others are binds of the first. A file of our
    // own rather than /dev/null, so that opening a masked path can be told
    // from the sandbox's ordinary use of /dev/null (the edge watches both
    // with fanotify; see reattach::MASK_FILE_FD).
    let detached = |path: &CStr, what: &str| -> Result<std::os::fd::OwnedFd> {
        bind(path, path, libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC)?;
        rustix::mount::open_tree(
            rustix::fs::CWD,
            path,
            rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )
        .map_err(fail(format!("clone the empty mask {what}")))
    };
    let empty_dir = detached(&cstr(&maskdir)?, "directory")?;
    let empty_file = detached(&maskfile_c, "file")?;

    enter(&root_c)?;
    for v in plan.volumes {
        v.place()?;
    }

    let mut masks = Masks { dirs: MaskSource::Detached(empty_dir), files: MaskSource::Detached(empty_file) };
    for p in plan.masked_paths {
        masks.mask(p)?;
    }
    masks.park();
    for p in plan.readonly_paths {
        readonly(p)?;
    }
    rustix::system::sethostname(plan.hostname.as_bytes()).map_err(fail("sethostname"))?;
    // A namespace from the edge's pool has lo up already; one made by the
    // clone does not.
    dsec_spawn::set_loopback_up().map_err(|e| SetupError::io("bring up lo", &e))?;
    // The memcg OOM killer must never pick the agent: the sandbox would lose
    // its init and its channel. Children reset this to 0 before exec.
    // Lowering it needs CAP_SYS_RESOURCE; a host that withholds it from the
    // edge still gets a working sandbox, where the tiny agent is the OOM
    // killer's last choice anyway (it picks by size). Said once per sandbox
    // would flood the edge's log, so it is not said at all.
    match std::fs::write("/proc/self/oom_score_adj", b"-1000") {
        Ok(()) => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {}
        Err(e) => return Err(SetupError::io("set oom_score_adj", &e)),
    }
    // Not dumpable: /proc/1/{fd,mem,exe,environ} need ptrace access, which
    // the sandbox's root (no CAP_SYS_PTRACE) does not have. The edge has it,
    // for pidfd_getfd on re-attach.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable).map_err(fail("prctl(PR_SET_DUMPABLE)"))?;
    Ok(upper_fd)
}

/// Bind-mounts `src` on `target`, then sets exactly `flags` on the new
/// mount (a bind takes the source mount's flags; a remount replaces them).
fn bind(src: &CStr, target: &CStr, flags: libc::c_ulong) -> Result<()> {
    let what = || format!("bind {} on {}", src.to_string_lossy(), target.to_string_lossy());
    mount(Some(src), target, None, libc::MS_BIND, None).map_err(fail(what()))?;
    mount(None, target, None, libc::MS_BIND | libc::MS_REMOUNT | flags, None).map_err(fail(what()))
}

/// A minimal /dev: a directory of the sandbox's tmpfs with the usual
/// character devices (the only device nodes the sandbox can open: the rest
/// of its tree is nodev and its root cannot mknod), a private devpts
/// instance, and /dev/shm (counted in the disk limit).
fn dev(root: &str, devdir: &str, shmdir: &str) -> Result<()> {
    let d = |p: &str| cstr(&format!("{root}/dev{p}"));
    bind(&cstr(devdir)?, &d("")?, libc::MS_NOSUID)?;
    for (name, major, minor) in [("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0)] {
        let p = d(&format!("/{name}"))?;
        // A VM started from a snapshot finds the nodes of the previous
        // boot on its writable disk: make them anew.
        let _ = rustix::fs::unlink(p.as_c_str());
        // SAFETY: NUL-terminated path; the agent's umask is 0 so the mode is
        // exactly 0666.
        if unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(major, minor)) } != 0 {
            return Err(SetupError { step: format!("mknod /dev/{name}"), errno: errno() });
        }
    }
    mkdir(&d("/pts")?, 0o755).map_err(fail("mkdir /dev/pts"))?;
    mount(
        Some(c"devpts"),
        &d("/pts")?,
        Some(c"devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(c"newinstance,ptmxmode=0666,mode=0620,gid=5"),
    )
    .map_err(fail("mount /dev/pts"))?;
    mkdir(&d("/shm")?, 0o1777).map_err(fail("mkdir /dev/shm"))?;
    bind(&cstr(shmdir)?, &d("/shm")?, libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC)?;
    for (link, target) in [
        ("/ptmx", "pts/ptmx"),
        ("/fd", "/proc/self/fd"),
        ("/stdin", "/proc/self/fd/0"),
        ("/stdout", "/proc/self/fd/1"),
        ("/stderr", "/proc/self/fd/2"),
    ] {
        let path = d(link)?;
        let _ = rustix::fs::unlink(path.as_c_str());
        rustix::fs::symlink(target, path.as_c_str()).map_err(fail(format!("symlink /dev{link}")))?;
    }
    Ok(())
}

/// pivot_root(".", "."): the old root ends up stacked on the new one and is
/// detached at once; no directory for it is needed in the image.
fn pivot(root: &CStr) -> Result<()> {
    rustix::process::chdir(root).map_err(fail("chdir to the new root"))?;
    rustix::process::pivot_root(".", ".").map_err(fail("pivot_root"))?;
    rustix::mount::unmount(".", rustix::mount::UnmountFlags::DETACH).map_err(fail("detach the old root"))?;
    rustix::process::chdir("/").map_err(fail("chdir /"))?;
    Ok(())
}

/// Where the next mask of one kind comes from.
enum MaskSource {
    /// The detached empty file or directory, until the first masked path
    /// of its kind receives it.
    Detached(std::os::fd::OwnedFd),
    /// That first masked path: later masks are binds of it.
    At(CString),
    Taken,
}

impl MaskSource {
    fn mask(&mut self, target: CString, p: &str) -> Result<()> {
        match std::mem::replace(self, MaskSource::Taken) {
            MaskSource::At(first) => {
                let r = mount(Some(&first), &target, None, libc::MS_BIND, None).map_err(fail(format!("mask {p}")));
                *self = MaskSource::At(first);
                r
            }
            MaskSource::Detached(tree) => {
                rustix::mount::move_mount(
                    &tree,
                    c"",
                    rustix::fs::CWD,
                    target.as_c_str(),
                    rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
                )
                .map_err(fail(format!("mask {p}")))?;
                *self = MaskSource::At(target);
                Ok(())
            }
            MaskSource::Taken => Err(SetupError { step: format!("mask {p}: no mask left"), errno: Errno::INVAL }),
        }
    }

    /// Parks an O_PATH descriptor of the mask at `fd` for the edge (best
    /// effort: without it, masks still hide, only opens go unrecorded).
    fn park(&self, fd: std::os::raw::c_int) {
        if let MaskSource::At(first) = self {
            if let Ok(o) = rustix::fs::open(first.as_c_str(), rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC, 0.into()) {
                let _ = crate::reattach::park(o, fd);
            }
        }
    }
}

/// Hides paths: an empty read-only file over a file, an empty read-only
/// directory over a directory. Paths the kernel does not have are skipped.
struct Masks {
    dirs: MaskSource,
    files: MaskSource,
}

impl Masks {
    fn mask(&mut self, p: &str) -> Result<()> {
        let target = cstr(p)?;
        let st = match rustix::fs::stat(target.as_c_str()) {
            Ok(st) => st,
            Err(Errno::NOENT | Errno::NOTDIR) => return Ok(()),
            Err(e) => return Err(SetupError { step: format!("mask {p}"), errno: e }),
        };
        if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory {
            self.dirs.mask(target, p)
        } else {
            self.files.mask(target, p)
        }
    }

    fn park(&self) {
        self.files.park(crate::reattach::MASK_FILE_FD);
        self.dirs.park(crate::reattach::MASK_DIR_FD);
    }
}

/// Bind-mounts a path onto itself and remounts it read-only, keeping the
/// nosuid/nodev/noexec flags it had (a bind remount would otherwise drop
/// them).
fn readonly(p: &str) -> Result<()> {
    let target = cstr(p)?;
    match mount(Some(&target), &target, None, libc::MS_BIND | libc::MS_REC, None) {
        Ok(()) => {}
        Err(Errno::NOENT | Errno::NOTDIR) => return Ok(()),
        Err(e) => return Err(SetupError { step: format!("bind {p}"), errno: e }),
    }
    let vfs = rustix::fs::statvfs(target.as_c_str()).map_err(fail(format!("statvfs {p}")))?;
    let mut flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
    use rustix::fs::StatVfsMountFlags as F;
    for (have, ms) in [(F::NOSUID, libc::MS_NOSUID), (F::NODEV, libc::MS_NODEV), (F::NOEXEC, libc::MS_NOEXEC)] {
        if vfs.f_flag.contains(have) {
            flags |= ms;
        }
    }
    mount(None, &target, None, flags, None).map_err(fail(format!("remount {p} read-only")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_options_escape_separators() {
        let o = overlay_options(&["/l/a:b".into(), "/l/c,d".into()], "/s/upper", "/s/work");
        assert_eq!(o, "lowerdir=/l/a\\:b:/l/c\\,d,upperdir=/s/upper,workdir=/s/work,index=off,redirect_dir=off,metacopy=off,volatile");
    }

    #[test]
    fn relative_or_dotdot_paths_are_refused() {
        assert!(check_abs("x", "/ok/path").is_ok());
        assert!(check_abs("x", "rel").is_err());
        assert!(check_abs("x", "/a/../b").is_err());
    }
}
