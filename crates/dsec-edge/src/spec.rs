//! Turning a creation request into a `SandboxSpec`: defaults, then checks.

use std::collections::BTreeMap;

use crate::error::EdgeError;
use crate::model::{BackendKind, Limits, QosClass, SandboxSpec, VolumeRef};

/// A creation request as the edge receives it; `None` means "default".
#[derive(Debug, Clone, Default)]
pub struct SandboxRequest {
    pub backend: Option<BackendKind>,
    pub image: String,
    pub workspace: Option<String>,
    pub toolkits: Vec<String>,
    pub memory_mb: Option<u64>,
    pub cpu_cores: Option<f64>,
    /// The cgroup's CPU quota when it must be above `cpu_cores` (which is
    /// still what the sandbox reserves). Not part of the public API: the
    /// edge's FnCall runners set it, because a call is a pipeline of
    /// processes (monitor, compiler, worker) that overlap on several cores,
    /// and a one-core quota throttled a runner serving calls one at a time
    /// in most 100 ms periods (p99 12-43 ms against 3 ms without).
    pub cpu_quota_cores: Option<f64>,
    pub disk_mb: Option<u64>,
    pub pids: Option<u64>,
    pub idle_ttl_s: Option<u64>,
    pub max_lifetime_s: Option<u64>,
    pub init_user: Option<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub job: Option<String>,
    pub network_rules: BTreeMap<String, bool>,
    /// Start a microVM's writable disk from this snapshot (by name; the
    /// edge fills in the image it was taken from).
    pub snapshot: Option<String>,
    /// The CPU QoS class; `None`: the backend's default ([`default_qos`]).
    pub qos_class: Option<QosClass>,
    /// Named volumes of the caller's, by sandbox path (containers only).
    pub volumes: BTreeMap<String, VolumeRef>,
    /// Keep a container's writable layer in memory (a tmpfs below its
    /// memory limit) even on a node whose layers are on its disk. Not part
    /// of the public API: the edge's FnCall runners set it. A call creates,
    /// writes and removes its scratch files in that layer, and on the
    /// node's disk (btrfs under overlayfs) that cost every call about
    /// 0.1 ms more of system time in the runner; a runner's layer is small
    /// and thrown away with it.
    pub writable_layer_in_memory: bool,
}

/// The QoS class a sandbox gets when its creation names none: latency
/// sensitive on every backend. Containers and microVMs serve agents'
/// steps, which a trainer waits on. A full VM's steps are screen actions
/// of seconds, but it boots a whole operating system (emulated where KVM
/// is missing), and best effort runs only on CPU time the rest of the node
/// leaves: on a busy node its boot would wait as long as the node stays
/// busy. So a sandbox is best effort only when its creator asks.
pub fn default_qos(backend: BackendKind) -> QosClass {
    match backend {
        BackendKind::Container | BackendKind::Microvm | BackendKind::Vm | BackendKind::Fncall => QosClass::LatencySensitive,
    }
}

/// Defaults and bounds of one edge.
#[derive(Debug, Clone)]
pub struct SpecPolicy {
    pub default_memory_mb: u64,
    pub default_cpu_cores: f64,
    pub default_disk_mb: u64,
    pub default_pids: u64,
    pub default_idle_ttl_s: u64,
    pub default_max_lifetime_s: u64,
    pub max_memory_mb: u64,
    pub max_cpu_cores: f64,
    pub max_disk_mb: u64,
    pub max_pids: u64,
    pub max_lifetime_cap_s: u64,
}

impl SpecPolicy {
    /// Defaults for a node with `cpus` cores and `memory_mb` of RAM.
    pub fn for_node(cpus: f64, memory_mb: u64) -> Self {
        Self {
            default_memory_mb: 512,
            default_cpu_cores: 1.0_f64.min(cpus),
            default_disk_mb: 1024,
            default_pids: 1024,
            default_idle_ttl_s: 300,
            default_max_lifetime_s: 24 * 3600,
            max_memory_mb: memory_mb,
            max_cpu_cores: cpus,
            max_disk_mb: 64 * 1024,
            max_pids: 32 * 1024,
            max_lifetime_cap_s: 7 * 24 * 3600,
        }
    }
}

const MIN_MEMORY_MB: u64 = 16;
const MIN_PIDS: u64 = 8;
/// The guest kernel and its initramfs need this much to boot.
const MIN_VM_MEMORY_MB: u64 = 96;
const MAX_LABELS: usize = 64;
const MAX_LABEL_BYTES: usize = 256;

pub fn resolve(req: SandboxRequest, p: &SpecPolicy) -> Result<SandboxSpec, EdgeError> {
    let backend = req.backend.unwrap_or(BackendKind::Container);
    if !matches!(backend, BackendKind::Container | BackendKind::Microvm | BackendKind::Vm) {
        return Err(EdgeError::UnsupportedBackend(format!(
            "backend {backend:?} is not available on this node; use \"container\", \"microvm\" or \"vm\""
        )));
    }
    let min_vm = crate::backends::min_memory_mb(BackendKind::Vm);
    if backend == BackendKind::Vm && req.memory_mb.is_some_and(|m| m < min_vm) {
        return Err(EdgeError::Invalid(format!("a full VM needs memory_limit_mb of at least {min_vm} (its operating system)")));
    }
    if backend == BackendKind::Microvm && req.memory_mb.is_some_and(|m| m < MIN_VM_MEMORY_MB) {
        return Err(EdgeError::Invalid(format!("a microVM needs memory_limit_mb of at least {MIN_VM_MEMORY_MB} (its guest kernel)")));
    }
    if req.image.trim().is_empty() {
        return Err(EdgeError::Invalid("image must not be empty".into()));
    }
    let limits = Limits {
        memory_mb: req.memory_mb.unwrap_or(p.default_memory_mb),
        cpu_cores: req.cpu_cores.unwrap_or(p.default_cpu_cores),
        disk_mb: req.disk_mb.unwrap_or(p.default_disk_mb),
        pids: req.pids.unwrap_or(p.default_pids),
        cpu_quota_cores: req.cpu_quota_cores,
    };
    if !(MIN_MEMORY_MB..=p.max_memory_mb).contains(&limits.memory_mb) {
        return Err(EdgeError::InvalidLimits(format!(
            "memory_limit_mb must be between {MIN_MEMORY_MB} and {} (got {})",
            p.max_memory_mb, limits.memory_mb
        )));
    }
    if !limits.cpu_cores.is_finite() || limits.cpu_cores < 0.01 || limits.cpu_cores > p.max_cpu_cores {
        return Err(EdgeError::InvalidLimits(format!(
            "cpu_cores_limit must be between 0.01 and {} (got {})",
            p.max_cpu_cores, limits.cpu_cores
        )));
    }
    if let Some(q) = limits.cpu_quota_cores {
        if !q.is_finite() || q < limits.cpu_cores || q > p.max_cpu_cores {
            return Err(EdgeError::InvalidLimits(format!(
                "the CPU quota must be between cpu_cores_limit ({}) and {} (got {q})",
                limits.cpu_cores, p.max_cpu_cores
            )));
        }
    }
    if !(1..=p.max_disk_mb).contains(&limits.disk_mb) {
        return Err(EdgeError::InvalidLimits(format!("disk_limit_mb must be between 1 and {} (got {})", p.max_disk_mb, limits.disk_mb)));
    }
    if !(MIN_PIDS..=p.max_pids).contains(&limits.pids) {
        return Err(EdgeError::InvalidLimits(format!("pids_limit must be between {MIN_PIDS} and {} (got {})", p.max_pids, limits.pids)));
    }
    let max_lifetime_s = match req.max_lifetime_s {
        None => p.default_max_lifetime_s,
        Some(0) => p.max_lifetime_cap_s,
        Some(s) if s > p.max_lifetime_cap_s => {
            return Err(EdgeError::InvalidLimits(format!("max_lifetime_s must be at most {} (got {s})", p.max_lifetime_cap_s)))
        }
        Some(s) => s,
    };
    if let Some((name, _)) = req.network_rules.iter().find(|(_, allow)| **allow) {
        return Err(EdgeError::UnsupportedNetwork(format!(
            "network rule {name:?}: outbound network is not enabled on this node; sandboxes have loopback only"
        )));
    }
    for (k, v) in &req.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(EdgeError::Invalid(format!("invalid environment variable {k:?}")));
        }
    }
    if req.labels.len() > MAX_LABELS || req.labels.iter().any(|(k, v)| k.is_empty() || k.len() + v.len() > MAX_LABEL_BYTES) {
        return Err(EdgeError::Invalid(format!("labels: at most {MAX_LABELS}, keys non-empty, key+value at most {MAX_LABEL_BYTES} bytes")));
    }
    let init_user = req.init_user.unwrap_or_else(|| "root".into());
    if init_user.is_empty() || init_user.contains(['/', ':', '\0']) {
        return Err(EdgeError::Invalid(format!("invalid init_user {init_user:?}")));
    }
    if let Some(w) = &req.workdir {
        if !w.starts_with('/') {
            return Err(EdgeError::Invalid(format!("workdir must be an absolute path (got {w:?})")));
        }
    }
    check_volumes(backend, &req.volumes)?;
    Ok(SandboxSpec {
        backend,
        image: req.image,
        workspace: req.workspace,
        toolkits: req.toolkits,
        limits,
        idle_ttl_s: req.idle_ttl_s.unwrap_or(p.default_idle_ttl_s),
        max_lifetime_s,
        init_user,
        env: req.env,
        workdir: req.workdir,
        labels: req.labels,
        job: req.job,
        network_rules: req.network_rules,
        // The edge resolves a snapshot's name to its id (`vm_snapshot`).
        snapshot: None,
        qos_class: req.qos_class.unwrap_or(default_qos(backend)),
        volumes: req.volumes,
        writable_layer_in_memory: req.writable_layer_in_memory,
    })
}

/// At most this many volumes per sandbox.
pub const MAX_VOLUMES: usize = 16;

/// Volume mounts: containers only, at plain absolute paths outside what
/// the sandbox's own setup mounts (/proc, /sys, /dev), each path once.
fn check_volumes(backend: BackendKind, volumes: &BTreeMap<String, VolumeRef>) -> Result<(), EdgeError> {
    if volumes.is_empty() {
        return Ok(());
    }
    if backend != BackendKind::Container {
        return Err(EdgeError::Invalid(
            "volumes are mounted in container sandboxes only (a VM's guest has no way to share a host directory safely here)".into(),
        ));
    }
    if volumes.len() > MAX_VOLUMES {
        return Err(EdgeError::Invalid(format!("at most {MAX_VOLUMES} volumes per sandbox (got {})", volumes.len())));
    }
    let mut seen = std::collections::HashSet::new();
    for (path, v) in volumes {
        let norm = path.trim_end_matches('/');
        let reserved = ["/proc", "/sys", "/dev"].iter().any(|r| norm == *r || norm.starts_with(&format!("{r}/")));
        if !path.starts_with('/') || norm.is_empty() || path.split('/').any(|c| c == ".." || c == ".") || path.contains('\0') || reserved {
            return Err(EdgeError::Invalid(format!(
                "volume path {path:?} must be an absolute path other than /, without `.` or `..`, outside /proc, /sys and /dev"
            )));
        }
        if !seen.insert(norm.to_string()) {
            return Err(EdgeError::Invalid(format!("volume path {path:?} is given twice")));
        }
        crate::disk::volumes::check_name(&v.name)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> SandboxRequest {
        SandboxRequest { image: "python".into(), ..Default::default() }
    }

    #[test]
    fn defaults_apply() {
        let s = resolve(req(), &SpecPolicy::for_node(2.0, 24_000)).unwrap();
        assert_eq!(s.limits.memory_mb, 512);
        assert_eq!(s.init_user, "root");
        assert_eq!(s.idle_ttl_s, 300);
        assert_eq!(s.qos_class, QosClass::LatencySensitive);
    }

    #[test]
    fn qos_class_defaults_to_latency_sensitive_and_a_request_overrides_it() {
        let p = SpecPolicy::for_node(2.0, 24_000);
        let vm = SandboxRequest { backend: Some(BackendKind::Vm), memory_mb: Some(1024), ..req() };
        assert_eq!(resolve(vm.clone(), &p).unwrap().qos_class, QosClass::LatencySensitive);
        let r = SandboxRequest { backend: Some(BackendKind::Microvm), ..req() };
        assert_eq!(resolve(r, &p).unwrap().qos_class, QosClass::LatencySensitive);
        let r = SandboxRequest { qos_class: Some(QosClass::BestEffort), ..req() };
        assert_eq!(resolve(r, &p).unwrap().qos_class, QosClass::BestEffort);
        let r = SandboxRequest { qos_class: Some(QosClass::BestEffort), ..vm };
        assert_eq!(resolve(r, &p).unwrap().qos_class, QosClass::BestEffort);
    }

    #[test]
    fn impossible_limits_are_refused_with_the_reason() {
        let p = SpecPolicy::for_node(2.0, 24_000);
        for (r, needle) in [
            (SandboxRequest { memory_mb: Some(0), ..req() }, "memory_limit_mb"),
            (SandboxRequest { memory_mb: Some(10_000_000), ..req() }, "memory_limit_mb"),
            (SandboxRequest { cpu_cores: Some(-1.0), ..req() }, "cpu_cores_limit"),
            (SandboxRequest { cpu_cores: Some(f64::NAN), ..req() }, "cpu_cores_limit"),
            (SandboxRequest { cpu_cores: Some(64.0), ..req() }, "cpu_cores_limit"),
            (SandboxRequest { disk_mb: Some(0), ..req() }, "disk_limit_mb"),
            (SandboxRequest { pids: Some(1), ..req() }, "pids_limit"),
            (SandboxRequest { max_lifetime_s: Some(u64::MAX), ..req() }, "max_lifetime_s"),
            (SandboxRequest { cpu_cores: Some(1.0), cpu_quota_cores: Some(0.5), ..req() }, "CPU quota"),
            (SandboxRequest { cpu_quota_cores: Some(3.0), ..req() }, "CPU quota"),
            (SandboxRequest { cpu_quota_cores: Some(f64::INFINITY), ..req() }, "CPU quota"),
        ] {
            let e = resolve(r, &p).unwrap_err();
            assert!(matches!(e, EdgeError::InvalidLimits(_)), "{e}");
            assert!(e.to_string().contains(needle), "{e}");
        }
    }

    #[test]
    fn a_quota_above_the_reservation_is_kept_apart_from_it() {
        let p = SpecPolicy::for_node(2.0, 24_000);
        let s = resolve(SandboxRequest { cpu_cores: Some(1.0), cpu_quota_cores: Some(2.0), ..req() }, &p).unwrap();
        assert_eq!((s.limits.cpu_cores, s.limits.cpu_quota_cores), (1.0, Some(2.0)));
        assert_eq!(crate::backends::cgroup_limits(&s, 0).cpu_quota_us, 200_000, "the cgroup gets the quota");
        let plain = resolve(SandboxRequest { cpu_cores: Some(0.5), ..req() }, &p).unwrap();
        assert_eq!(crate::backends::cgroup_limits(&plain, 0).cpu_quota_us, 50_000, "and other sandboxes their reservation");
        // Records written before the field existed read back without it.
        let old = r#"{"memory_mb":64,"cpu_cores":1.0,"disk_mb":64,"pids":64}"#;
        assert_eq!(serde_json::from_str::<Limits>(old).unwrap().cpu_quota_cores, None);
        assert!(!serde_json::to_string(&plain.limits).unwrap().contains("quota"));
    }

    #[test]
    fn allowed_network_rules_are_refused_denied_ones_accepted() {
        let p = SpecPolicy::for_node(2.0, 24_000);
        let mut r = req();
        r.network_rules.insert("npm".into(), false);
        assert!(resolve(r.clone(), &p).is_ok());
        r.network_rules.insert("pypi".into(), true);
        assert!(matches!(resolve(r, &p), Err(EdgeError::UnsupportedNetwork(_))));
    }

    #[test]
    fn volumes_go_to_plain_paths_of_containers_only() {
        let p = SpecPolicy::for_node(2.0, 24_000);
        let with = |path: &str, name: &str, backend: Option<BackendKind>| {
            let volumes = [(path.to_string(), VolumeRef { name: name.into(), read_only: false })].into();
            resolve(SandboxRequest { volumes, backend, ..req() }, &p)
        };
        let spec = with("/data", "cache", None).unwrap();
        assert_eq!(spec.volumes["/data"].name, "cache");
        assert!(with("/mnt/a-b/c", "x.y_z", Some(BackendKind::Container)).is_ok());
        for path in ["", "data", "/", "/proc", "/proc/x", "/sys/fs", "/dev", "/dev/shm/x", "/a/../b", "/a/./b"] {
            assert!(matches!(with(path, "cache", None), Err(EdgeError::Invalid(_))), "{path:?}");
        }
        assert!(with("/devices", "cache", None).is_ok(), "only /dev itself and below are the sandbox's");
        assert!(with("/data", "Bad/Name", None).is_err());
        assert!(matches!(with("/data", "cache", Some(BackendKind::Microvm)), Err(EdgeError::Invalid(_))));
        let twice = [
            ("/d".to_string(), VolumeRef { name: "a".into(), read_only: false }),
            ("/d/".to_string(), VolumeRef { name: "b".into(), read_only: true }),
        ]
        .into();
        assert!(matches!(resolve(SandboxRequest { volumes: twice, ..req() }, &p), Err(EdgeError::Invalid(_))));
    }

    #[test]
    fn vms_need_room_for_their_kernel_and_fncall_is_not_a_sandbox_backend() {
        let p = SpecPolicy::for_node(2.0, 1000);
        let r = SandboxRequest { backend: Some(BackendKind::Fncall), ..req() };
        assert!(matches!(resolve(r, &p), Err(EdgeError::UnsupportedBackend(_))));
        let r = SandboxRequest { backend: Some(BackendKind::Vm), memory_mb: Some(128), ..req() };
        assert!(matches!(resolve(r, &p), Err(EdgeError::Invalid(_))));
        let r = SandboxRequest { backend: Some(BackendKind::Vm), memory_mb: Some(512), ..req() };
        assert_eq!(resolve(r, &p).unwrap().backend, BackendKind::Vm);
        let r = SandboxRequest { backend: Some(BackendKind::Microvm), memory_mb: Some(32), ..req() };
        assert!(matches!(resolve(r, &p), Err(EdgeError::Invalid(_))));
        let r = SandboxRequest { backend: Some(BackendKind::Microvm), memory_mb: Some(128), ..req() };
        assert_eq!(resolve(r, &p).unwrap().backend, BackendKind::Microvm);
    }
}
