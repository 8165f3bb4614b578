//! The container backend: namespaces + cgroups + overlayfs over EROFS
//! layers, with the guest agent as PID 1.
//!
//! The edge does the host side (cgroup, clone into new namespaces, attach);
//! the agent does the inside (mounts, pivot_root, hostname, loopback) when it
//! receives `SetupContainer`, because mounts made inside the sandbox's own
//! mount namespace keep the host's mount table small: otherwise every new
//! namespace would copy every earlier sandbox's mounts and creation would
//! slow down as the node fills.

pub(crate) mod mask_watch;
mod netns_pool;
pub mod policy;
pub mod spawn;
mod sysfs;

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dsec_agent_proto::client::AgentClient;
use dsec_agent_proto::{AgentState, ContainerSetup, Op, Reply};

use crate::backends::instance::Instance;
use crate::cgroup::Cgroups;
use crate::disk::NodeDisk;
use crate::error::EdgeError;
use crate::images::RootfsPlan;
use crate::model::SandboxSpec;

/// The fd at which a container agent keeps the spare end of a fresh channel
/// after its edge went away, for a restarted edge to take with pidfd_getfd.
pub const AGENT_REATTACH_FD: i32 = 4;

pub struct ContainerBackend {
    cgroups: Arc<Cgroups>,
    spawner: spawn::Spawner,
    /// Empty host directory the agent mounts its tmpfs on, privately.
    scratch_dir: PathBuf,
    /// The node's shared read-only sysfs.
    sysfs: sysfs::SharedSysfs,
    setup_timeout: Duration,
    /// Sandboxes get the system-call filter (EdgeConfig::syscall_filter).
    syscall_filter: bool,
    /// Per-sandbox egress (a sandbox created with network rules).
    egress: Option<dsec_net::Egress>,
    /// Turns opens of masked paths into audit events (where fanotify works).
    masks: Option<Arc<mask_watch::MaskWatch>>,
    /// Loopback-only network namespaces made ahead, for sandboxes without
    /// network rules (None if its thread could not start).
    netns_pool: Option<netns_pool::NetnsPool>,
    /// The node's disk of writable layers (None: each sandbox's layer is a
    /// tmpfs in its memory).
    disk: Option<Arc<NodeDisk>>,
}

impl ContainerBackend {
    /// `agent_exec`: each agent execs the agent binary afresh instead of
    /// being forked from the spawn helper (a fresh address-space layout per
    /// agent, ~0.4 ms more CPU per creation).
    pub fn new(
        cgroups: Arc<Cgroups>,
        agent_path: &Path,
        state_dir: &Path,
        setup_timeout: Duration,
        agent_exec: bool,
    ) -> Result<Self, EdgeError> {
        let scratch_dir = state_dir.join("scratch");
        // Everything that can fail comes before the node's sysfs mount.
        if !agent_path.is_file() {
            return Err(EdgeError::NodeSetup(format!("guest agent binary not found at {}", agent_path.display())));
        }
        std::fs::create_dir_all(&scratch_dir).map_err(EdgeError::io("creating", &scratch_dir))?;
        let agent_path = CString::new(agent_path.as_os_str().as_encoded_bytes())
            .map_err(|_| EdgeError::NodeSetup("the agent's path contains NUL".into()))?;
        let spawner = spawn::Spawner::new(agent_path, agent_exec).map_err(EdgeError::sys("starting the spawn helper"))?;
        let sysfs = sysfs::ensure(&state_dir.join("sys"))?;
        Ok(Self {
            cgroups,
            spawner,
            scratch_dir,
            sysfs,
            setup_timeout,
            syscall_filter: true,
            egress: None,
            masks: None,
            netns_pool: None,
            disk: None,
        })
    }

    /// Starts sandboxes without the system-call filter (to measure it).
    pub fn without_syscall_filter(mut self) -> Self {
        self.syscall_filter = false;
        self
    }

    /// Keeps `size` loopback-only network namespaces ready for sandboxes
    /// without network rules (0: each makes its own in its clone).
    pub fn with_netns_pool(mut self, size: usize) -> Self {
        self.netns_pool = (size > 0)
            .then(|| netns_pool::NetnsPool::start(size))
            .transpose()
            .inspect_err(|e| tracing::warn!(error = %e, "no pool of network namespaces; sandboxes make their own"))
            .ok()
            .flatten();
        self
    }

    /// Keeps writable layers (and volumes) on the node's disk.
    pub fn with_disk(mut self, disk: Arc<NodeDisk>) -> Self {
        self.disk = Some(disk);
        self
    }

    /// Gives sandboxes created with network rules a veth and an allowlist.
    pub fn with_egress(mut self, egress: dsec_net::Egress) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Audits opens of masked paths through the node's fanotify group.
    pub(crate) fn with_mask_watch(mut self, masks: Arc<mask_watch::MaskWatch>) -> Self {
        self.masks = Some(masks);
        self
    }

    pub fn cgroups(&self) -> &Arc<Cgroups> {
        &self.cgroups
    }

    /// Creates the cgroup, starts the agent in new namespaces and has it set
    /// up the root filesystem. On any failure everything made so far is
    /// undone before the error returns.
    /// `durable` resolves when the sandbox's record is committed; no
    /// process is started before it has.
    pub async fn start_container(
        &self,
        id: &str,
        spec: &SandboxSpec,
        plan: &RootfsPlan,
        durable: impl std::future::Future<Output = Result<(), crate::store::StoreError>>,
    ) -> Result<Instance, EdgeError> {
        let t0 = std::time::Instant::now();
        self.cgroups.create(id, &crate::backends::cgroup_limits(spec, 0))?;
        // The writable layer on disk: a subvolume of its own, bounded by
        // the sandbox's disk limit (two ioctls). Without one, the agent
        // mounts a tmpfs.
        let disk = self.disk.as_ref().filter(|_| !spec.writable_layer_in_memory);
        let layer = match disk.map(|d| d.create_layer(id, spec.limits.disk_mb << 20)).transpose() {
            Ok(l) => l,
            Err(e) => {
                let _ = self.cgroups.remove(id);
                return Err(e.into());
            }
        };
        let remove_layer = || {
            if let Some(d) = disk {
                if let Err(e) = d.remove_layer(id) {
                    tracing::warn!(error = %e, id, "could not remove a writable layer (the reaper retries)");
                }
            }
        };
        let t_cg = t0.elapsed();
        if let Err(e) = durable.await {
            let _ = self.cgroups.remove(id);
            remove_layer();
            return Err(EdgeError::Store(e));
        }
        // A sandbox with network rules joins a warm namespace with a veth;
        // the others get a fresh loopback-only one from clone.
        let egress = self.egress.as_ref().filter(|_| !spec.network_rules.is_empty());
        let warm = match egress.map(|e| e.take()).transpose() {
            Ok(w) => w,
            Err(e) => {
                let _ = self.cgroups.remove(id);
                remove_layer();
                return Err(e.into());
            }
        };
        // The others join a loopback-only one made ahead, or make their own
        // in the clone when none is ready.
        let pooled = if warm.is_none() { self.netns_pool.as_ref().and_then(|p| p.take()) } else { None };
        let joined = warm.as_ref().map(|w| &w.netns).or(pooled.as_ref());
        let spawned = match joined {
            None => self.spawner.spawn(spawn::CONTAINER_NAMESPACES),
            Some(netns) => {
                use std::os::fd::AsFd;
                self.spawner.spawn_in(spawn::CONTAINER_NAMESPACES & !libc::CLONE_NEWNET, Some(netns.as_fd()))
            }
        };
        // The agent holds the namespace now (or the spawn failed and it
        // goes; a pooled one is never reused).
        drop(pooled);
        let slot = warm.as_ref().map(|w| w.slot);
        let spawned = match spawned {
            Ok(s) => s,
            Err(e) => {
                let _ = self.cgroups.remove(id);
                remove_layer();
                if let (Some(eg), Some(w)) = (egress, warm) {
                    eg.give_back(w);
                }
                return Err(EdgeError::SandboxSys { id: id.to_string(), call: "start the guest agent", source: e });
            }
        };
        // The agent holds the namespace now.
        drop(warm);
        let t_spawn = t0.elapsed();
        let pid = spawned.pid;
        let pidfd = spawned.pidfd;
        let undo = |pidfd: &OwnedFd| {
            let _ = spawn::pidfd_kill(pidfd, libc::SIGKILL);
            spawn::reap(pidfd);
            self.cgroups.kill_all(id);
            let _ = self.cgroups.remove(id);
            remove_layer();
            if let Some(eg) = egress {
                eg.release(id);
            }
        };
        if let Err(e) = self.cgroups.attach(id, pid) {
            undo(&pidfd);
            return Err(e.into());
        }
        // The allowlist is attached while the agent sets the root up: the
        // agent starts nothing before it answers Ready, and nothing of the
        // sandbox's own runs before this creation returns, after both.
        let attaching = match (egress, slot) {
            (Some(eg), Some(slot)) => {
                let (eg, id, rules) = (eg.clone(), id.to_string(), spec.network_rules.clone());
                Some(tokio::task::spawn_blocking(move || eg.attach(&id, pid, slot, &rules)))
            }
            _ => None,
        };
        let resolv_conf = egress.map(|e| e.resolv_conf());
        let t_attach = t0.elapsed();
        let setup = ContainerSetup {
            sandbox_id: id.to_string(),
            hostname: crate::ids::short_id(id).to_string(),
            lower_dirs: plan.lower_dirs.iter().map(|p| p.display().to_string()).collect(),
            scratch_mount: self.scratch_dir.display().to_string(),
            disk_limit_bytes: writable_layer_bytes(spec.limits.disk_mb, spec.limits.memory_mb),
            scratch_source: layer.map(|l| l.display().to_string()),
            volumes: plan
                .volumes
                .iter()
                .map(|v| dsec_agent_proto::VolumeBind {
                    source: v.source.display().to_string(),
                    target: v.target.clone(),
                    read_only: v.read_only,
                })
                .collect(),
            sys_dir: self.sysfs.dir.display().to_string(),
            masked_paths: policy::MASKED_PATHS.iter().map(|s| s.to_string()).collect(),
            readonly_paths: policy::READONLY_PATHS.iter().map(|s| s.to_string()).collect(),
            syscall_filter: self.syscall_filter,
            env: merged_env(&plan.env, spec),
            workdir: spec.workdir.clone().unwrap_or_else(|| plan.workdir.clone()),
            default_user: spec.init_user.clone(),
            resolv_conf,
        };
        let channel = spawned.channel;
        let handshake = async move {
            channel.set_nonblocking(true).map_err(EdgeError::sys("set the agent's channel non-blocking"))?;
            let stream = tokio::net::UnixStream::from_std(channel).map_err(EdgeError::sys("register the agent's channel"))?;
            let (agent, _hello) = AgentClient::answer(stream).await?;
            let t_hello = t0.elapsed();
            match agent.call(Op::SetupContainer(setup)).await? {
                Reply::Ready => {}
                other => return Err(EdgeError::SetupFailed(format!("unexpected reply to setup: {other:?}"))),
            }
            Ok((agent, t_hello))
        };
        let outcome = tokio::time::timeout(self.setup_timeout, handshake).await;
        let t_setup = t0.elapsed();
        // Whatever the handshake did, the attach ends before anything else.
        let attached = match attaching {
            Some(task) => task.await.map_err(EdgeError::task("allowlist attach")).and_then(|r| r.map_err(EdgeError::from)),
            None => Ok(()),
        };
        if let Err(e) = attached {
            undo(&pidfd);
            return Err(e);
        }
        match outcome {
            Ok(Ok((agent, t_hello))) => {
                if let Some(m) = &self.masks {
                    m.watch(id, &pidfd);
                }
                tracing::debug!(target: "dsec_edge::create_phases", cg = t_cg.as_micros() as u64, spawn = t_spawn.as_micros() as u64, attach = t_attach.as_micros() as u64, hello = t_hello.as_micros() as u64, setup = t_setup.as_micros() as u64, watch = t0.elapsed().as_micros() as u64, "container phases");
                Ok(Instance::new(pid, pidfd, agent))
            }
            Ok(Err(e)) => {
                undo(&pidfd);
                Err(match e {
                    // The request named a user the image lacks: the
                    // caller's mistake, reported as such.
                    EdgeError::Agent(a) if a.kind == dsec_agent_proto::ErrorKind::UnknownUser => EdgeError::Agent(a),
                    EdgeError::Agent(a) => EdgeError::SetupFailed(a.message),
                    other => other,
                })
            }
            Err(_) => {
                undo(&pidfd);
                Err(EdgeError::Timeout(format!("sandbox setup took longer than {:?}", self.setup_timeout)))
            }
        }
    }

    /// Re-attaches to a running agent after an edge restart.
    pub async fn adopt(&self, id: &str, pid: i32) -> Result<Instance, EdgeError> {
        if !self.cgroups.contains(id, pid) {
            return Err(EdgeError::ProcessReplaced { id: id.to_string(), pid, what: "agent" });
        }
        let pidfd = spawn::pidfd_open(pid).map_err(EdgeError::sys("pidfd_open of the agent"))?;
        // The agent parks a fresh channel at fd 4 only once it has seen its
        // old edge go away; right after a crash (or a thaw) it may not have
        // run yet, and fd 4 is still its placeholder: wait a little for it.
        let deadline = std::time::Instant::now() + REATTACH_WAIT;
        let fd = loop {
            let fd =
                spawn::pidfd_getfd(&pidfd, AGENT_REATTACH_FD).map_err(EdgeError::sandbox_sys(id, "take the agent's re-attach channel"))?;
            if is_socket(&fd) {
                break fd;
            }
            if std::time::Instant::now() >= deadline {
                return Err(EdgeError::AgentUnavailable(format!(
                    "the agent of {id} offered no re-attach channel within {REATTACH_WAIT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let std_stream = std::os::unix::net::UnixStream::from(fd);
        std_stream.set_nonblocking(true).map_err(EdgeError::sys("set the agent's channel non-blocking"))?;
        let stream = tokio::net::UnixStream::from_std(std_stream).map_err(EdgeError::sys("register the agent's channel"))?;
        let connect = AgentClient::answer(stream);
        let (agent, hello) = tokio::time::timeout(self.setup_timeout, connect)
            .await
            .map_err(|_| EdgeError::Timeout("re-attaching to the agent".into()))??;
        match hello.state {
            AgentState::Ready { sandbox_id } if sandbox_id == id => {
                if let Some(eg) = &self.egress {
                    eg.adopt(id)?;
                }
                if let Some(m) = &self.masks {
                    m.watch(id, &pidfd);
                }
                Ok(Instance::new(pid, pidfd, agent))
            }
            other => Err(EdgeError::UnexpectedReply { peer: "the agent", op: "re-attach", reply: format!("{other:?}") }),
        }
    }
}

impl crate::backends::Backend for ContainerBackend {
    fn kind(&self) -> crate::model::BackendKind {
        crate::model::BackendKind::Container
    }

    fn start<'a>(
        &'a self,
        id: &'a str,
        spec: &'a SandboxSpec,
        plan: &'a RootfsPlan,
        durable: crate::backends::Durable,
    ) -> crate::backends::BoxFuture<'a, Result<Instance, EdgeError>> {
        Box::pin(self.start_container(id, spec, plan, durable))
    }

    fn adopt<'a>(&'a self, id: &'a str, pid: i32) -> crate::backends::BoxFuture<'a, Result<Instance, EdgeError>> {
        Box::pin(ContainerBackend::adopt(self, id, pid))
    }

    /// Removes what is left of a sandbox after its agent exited: stray
    /// processes (none, normally: they die with the pid namespace) and the
    /// cgroup.
    fn cleanup(&self, id: &str) -> Result<(), EdgeError> {
        self.cgroups.kill_all(id);
        let removed = self.cgroups.remove(id).map_err(EdgeError::from);
        // After the cgroup: nothing of the sandbox's is left to write to
        // the layer (a stray process would only have kept its extents).
        let layer = self.disk.as_ref().map_or(Ok(()), |d| d.remove_layer(id)).map_err(EdgeError::from);
        if let Some(eg) = &self.egress {
            eg.release(id);
        }
        if let Some(m) = &self.masks {
            m.forget(id);
        }
        removed.and(layer)
    }

    /// The agent keeps the overlay's upper directory open at a fixed fd.
    fn writable_layer(&self, id: &str, inst: &Instance) -> Result<OwnedFd, EdgeError> {
        spawn::pidfd_getfd(&inst.pidfd, AGENT_UPPER_FD)
            .map_err(|e| EdgeError::Invalid(format!("sandbox {id} cannot be packed: its agent holds no writable layer ({e})")))
    }

    /// Network state (cgroup2 directories, slots) and writable layers of
    /// sandboxes not in `live`.
    fn reap_files(&self, live: &std::collections::HashSet<String>) -> usize {
        self.egress.as_ref().map_or(0, |eg| eg.reap(live)) + self.disk.as_ref().map_or(0, |d| d.reap(live))
    }

    /// What the writable layer holds: its quota group's count on the node's
    /// disk, or the upper tmpfs's (no layer on the disk, or one kept in
    /// memory), through the agent's fd of it.
    fn disk_used_bytes(&self, id: &str, pid: i32) -> Option<u64> {
        if let Some(used) = self.disk.as_ref().and_then(|d| d.layer_used_bytes(id)) {
            return Some(used);
        }
        let st = rustix::fs::statvfs(format!("/proc/{pid}/fd/{AGENT_UPPER_FD}")).ok()?;
        Some(st.f_blocks.saturating_sub(st.f_bfree).saturating_mul(st.f_frsize))
    }

    /// Unmounts the node's shared filesystems (edge shutdown).
    fn release(&self) {
        sysfs::release(&self.sysfs.dir);
        if let Some(eg) = &self.egress {
            eg.shutdown();
        }
        if let Some(d) = &self.disk {
            d.release();
        }
    }
}

/// The agent's fd holding the overlay upper (see the agent's `reattach`).
const AGENT_UPPER_FD: i32 = 5;

/// How long re-adoption waits for an agent to offer its re-attach channel.
const REATTACH_WAIT: Duration = Duration::from_secs(3);

fn is_socket(fd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: fstat on an fd we own, into a zeroed local struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pointer is valid for the call.
    unsafe { libc::fstat(fd.as_raw_fd(), &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFSOCK }
}

/// Image environment, overridden by the request's environment.
pub(crate) fn merged_env(image_env: &[(String, String)], spec: &SandboxSpec) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = image_env.iter().filter(|(k, _)| !spec.env.contains_key(k)).cloned().collect();
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// The size of a container's writable layer in a tmpfs: `disk_mb`, but
/// never more than its memory can hold with room to spare (a layer on the
/// node's disk is bounded by `disk_mb` alone).
///
/// The layer is a tmpfs, so its pages are charged to the sandbox's memory
/// cgroup, and a running sandbox never swaps (`cgroup`). A layer allowed to
/// reach the memory limit would have the kernel OOM-kill a process when it
/// fills, and when the writer is the agent itself (an upload), the agent is
/// the only process there is: a host that withholds CAP_SYS_RESOURCE keeps
/// its oom_score_adj at 0, and the sandbox dies. Held below the limit, a
/// fill ends in ENOSPC instead, whoever writes. The reserve, an eighth of
/// the memory (at least 16 MiB, at most half), leaves the agent and
/// the filesystem's own metadata their room.
pub fn writable_layer_bytes(disk_mb: u64, memory_mb: u64) -> u64 {
    let reserve_mb = (memory_mb / 8).max(16).min(memory_mb / 2);
    disk_mb.min(memory_mb - reserve_mb) << 20
}

#[cfg(test)]
mod tests {
    use super::writable_layer_bytes;

    #[test]
    fn the_writable_layer_stays_below_the_memory_limit() {
        // The defaults: 1 GiB of disk in 512 MiB of memory.
        assert_eq!(writable_layer_bytes(1024, 512), 448 << 20);
        // A disk smaller than the memory is what was asked for.
        assert_eq!(writable_layer_bytes(64, 256), 64 << 20);
        assert_eq!(writable_layer_bytes(8, 16), 8 << 20);
        // Small and large memories: the reserve stays between 16 MiB and half.
        assert_eq!(writable_layer_bytes(1024, 16), 8 << 20);
        assert_eq!(writable_layer_bytes(1024, 64), 48 << 20);
        assert_eq!(writable_layer_bytes(1 << 20, 8192), 7168 << 20);
    }
}
