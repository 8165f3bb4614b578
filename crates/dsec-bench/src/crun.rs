//! The peer side: crun 1.8 driven the way a crun-based platform would drive
//! it, on the same EROFS layer dsec uses.
//!
//! Once: the image's EROFS blob is mounted read-only with the file-backed
//! EROFS mount (mount(2) straight on the blob file, no loop device), like
//! dsec's layer mounts. Per container: a size-limited tmpfs (the writable
//! layer, like dsec's), an overlay of the EROFS layer under it as the rootfs,
//! a config.json with the same namespaces (mnt, pid, ipc, uts, net, cgroup)
//! and the same cgroup limits (memory, cpu quota, pids), then
//! `crun run -d`; `crun exec`; `crun delete -f` + unmount.
//!
//! All mounts are made with direct syscalls (as fast as it gets) inside the
//! generator's private mount namespace (see main.rs), so they vanish with it
//! even if the generator is killed; crun state lives under our own --root.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub memory_mb: u64,
    pub cpu_cores: f64,
    pub disk_mb: u64,
    pub pids: u64,
}

pub struct Crun {
    bin: PathBuf,
    /// Our work dir: bundles, state, the EROFS mount point.
    work: PathBuf,
    state: PathBuf,
    lower: PathBuf,
    /// cgroup v1 parent (relative to each hierarchy root).
    pub cgroup_parent: String,
    template: Value,
    limits: Limits,
}

/// Where the time of one `create` went.
#[derive(Debug, Clone, Copy, Default)]
pub struct CreateTimes {
    /// tmpfs + overlay mounts and config.json.
    pub prep: Duration,
    /// `crun run -d` until it returned.
    pub run: Duration,
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).expect("paths have no NUL")
}

fn mount(src: &str, target: &Path, fstype: &str, flags: libc::c_ulong, data: Option<&str>) -> std::io::Result<()> {
    let src = CString::new(src).unwrap();
    let fstype = CString::new(fstype).unwrap();
    let data = data.map(|d| CString::new(d).unwrap());
    let t = cstr(target);
    // SAFETY: NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(src.as_ptr(), t.as_ptr(), fstype.as_ptr(), flags, data.as_ref().map_or(std::ptr::null(), |d| d.as_ptr().cast()))
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn umount(target: &Path) {
    let t = cstr(target);
    // SAFETY: NUL-terminated path.
    unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
}

/// Makes this process's mount namespace private. Must run before any other
/// thread exists (unshare(CLONE_NEWNS) refuses a multi-threaded process).
pub fn private_mount_namespace() -> anyhow::Result<()> {
    // SAFETY: plain syscalls on no memory of ours.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            bail!("unshare(CLONE_NEWNS): {}", std::io::Error::last_os_error());
        }
        if libc::mount(std::ptr::null(), c"/".as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0 {
            bail!("making / private: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The EROFS blob of an image's base layer, from its manifest.
pub fn image_blob(images_dir: &Path, image: &str) -> anyhow::Result<PathBuf> {
    let (name, tag) = image.split_once(':').unwrap_or((image, "latest"));
    let m = images_dir.join("manifests").join(format!("{name}@{tag}.json"));
    let v: Value = serde_json::from_slice(&std::fs::read(&m).with_context(|| format!("reading {}", m.display()))?)?;
    let layers = v["layers"].as_array().context("manifest without layers")?;
    if layers.len() != 1 {
        bail!("{image}: expected one layer, found {}", layers.len());
    }
    let digest = layers[0]["digest"].as_str().context("layer without digest")?;
    let hex = digest.strip_prefix("sha256:").context("digest is not sha256")?;
    Ok(images_dir.join("blobs").join("sha256").join(format!("{hex}.erofs")))
}

impl Crun {
    /// Mounts the image's EROFS blob at WORK/lower and prepares the config
    /// template. `init` is the container's long-running PID 1.
    pub fn setup(work: &Path, blob: &Path, limits: Limits, init: &[&str]) -> anyhow::Result<Crun> {
        let bin = which("crun").context("crun not found in PATH (apt-get install crun)")?;
        let state = work.join("state");
        let lower = work.join("lower");
        for d in [&state, &lower, &work.join("b")] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        mount(&blob.display().to_string(), &lower, "erofs", libc::MS_RDONLY, None)
            .with_context(|| format!("file-backed EROFS mount of {}", blob.display()))?;
        let cgroup_parent = format!("dsecbench-crun-{}", std::process::id());
        let quota = (limits.cpu_cores * 100_000.0).round().max(1000.0) as i64;
        let template = json!({
            "ociVersion": "1.0.0",
            "process": {
                "terminal": false,
                "user": {"uid": 0, "gid": 0},
                "args": init,
                "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
                "cwd": "/",
                "capabilities": {
                    "bounding": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
                    "effective": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
                    "permitted": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
                    "ambient": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
                },
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
                "noNewPrivileges": true
            },
            "root": {"path": "rootfs", "readonly": false},
            "hostname": "crun",
            // The same file systems dsec's agent mounts: /proc, a small /dev
            // tmpfs with devpts and /dev/shm, read-only /sys.
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=64k"]},
                {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
                {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
                {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}
            ],
            "linux": {
                "resources": {
                    "devices": [{"allow": false, "access": "rwm"}],
                    "memory": {"limit": (limits.memory_mb << 20) as i64},
                    "cpu": {"quota": quota, "period": 100_000},
                    "pids": {"limit": limits.pids as i64}
                },
                "cgroupsPath": "",
                "namespaces": [
                    {"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "cgroup"}
                ],
                "maskedPaths": [
                    "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                    "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi", "/proc/kallsyms",
                    "/proc/kpagecgroup", "/proc/kpageflags", "/proc/kpagecount", "/proc/sysrq-trigger"
                ],
                "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"]
            }
        });
        Ok(Crun { bin, work: work.to_path_buf(), state, lower, cgroup_parent, template, limits })
    }

    fn bundle(&self, id: &str) -> PathBuf {
        self.work.join("b").join(id)
    }

    fn cmd(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.bin);
        c.arg("--root").arg(&self.state).stdin(Stdio::null()).stdout(Stdio::null());
        c
    }

    /// Writable layer + rootfs overlay + config, then `crun run -d`.
    pub async fn create(&self, id: &str) -> anyhow::Result<CreateTimes> {
        let t0 = Instant::now();
        let b = self.bundle(id);
        let (up, rootfs) = (b.join("up"), b.join("rootfs"));
        std::fs::create_dir_all(&up)?;
        std::fs::create_dir_all(&rootfs)?;
        mount("tmpfs", &up, "tmpfs", libc::MS_NOSUID | libc::MS_NODEV, Some(&format!("size={}m,mode=0755", self.limits.disk_mb)))
            .context("mounting the writable tmpfs")?;
        std::fs::create_dir(up.join("u"))?;
        std::fs::create_dir(up.join("w"))?;
        let opts = format!(
            "lowerdir={},upperdir={},workdir={},index=off,redirect_dir=off,metacopy=off",
            self.lower.display(),
            up.join("u").display(),
            up.join("w").display()
        );
        mount("overlay", &rootfs, "overlay", 0, Some(&opts)).context("mounting the overlay rootfs")?;
        let mut cfg = self.template.clone();
        cfg["hostname"] = json!(id);
        cfg["linux"]["cgroupsPath"] = json!(format!("/{}/{id}", self.cgroup_parent));
        std::fs::write(b.join("config.json"), serde_json::to_vec(&cfg)?)?;
        let prep = t0.elapsed();
        let t1 = Instant::now();
        let errf = std::fs::File::create(b.join("crun.stderr"))?;
        let st = self.cmd().arg("run").arg("-d").arg("-b").arg(&b).arg(id).stderr(errf).status().await?;
        let run = t1.elapsed();
        if !st.success() {
            let msg = std::fs::read_to_string(b.join("crun.stderr")).unwrap_or_default();
            bail!("crun run -d {id}: {st}: {}", msg.trim());
        }
        Ok(CreateTimes { prep, run })
    }

    /// `crun exec ID argv...`, waited for.
    pub async fn exec(&self, id: &str, argv: &[&str]) -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        let out = self.cmd().arg("exec").arg(id).args(argv).stderr(Stdio::piped()).output().await?;
        let d = t0.elapsed();
        if !out.status.success() {
            bail!("crun exec {id}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(d)
    }

    /// `crun delete -f` then unmount and remove the bundle.
    pub async fn delete(&self, id: &str) -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        let out = self.cmd().arg("delete").arg("-f").arg(id).stderr(Stdio::piped()).output().await?;
        let b = self.bundle(id);
        umount(&b.join("rootfs"));
        umount(&b.join("up"));
        let d = t0.elapsed();
        let _ = std::fs::remove_dir_all(&b);
        if !out.status.success() {
            bail!("crun delete -f {id}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(d)
    }

    /// Deletes whatever containers are left and unmounts the layer.
    pub async fn teardown(&self) {
        if let Ok(rd) = std::fs::read_dir(&self.state) {
            for e in rd.flatten() {
                let id = e.file_name().to_string_lossy().to_string();
                let _ = self.delete(&id).await;
            }
        }
        if let Ok(rd) = std::fs::read_dir(self.work.join("b")) {
            for e in rd.flatten() {
                umount(&e.path().join("rootfs"));
                umount(&e.path().join("up"));
            }
        }
        umount(&self.lower);
        if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
            for h in rd.flatten() {
                let p = h.path().join(&self.cgroup_parent);
                if let Ok(rd2) = std::fs::read_dir(&p) {
                    for c in rd2.flatten() {
                        if c.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                            let _ = std::fs::remove_dir(c.path());
                        }
                    }
                }
                let _ = std::fs::remove_dir(&p);
            }
        }
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

/// `crun --version`, first line.
pub fn version() -> String {
    std::process::Command::new("crun")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "crun (unknown version)".into())
}
