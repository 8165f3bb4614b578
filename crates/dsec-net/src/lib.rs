//! Per-sandbox egress for sandboxes of every backend (a VM's QEMU joins the
//! namespace and cgroup2 directory itself: `prepare`).
//!
//! A sandbox created with network rules joins a pre-warmed network
//! namespace with a veth to the host (`pool`), its processes live in a
//! cgroup2 directory of their own where eBPF programs decide every connect,
//! send and packet against the sandbox's allowlist (`bpf`), the allowlist
//! is compiled from rules by service, prefix and domain (`rules`, `config`)
//! and grows with what the node's resolver answers for allowed domains
//! (`dns`, `resolver`). Denials become audit events (`Denial`).
//! Sandboxes without rules never come here: they keep a loopback-only
//! namespace of their own.

pub mod bpf;
pub mod config;
pub mod defaults;
pub mod dns;
mod nat;
pub mod netlink;
pub mod pool;
mod resolver;
pub mod rules;
mod upstream;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use config::NetConfig;
pub use pool::Warm;
pub use rules::{RuleError, RuleSet};

/// Addresses a sandbox's domains resolved to that it keeps (a flood of
/// lookups cannot grow its allowlist without bound).
const MAX_LEARNED: usize = 256;
/// Denials waiting for the edge; beyond that they are counted, not kept.
const DENIAL_QUEUE: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error(transparent)]
    Rules(#[from] RuleError),
    #[error(transparent)]
    Bpf(#[from] bpf::BpfError),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("sandbox {0} has no network of its own (it was created without network rules)")]
    NotNetworked(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetError {
    let what = what.into();
    move |e| NetError::Io(what, e)
}

/// A refused attempt, for the sandbox's audit log.
#[derive(Debug, Clone)]
pub struct Denial {
    pub sandbox_id: String,
    pub time_ms: u64,
    pub pid: u32,
    pub detail: String,
}

struct SandboxNet {
    slot: u32,
    cgid: u64,
    rules_map: BTreeMap<String, bool>,
    rules: RuleSet,
    /// Addresses allowed domains resolved to, with the domain's ports.
    learned: Vec<(Ipv4Addr, String, Vec<rules::PortRange>)>,
    /// The namespace itself, for a sandbox whose processes come and go
    /// (a microVM's QEMU ends at suspend and starts again at resume).
    netns: Option<OwnedFd>,
}

/// What is persisted per networked sandbox (`<state>/net/<id>.json`), for
/// a restarted edge.
#[derive(serde::Serialize, serde::Deserialize)]
struct Persisted {
    slot: u32,
    rules: BTreeMap<String, bool>,
}

pub(crate) struct Inner {
    cfg: NetConfig,
    tag: String,
    pool: pool::Pool,
    progs: Mutex<bpf::Programs>,
    /// `<cgroup2 mount>/<parent>`: sandboxes' cgroup2 directories go below.
    v2_parent: PathBuf,
    /// On a cgroup v1 host the cgroup2 directories are ours to make and
    /// remove; on v2 they are the sandboxes' own cgroups.
    own_v2_dirs: bool,
    state_dir: PathBuf,
    sandboxes: Mutex<HashMap<String, SandboxNet>>,
    denials: tokio::sync::mpsc::Sender<Denial>,
}

#[derive(Clone)]
pub struct Egress {
    inner: Arc<Inner>,
}

/// Where the edge keeps its cgroups, for the cgroup2 directories.
pub struct CgroupLayout {
    /// The cgroup2 mount (/sys/fs/cgroup on v2, /sys/fs/cgroup/unified on
    /// a hybrid v1 host).
    pub v2_root: PathBuf,
    /// The edge's parent below it (`dsec/<node>`).
    pub parent: String,
    /// The sandboxes' cgroups are v1: make the cgroup2 directories here.
    pub hybrid: bool,
}

// Denials become audit events: stamped with the agent protocol's clock.
use dsec_agent_proto::now_ms;

/// Four hex characters of the node name: keeps the link names of edges on
/// one host apart (interface names have 15 characters).
pub fn node_tag(node: &str) -> String {
    let mut h: u32 = 0x811c9dc5;
    for b in node.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    format!("{:04x}", h & 0xffff)
}

impl Egress {
    /// Loads the eBPF programs, makes the resolver's interface, starts the
    /// warm pool and the resolver. Needs a tokio runtime. Returns the
    /// stream of denials for the edge to record.
    pub fn start(
        cfg: NetConfig,
        node: &str,
        layout: CgroupLayout,
        state_dir: &Path,
    ) -> Result<(Egress, tokio::sync::mpsc::Receiver<Denial>), NetError> {
        let tag = node_tag(node);
        let state_dir = state_dir.join("net");
        std::fs::create_dir_all(&state_dir).map_err(io(state_dir.display().to_string()))?;
        let mut progs = bpf::Programs::load(&Path::new("/sys/fs/bpf/dsec").join(node))?;
        let ring = progs.take_denials();
        let v2_parent = layout.v2_root.join(&layout.parent);
        let setup = (|| {
            std::fs::create_dir_all(&v2_parent).map_err(io(v2_parent.display().to_string()))?;
            if cfg.nat {
                nat::masquerade(cfg.subnet, &tag).map_err(io("masquerading the sandbox subnet"))?;
            }
            resolver::add_address(cfg.resolver_ip()).map_err(io("adding the resolver's address"))?;
            pool::Pool::start(cfg.clone(), tag.clone()).map_err(io("starting the network namespace pool"))
        })();
        let pool = match setup {
            Ok(p) => p,
            Err(e) => {
                // Nothing of ours is attached yet unless an earlier edge
                // left sandboxes (then their pins stay).
                if std::fs::read_dir(&state_dir).map(|mut d| d.next().is_none()).unwrap_or(true) {
                    progs.unpin();
                    if cfg.nat {
                        nat::unmasquerade(cfg.subnet, &tag);
                    }
                }
                return Err(e);
            }
        };
        let (tx, rx) = tokio::sync::mpsc::channel(DENIAL_QUEUE);
        let inner = Arc::new(Inner {
            cfg,
            tag,
            pool,
            progs: Mutex::new(progs),
            v2_parent,
            own_v2_dirs: layout.hybrid,
            state_dir,
            sandboxes: Mutex::new(HashMap::new()),
            denials: tx,
        });
        let egress = Egress { inner };
        resolver::spawn(egress.clone()).map_err(io("starting the DNS resolver"))?;
        if let Some(ring) = ring {
            resolver::spawn_denial_reader(egress.clone(), ring).map_err(io("reading eBPF denials"))?;
        }
        Ok((egress, rx))
    }

    pub fn config(&self) -> &NetConfig {
        &self.inner.cfg
    }

    /// The prefix of every host-side link name of this node.
    pub fn link_prefix(&self) -> String {
        format!("dsv{}", self.inner.tag)
    }

    /// Parses and checks rules against this node's services.
    pub fn validate(&self, rules: &BTreeMap<String, bool>) -> Result<RuleSet, RuleError> {
        rules::parse(rules, &self.inner.cfg)
    }

    /// A ready network namespace for a new sandbox.
    pub fn take(&self) -> Result<Warm, NetError> {
        self.inner.pool.take().map_err(io("preparing a network namespace"))
    }

    /// Gives back a namespace a failed creation did not use.
    pub fn give_back(&self, warm: Warm) {
        let slot = warm.slot;
        drop(warm.netns);
        self.inner.pool.release(slot);
    }

    fn cgroup_dir(&self, id: &str) -> PathBuf {
        self.inner.v2_parent.join(id)
    }

    /// `cgroup.procs` of sandbox `id`'s cgroup2 directory (for a process
    /// that joins it itself; `prepare` made it).
    pub fn cgroup_procs(&self, id: &str) -> PathBuf {
        self.cgroup_dir(id).join("cgroup.procs")
    }

    /// Puts the sandbox's agent `pid` (already in `warm`'s namespace) under
    /// its allowlist: cgroup2 directory, programs, entries, then the pid.
    /// Nothing untrusted runs before this returns (the agent is still
    /// setting up).
    pub fn attach(&self, id: &str, pid: i32, slot: u32, rules_map: &BTreeMap<String, bool>) -> Result<(), NetError> {
        let procs = self.prepare(id, slot, rules_map)?;
        std::fs::write(&procs, pid.to_string()).map_err(io(format!("moving {pid} into {}", procs.display()))).inspect_err(|_| {
            self.release(id);
        })
    }

    /// Everything of `attach` but the move: for a sandbox whose first
    /// process joins the cgroup2 directory itself before it execs (a
    /// microVM's QEMU). Returns that directory's `cgroup.procs`. On error
    /// nothing is left (the slot is released too).
    pub fn prepare(&self, id: &str, slot: u32, rules_map: &BTreeMap<String, bool>) -> Result<PathBuf, NetError> {
        let rules = self.validate(rules_map)?;
        let dir = self.cgroup_dir(id);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(NetError::Io(dir.display().to_string(), e)),
        }
        let result = (|| {
            let dfd: OwnedFd = std::fs::File::open(&dir).map_err(io(dir.display().to_string()))?.into();
            let cgid = std::fs::metadata(&dir).map_err(io(dir.display().to_string()))?.ino();
            let (_, sandbox_ip) = self.inner.cfg.slot_addrs(slot);
            {
                let mut progs = self.inner.progs.lock().unwrap_or_else(|p| p.into_inner());
                progs.set_sandbox(cgid, sandbox_ip, self.inner.cfg.resolver_ip())?;
                progs.set_entries(cgid, &rules::compile(&rules, &[], self.inner.cfg.subnet)?)?;
                progs.attach(dfd.as_fd(), id)?;
            }
            self.persist(id, slot, rules_map)?;
            let net = SandboxNet { slot, cgid, rules_map: rules_map.clone(), rules, learned: Vec::new(), netns: None };
            self.inner.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).insert(id.to_string(), net);
            Ok(dir.join("cgroup.procs"))
        })();
        if result.is_err() {
            self.release(id);
            self.inner.pool.release(slot);
        }
        result
    }

    fn persist(&self, id: &str, slot: u32, rules: &BTreeMap<String, bool>) -> Result<(), NetError> {
        let path = self.inner.state_dir.join(format!("{id}.json"));
        let tmp = self.inner.state_dir.join(format!("{id}.json.tmp"));
        let body = serde_json::to_vec(&Persisted { slot, rules: rules.clone() })
            .map_err(|e| NetError::Io(path.display().to_string(), e.into()))?;
        std::fs::write(&tmp, body).and_then(|()| std::fs::rename(&tmp, &path)).map_err(io(path.display().to_string()))
    }

    /// Replaces a running sandbox's rules; new connections see them at once
    /// (and packets of existing ones, at the packet hook).
    pub fn set_rules(&self, id: &str, rules_map: &BTreeMap<String, bool>) -> Result<(), NetError> {
        let rules = self.validate(rules_map)?;
        let mut all = self.inner.sandboxes.lock().unwrap_or_else(|p| p.into_inner());
        let net = all.get_mut(id).ok_or_else(|| NetError::NotNetworked(id.to_string()))?;
        // Keep what allowed domains resolved to, if they are still allowed.
        let learned: Vec<_> = net.learned.iter().filter(|(_, name, _)| rules.domain(name).is_some()).cloned().collect();
        let compiled = rules::compile(&rules, &learned_entries(&learned, &rules), self.inner.cfg.subnet)?;
        self.inner.progs.lock().unwrap_or_else(|p| p.into_inner()).set_entries(net.cgid, &compiled)?;
        self.persist(id, net.slot, rules_map)?;
        net.rules = rules;
        net.rules_map = rules_map.clone();
        net.learned = learned;
        Ok(())
    }

    /// The rules a networked sandbox has now.
    pub fn rules_of(&self, id: &str) -> Option<BTreeMap<String, bool>> {
        self.inner.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).get(id).map(|n| n.rules_map.clone())
    }

    pub fn is_networked(&self, id: &str) -> bool {
        self.inner.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).contains_key(id)
    }

    /// The resolv.conf of a networked sandbox.
    pub fn resolv_conf(&self) -> String {
        format!("# written by dsec: the node's resolver answers for the domains the sandbox's rules allow\nnameserver {}\noptions attempts:1 timeout:2\n", self.inner.cfg.resolver_ip())
    }

    /// Keeps the network namespace of sandbox `id` open while none of its
    /// processes is (a suspended microVM), so it and its veth survive.
    pub fn keep_netns(&self, id: &str, netns: OwnedFd) {
        if let Some(n) = self.inner.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).get_mut(id) {
            n.netns = Some(netns);
        }
    }

    /// The network namespace of sandbox `id`, for a process that joins it
    /// (a resumed microVM's QEMU): the one kept, or, when none was (the
    /// edge restarted while the sandbox had no process), a new one for the
    /// sandbox's slot, so its address and allowlist stay as they were.
    pub fn netns_of(&self, id: &str) -> Result<OwnedFd, NetError> {
        let slot = {
            let all = self.inner.sandboxes.lock().unwrap_or_else(|p| p.into_inner());
            let net = all.get(id).ok_or_else(|| NetError::NotNetworked(id.to_string()))?;
            if let Some(ns) = &net.netns {
                return ns.try_clone().map_err(io("duplicating a network namespace"));
            }
            net.slot
        };
        let ns = self.inner.pool.make_for(slot).map_err(io(format!("remaking the network namespace of {id}")))?;
        let copy = ns.try_clone().map_err(io("duplicating a network namespace"))?;
        self.keep_netns(id, ns);
        Ok(copy)
    }

    /// Removes everything of a sandbox whose processes are gone (or never
    /// started): allowlist entries, the cgroup2 directory (detaching the
    /// programs), the slot, the persisted state. Idempotent.
    pub fn release(&self, id: &str) {
        let net = self.inner.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        let dir = self.cgroup_dir(id);
        let cgid = net.as_ref().map(|n| n.cgid).or_else(|| std::fs::metadata(&dir).ok().map(|m| m.ino()));
        if let Some(cgid) = cgid {
            self.inner.progs.lock().unwrap_or_else(|p| p.into_inner()).forget(cgid);
        }
        if self.inner.own_v2_dirs {
            let _ = std::fs::remove_dir(&dir);
        }
        let file = self.inner.state_dir.join(format!("{id}.json"));
        let slot = net.map(|n| n.slot).or_else(|| read_persisted(&file).map(|p| p.slot));
        if let Some(slot) = slot {
            self.inner.pool.release(slot);
        }
        let _ = std::fs::remove_file(file);
    }

    /// After an edge restart: takes back a running sandbox's network state
    /// (its programs stayed attached, its entries stayed in the pinned
    /// maps). `false` if it had none.
    pub fn adopt(&self, id: &str) -> Result<bool, NetError> {
        let Some(p) = read_persisted(&self.inner.state_dir.join(format!("{id}.json"))) else { return Ok(false) };
        self.inner.pool.claim(p.slot);
        let dir = self.cgroup_dir(id);
        let cgid = std::fs::metadata(&dir).map_err(io(dir.display().to_string()))?.ino();
        let rules = self.validate(&p.rules).unwrap_or_default();
        let net = SandboxNet { slot: p.slot, cgid, rules_map: p.rules.clone(), rules, learned: Vec::new(), netns: None };
        self.inner.sandboxes.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_string(), net);
        Ok(true)
    }

    /// Removes the state of sandboxes not in `live` (the reaper). Returns
    /// how many.
    pub fn reap(&self, live: &HashSet<String>) -> usize {
        let mut n = 0;
        let Ok(rd) = std::fs::read_dir(&self.inner.state_dir) else { return 0 };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(id) = name.strip_suffix(".json") else { continue };
            if !live.contains(id) && !self.is_networked(id) {
                self.release(id);
                n += 1;
            }
        }
        n
    }

    /// Edge shutdown: the pool's namespaces go, the resolver's address
    /// goes, and the pinned maps and the masquerading rule too if no
    /// networked sandbox is left (those left keep reaching their mirrors).
    pub fn shutdown(&self) {
        self.inner.pool.shutdown();
        resolver::remove_address(self.inner.cfg.resolver_ip());
        let empty = self.inner.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
        if empty {
            if self.inner.cfg.nat {
                nat::unmasquerade(self.inner.cfg.subnet, &self.inner.tag);
            }
            self.inner.progs.lock().unwrap_or_else(|p| p.into_inner()).unpin();
            if self.inner.own_v2_dirs {
                // Our parent and, if nobody else uses it, the level above.
                let _ = std::fs::remove_dir(&self.inner.v2_parent);
                if let Some(up) = self.inner.v2_parent.parent() {
                    let _ = std::fs::remove_dir(up);
                }
            }
        }
    }

    /// Records what an allowed domain resolved to, and opens it.
    pub(crate) fn learn(&self, sandbox_ip: Ipv4Addr, name: &str, addrs: &[Ipv4Addr]) {
        let mut all = self.inner.sandboxes.lock().unwrap_or_else(|p| p.into_inner());
        let Some((_, net)) = all.iter_mut().find(|(_, n)| self.inner.cfg.slot_addrs(n.slot).1 == sandbox_ip) else { return };
        let Some(rule) = net.rules.domain(name).cloned() else { return };
        for a in addrs {
            if self.inner.cfg.subnet.covers(&rules::Cidr { addr: *a, len: 32 }) {
                continue; // never a way into the sandbox subnet
            }
            if !net.learned.iter().any(|(ip, n, _)| ip == a && n == name) {
                if net.learned.len() >= MAX_LEARNED {
                    net.learned.remove(0);
                }
                net.learned.push((*a, name.to_string(), rule.ranges.clone()));
            }
        }
        let learned = learned_entries(&net.learned, &net.rules);
        match rules::compile(&net.rules, &learned, self.inner.cfg.subnet) {
            Ok(entries) => {
                if let Err(e) = self.inner.progs.lock().unwrap_or_else(|p| p.into_inner()).set_entries(net.cgid, &entries) {
                    tracing::warn!(error = %e, "opening resolved addresses");
                }
            }
            Err(e) => tracing::warn!(error = %e, "opening resolved addresses"),
        }
    }

    /// The sandbox that owns address `ip`, with whether its rules allow
    /// `name`.
    pub(crate) fn sandbox_by_ip(&self, ip: Ipv4Addr, name: &str) -> Option<(String, bool)> {
        let all = self.inner.sandboxes.lock().unwrap_or_else(|p| p.into_inner());
        all.iter().find(|(_, n)| self.inner.cfg.slot_addrs(n.slot).1 == ip).map(|(id, n)| (id.clone(), n.rules.domain(name).is_some()))
    }

    pub(crate) fn sandbox_by_cgid(&self, cgid: u64) -> Option<String> {
        let all = self.inner.sandboxes.lock().unwrap_or_else(|p| p.into_inner());
        all.iter().find(|(_, n)| n.cgid == cgid).map(|(id, _)| id.clone())
    }

    pub(crate) fn report(&self, d: Denial) {
        let _ = self.inner.denials.try_send(d);
    }
}

fn learned_entries(learned: &[(Ipv4Addr, String, Vec<rules::PortRange>)], rules: &RuleSet) -> Vec<(Ipv4Addr, Vec<rules::PortRange>)> {
    learned.iter().filter_map(|(ip, name, _)| rules.domain(name).map(|d| (*ip, d.ranges.clone()))).collect()
}

fn read_persisted(path: &Path) -> Option<Persisted> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}
