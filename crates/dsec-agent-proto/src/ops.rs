//! Requests the edge makes of the agent, and their replies.

use serde::{Deserialize, Serialize};

/// One operation. Each is answered by exactly one `FromAgent::Reply`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Op {
    /// First request to a fresh container agent: build the root filesystem
    /// inside the sandbox's namespaces and become its init. Reply: `Ready`.
    SetupContainer(ContainerSetup),
    /// Liveness check. Reply: `Pong`.
    Ping,
    /// Run a program. With `stream_output`, output arrives as `Data` frames
    /// and the final `Exited` carries no output; otherwise output is buffered
    /// (up to `max_output_bytes` per stream) and returned in `Exited`.
    /// With `stdin: Stdin::Stream`, the edge sends `Data`/`Eof` for stdin.
    Exec(ExecSpec),
    /// Open a persistent shell session (cwd and exported environment carry
    /// over between the commands run in it). Reply: `Session`.
    OpenSession(SessionSpec),
    /// End a session and kill every process its commands started.
    /// Reply: `Done`.
    CloseSession { session_id: String },
    /// Start a program on a new PTY. Output arrives as `Data(Pty)`; input as
    /// `Data` from the edge; `Resize` changes the window. Reply: `Exited`
    /// when the program ends.
    OpenPty(PtySpec),
    /// Read a file. Content arrives as `Data(Content)`. Reply: `Done`.
    ReadFile { path: String, offset: u64, limit: Option<u64> },
    /// Write a file from the `Data` frames that follow, until `Eof`.
    /// Reply: `Written`. The file appears atomically (written to a temporary
    /// name, then renamed) unless `append`.
    WriteFile(WriteFileSpec),
    /// Reply: `Stat`.
    Stat { path: String },
    /// Reply: `Dir`.
    ListDir { path: String },
    /// Reply: `Done`.
    Mkdir { path: String, parents: bool, mode: u32 },
    /// Reply: `Done`.
    Remove { path: String, recursive: bool },
    /// Stream a directory (or file) as an uncompressed tar archive in `Data`
    /// frames. Reply: `Done`.
    TarCreate { path: String },
    /// Extract the tar archive that arrives in `Data` frames into directory
    /// `path` (created if missing). Entries that would land outside `path`
    /// are refused. Reply: `Done`.
    TarExtract { path: String, max_bytes: u64 },
    /// Kill every process, flush filesystems and exit. Reply: `Done`, sent
    /// before the agent exits.
    Shutdown,
    /// The refused attempts the agent recorded (blocked system calls), with
    /// a sequence number above `after`. Reply: `Audit`.
    AuditEvents { after: u64 },
    /// First request to a fresh microVM agent (the guest's init): mount the
    /// layer disks, the writable disk and the overlay, switch into the new
    /// root. Reply: `Ready`. (Last in the enum: postcard numbers variants
    /// by position, so appending keeps older frames meaning the same.)
    SetupVm(VmSetup),
    /// The paths of the sandbox's writable layer whose inode changed (ctime)
    /// at or after this time: what the operations since then wrote, made or
    /// deleted (the upper layer holds only changes, so the walk is short).
    /// At most `max_paths`. Reply: `Changed`.
    ChangedSince { since_sec: i64, since_nsec: u32, max_paths: u32 },
    /// Refused attempts the edge saw from outside (the eBPF egress
    /// allowlist, the node's resolver), kept in the same ring as the
    /// agent's own (their `seq` is ignored; the ring numbers them).
    /// Reply: `Done`.
    RecordAudit { events: Vec<AuditEvent> },
    /// A microVM started from a memory image (a node template, or a fork
    /// of another sandbox) takes its own identity: sandbox id (its next
    /// greeting names it), hostname, wall clock, and fresh randomness
    /// mixed into the guest kernel's pool, which is then reseeded (every
    /// VM of one image would otherwise draw the same random numbers).
    /// Reply: `Done`.
    Reidentify(VmIdentity),
    /// Connect to `127.0.0.1:port` of the sandbox (the agent's own network
    /// namespace: a VM guest's loopback) and relay the connection: `Data`
    /// from the edge is written to it, its bytes come back as
    /// `Data(Content)`, `Eof` shuts its write side. Once connected, an
    /// empty `Data(Content)` frame says so; a refused connect is an error
    /// reply (`NotFound`) and nothing else. Reply: `Done` once both
    /// directions have ended (or `Cancel`). Needs `Feature::PortForward`.
    ConnectPort { port: u16 },
}

/// Who a microVM restored from a memory image is (`Op::Reidentify`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct VmIdentity {
    pub sandbox_id: String,
    pub hostname: String,
    /// The host's wall clock, ms since the epoch.
    pub now_ms: u64,
    /// Random bytes from the host, for the guest's entropy pool.
    #[serde(with = "serde_bytes")]
    pub seed: Vec<u8>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Reply {
    Ready,
    Pong,
    Exited(ExecResult),
    Session { session_id: String },
    Stat(FileStat),
    Dir(Vec<FileStat>),
    Written { bytes: u64 },
    Done,
    Audit(AuditLog),
    Changed { paths: Vec<ChangedPath>, truncated: bool },
}

/// One refused attempt of a sandboxed process.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct AuditEvent {
    /// 1, 2, ... per sandbox (gaps: events dropped when the ring was full).
    pub seq: u64,
    /// Milliseconds since the epoch.
    pub time_ms: u64,
    /// What kind of attempt: `syscall` (a system call the policy refuses),
    /// `network` (a connection, packet or DNS query no rule allows),
    /// `masked_path` (an open of a path the sandbox's policy hides),
    /// `tamper` (a program the platform's commands go through was changed).
    pub kind: String,
    /// The pid inside the sandbox that made the attempt.
    pub pid: u32,
    /// What was refused, e.g. `mount` or `ioctl XFS_IOC_SWAPEXT`, and the
    /// errno the process got.
    pub detail: String,
}

/// The agent keeps the last events in a bounded ring; older ones are counted
/// as dropped, so a flood of attempts costs memory only up to that bound.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct AuditLog {
    pub events: Vec<AuditEvent>,
    /// Every event recorded since the sandbox started (kept or not).
    pub total: u64,
    /// Events that fell out of the ring before anyone read them.
    pub dropped: u64,
}

/// Audit events recorded since the sandbox started, by kind, in the order
/// kinds first occurred.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditTally {
    pub by_kind: Vec<(String, u64)>,
}

/// One entry of `Reply::Changed`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ChangedPath {
    /// The sandbox path (absolute).
    pub path: String,
    /// Removed (an overlay whiteout) rather than written or made.
    pub deleted: bool,
}

/// What the container agent needs to turn the namespaces it was started in
/// into a sandbox. Every path here is a host path, valid in the agent's mount
/// namespace before it pivots into the new root.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ContainerSetup {
    pub sandbox_id: String,
    pub hostname: String,
    /// Read-only layer directories (EROFS mounts), topmost first: the order
    /// of overlayfs `lowerdir`.
    pub lower_dirs: Vec<String>,
    /// An empty host directory on which the agent mounts the sandbox's own
    /// writable tmpfs (holding the overlay upper, work and merged root).
    /// Private to the new mount namespace, so every sandbox may share it.
    pub scratch_mount: String,
    /// Size limit of the writable layer (tmpfs `size=`).
    pub disk_limit_bytes: u64,
    /// A read-only sysfs the edge mounted once for every sandbox of the
    /// node (from an empty network namespace), bound at /sys. Empty: the
    /// agent mounts a sysfs of its own.
    pub sys_dir: String,
    /// Paths under /proc and /sys hidden from the sandbox (files get
    /// /dev/null, directories an empty read-only tmpfs).
    pub masked_paths: Vec<String>,
    /// Paths remounted read-only.
    pub readonly_paths: Vec<String>,
    /// Install the system-call filter (no_new_privs + seccomp, with the
    /// agent as the supervisor that records refused calls) on the agent
    /// and thus on every process of the sandbox. Off only when a node is
    /// configured without it (e.g. to measure its cost).
    pub syscall_filter: bool,
    /// The image's default environment for every command.
    pub env: Vec<(String, String)>,
    /// Default working directory for commands.
    pub workdir: String,
    /// Default user for commands (`init_user`): a name or uid from the
    /// image's /etc/passwd.
    pub default_user: String,
    /// The sandbox's `/etc/resolv.conf` (a networked sandbox's points at
    /// the node's resolver), written in the new root during setup rather
    /// than by a request after it (one round trip less on creation).
    pub resolv_conf: Option<String>,
    /// A host directory (the sandbox's own subvolume on the node's disk)
    /// bound at `scratch_mount` instead of a fresh tmpfs: the writable
    /// layer then lives on disk, bounded by that directory's quota, and
    /// `disk_limit_bytes` is not used.
    pub scratch_source: Option<String>,
    /// Named volumes bound into the root.
    pub volumes: Vec<VolumeBind>,
}

/// A host directory bound at a path of the sandbox's root.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct VolumeBind {
    /// The host directory (valid before the agent pivots).
    pub source: String,
    /// The absolute path in the sandbox (resolved inside its root).
    pub target: String,
    pub read_only: bool,
}

/// What a microVM's agent needs to build the sandbox inside the guest.
/// Disks are named by their virtio-blk serial (the guest finds them in
/// `/sys/block/*/serial`), never by probe order. A full VM's agent (a
/// service of the guest's own OS) gets no disks at all: the guest's root
/// is the sandbox's, and the setup only sets its clock and hostname.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct VmSetup {
    pub sandbox_id: String,
    pub hostname: String,
    /// Serials of the read-only EROFS layer disks, topmost first (the order
    /// of overlayfs `lowerdir`).
    pub layer_disks: Vec<String>,
    /// Serial of the sandbox's own ext4 disk (overlay upper and work).
    pub writable_disk: String,
    /// The host's wall clock (ms since the epoch): the guest starts with
    /// its RTC's second-granular time and is set to this.
    pub now_ms: u64,
    pub masked_paths: Vec<String>,
    pub readonly_paths: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: String,
    pub default_user: String,
    /// A networked full VM's NIC, which its agent configures during setup
    /// (a microVM's addressing comes on its kernel command line instead).
    pub nic: Option<VmNic>,
}

/// The addressing of a full VM's NIC: QEMU's user-mode network's, fixed.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct VmNic {
    /// How the agent finds the NIC: by the MAC address the edge gave it
    /// (the guest's udev names it, by its PCI slot).
    pub mac: String,
    pub address: std::net::Ipv4Addr,
    pub prefix: u8,
    pub gateway: std::net::Ipv4Addr,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Command {
    /// Run through the sandbox's shell: `/bin/sh -c STRING` (bash if the
    /// image has it).
    Shell(String),
    /// Run a program directly; `argv[0]` is looked up in `PATH`.
    Argv(Vec<String>),
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Stdin {
    /// stdin is /dev/null.
    Null,
    /// stdin is these bytes, then end of file.
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
    /// stdin arrives as `Data` frames until `Eof`.
    Stream,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ExecSpec {
    pub command: Command,
    /// Added to (and overriding) the image and session environment.
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    /// A user name or numeric uid of the sandbox; default: the sandbox's
    /// `init_user`.
    pub user: Option<String>,
    pub stdin: Stdin,
    pub stream_output: bool,
    /// SIGTERM to the process group after this long, SIGKILL after
    /// `kill_grace_ms` more; `timed_out` is then set.
    pub timeout_ms: Option<u64>,
    pub kill_grace_ms: u64,
    /// Per stream, output beyond this is read and discarded and `truncated`
    /// is set, so a flood never grows memory.
    pub max_output_bytes: u64,
    /// Run in this persistent shell session (its cwd and environment).
    pub session: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct ExecResult {
    /// Exit status if the process exited normally.
    pub exit_code: Option<i32>,
    /// Signal number if the process was killed by a signal.
    pub signal: Option<i32>,
    #[serde(with = "serde_bytes")]
    pub stdout: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub stderr: Vec<u8>,
    /// Output beyond `max_output_bytes` was discarded (either stream).
    pub truncated: bool,
    pub timed_out: bool,
    pub duration_us: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SessionSpec {
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub user: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PtySpec {
    /// Program to run; `None` runs the user's login shell.
    pub command: Option<Command>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub user: Option<String>,
    pub rows: u16,
    pub cols: u16,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct WriteFileSpec {
    pub path: String,
    /// Permission bits of a newly created file.
    pub mode: u32,
    pub append: bool,
    /// Create missing parent directories.
    pub create_parents: bool,
    /// Refuse (with `TooLarge`) content beyond this many bytes.
    pub max_bytes: u64,
    /// Owner of a newly created file: a user name or uid; default root.
    pub owner: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FileStat {
    /// The entry's name (its last path component).
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Target of a symlink.
    pub link_target: Option<String>,
}
