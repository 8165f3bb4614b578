"""Records the API returns: command results, sandbox records, file info...

Parsing is tolerant: fields a newer server adds are ignored, and fields an
older server lacks take neutral defaults, so the SDK and the server can be
upgraded independently.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ExecResult",
    "OutputChunk",
    "Limits",
    "SandboxInfo",
    "FileInfo",
    "WriteResult",
    "ImageInfo",
    "TenantInfo",
    "NodeStatus",
    "Health",
    "PauseResult",
    "ResumeResult",
    "JobActionResult",
    "JobFailure",
    "SandboxEvent",
    "ChangedFile",
    "TrajectoryStep",
    "Divergence",
    "ReplayReport",
    "VolumeInfo",
]


def _text(value: Any, encoding: str | None) -> str:
    if value is None:
        return ""
    if encoding == "base64":
        # Only when a caller asked for base64 output; decode for a str field.
        return base64.b64decode(value).decode("utf-8", "replace")
    return value  # type: ignore[no-any-return]


@dataclass(slots=True)
class ExecResult:
    """The result of a command.

    Attributes:
        exit_code: the exit status; 128 + N when killed by signal N.
        stdout: standard output (UTF-8; invalid sequences replaced).
        stderr: standard error (UTF-8; invalid sequences replaced).
        duration_ms: wall time of the command in milliseconds.
        truncated: some output was discarded because it exceeded the limit
            (``max_output_bytes``, 1 MiB per stream by default).
        timed_out: the command hit its timeout and was killed.
        signal: the signal that killed the process, if one did.
    """

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration_ms: float = 0.0
    truncated: bool = False
    timed_out: bool = False
    signal: int | None = None

    @property
    def ok(self) -> bool:
        """True when the command exited 0 and did not time out."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ExecResult:
        """Parse an ``ExecResponse`` (or the ``exit`` message of a stream)."""
        # The hot path of every exec: plain .get calls, no reflection.
        enc = d.get("encoding")
        return cls(
            d.get("exit_code", -1),
            _text(d.get("stdout"), enc),
            _text(d.get("stderr"), enc),
            d.get("duration_ms", 0.0),
            d.get("truncated", False),
            d.get("timed_out", False),
            d.get("signal"),
        )


@dataclass(slots=True)
class OutputChunk:
    """A piece of output from a streaming command.

    Attributes:
        stream: ``"stdout"`` or ``"stderr"``.
        data: the raw bytes, as the process wrote them. A chunk boundary may
            fall inside a multi-byte UTF-8 character.
    """

    stream: str
    data: bytes

    @property
    def text(self) -> str:
        """``data`` decoded as UTF-8 (invalid or split sequences replaced)."""
        return self.data.decode("utf-8", "replace")


@dataclass(slots=True)
class Limits:
    """Resource limits in force for a sandbox."""

    memory_limit_mb: int = 0
    cpu_cores_limit: float = 0.0
    disk_limit_mb: int = 0
    pids_limit: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> Limits:
        """Parse a ``Limits`` from its JSON object."""
        d = d or {}
        return cls(
            d.get("memory_limit_mb", 0),
            d.get("cpu_cores_limit", 0.0),
            d.get("disk_limit_mb", 0),
            d.get("pids_limit", 0),
        )


@dataclass(slots=True)
class SandboxInfo:
    """A sandbox record as the API reports it.

    Attributes:
        id: the sandbox id (it encodes the node that owns the sandbox).
        backend: ``container``, ``microvm``, ``vm`` or ``fncall``.
        image: the base image.
        state: ``queued``, ``creating``, ``running``, ``pausing``, ``paused``,
            ``resuming``, ``stopping``, ``stopped``, ``failed`` or ``unknown``
            (the owning node cannot be reached).
        state_reason: why the sandbox stopped or failed (``idle timeout``...),
            or, while it runs, a condition to know of (a full VM at its
            disk limit: ``disk limit reached: ...``).
        node: the node that runs it.
        project: the project it belongs to (its creator's token's project).
        limits: the limits in force.
        qos_class: the CPU QoS class, ``latency_sensitive`` or ``best_effort``.
        created_at, last_active_at, stopped_at: RFC 3339 times.
        create_ms: milliseconds from the create request to a running sandbox.
        queue_position: while ``queued``, creations served before this one.
        paused_at: while paused, when the pause began (RFC 3339).
        memory_freed_bytes: resident memory the last pause pushed out of RAM.
        suspended: while paused, True if suspended to disk (no process runs;
            a microVM) rather than frozen.
        raw: the record as received, including fields this SDK does not know.
    """

    id: str
    backend: str = "container"
    image: str = ""
    workspace: str | None = None
    toolkits: list[str] = field(default_factory=list)
    state: str = "unknown"
    state_reason: str | None = None
    node: str = ""
    project: str = ""
    limits: Limits = field(default_factory=Limits)
    qos_class: str = "latency_sensitive"
    init_user: str = ""
    ttl_running_stop: int = 0
    max_lifetime_s: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    job: str | None = None
    created_at: str = ""
    last_active_at: str = ""
    stopped_at: str | None = None
    create_ms: float | None = None
    queue_position: int | None = None
    paused_at: str | None = None
    memory_freed_bytes: int | None = None
    suspended: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_paused(self) -> bool:
        """True while the state is ``paused``."""
        return self.state == "paused"

    @property
    def is_running(self) -> bool:
        """True while the state is ``running``."""
        return self.state == "running"

    @property
    def is_terminal(self) -> bool:
        """True once the sandbox is ``stopped`` or ``failed``."""
        return self.state in ("stopped", "failed")

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SandboxInfo:
        """Parse a ``Sandbox`` record."""
        return cls(
            id=d["id"],
            backend=d.get("backend", "container"),
            image=d.get("image", ""),
            workspace=d.get("workspace"),
            toolkits=list(d.get("toolkits") or ()),
            state=d.get("state", "unknown"),
            state_reason=d.get("state_reason"),
            node=d.get("node", ""),
            project=d.get("project", ""),
            limits=Limits.from_json(d.get("limits")),
            qos_class=d.get("qos_class", "latency_sensitive"),
            init_user=d.get("init_user", ""),
            ttl_running_stop=d.get("ttl_running_stop", 0),
            max_lifetime_s=d.get("max_lifetime_s", 0),
            labels=dict(d.get("labels") or {}),
            job=d.get("job"),
            created_at=d.get("created_at", ""),
            last_active_at=d.get("last_active_at", ""),
            stopped_at=d.get("stopped_at"),
            create_ms=d.get("create_ms"),
            queue_position=d.get("queue_position"),
            paused_at=d.get("paused_at"),
            memory_freed_bytes=d.get("memory_freed_bytes"),
            suspended=bool(d.get("suspended", False)),
            raw=d,
        )


@dataclass(slots=True)
class FileInfo:
    """A file's metadata (``stat``), or one entry of a directory listing.

    Attributes:
        name: the last path component.
        path: the full path in the sandbox.
        type: ``file``, ``dir``, ``symlink`` or ``other``.
        size: size in bytes.
        mode: permission bits, e.g. ``0o644``.
        uid, gid: owner.
        mtime: modification time, seconds since the epoch.
        link_target: target of a symlink.
    """

    name: str
    path: str
    type: str
    size: int = 0
    mode: int = 0
    uid: int = 0
    gid: int = 0
    mtime: int = 0
    link_target: str | None = None

    @property
    def is_dir(self) -> bool:
        """True for a directory."""
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        """True for a regular file."""
        return self.type == "file"

    @property
    def is_symlink(self) -> bool:
        """True for a symbolic link."""
        return self.type == "symlink"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FileInfo:
        """Parse a ``FileInfo`` object."""
        return cls(
            d.get("name", ""),
            d.get("path", ""),
            d.get("type", "other"),
            d.get("size", 0),
            d.get("mode", 0),
            d.get("uid", 0),
            d.get("gid", 0),
            d.get("mtime", 0),
            d.get("link_target"),
        )


@dataclass(slots=True)
class WriteResult:
    """Answer to a file or archive upload: where, and how many bytes."""

    path: str
    bytes: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WriteResult:
        """Parse a ``WriteResult`` from its JSON object."""
        return cls(d.get("path", ""), d.get("bytes", 0))


@dataclass(slots=True)
class BuildResult:
    """A finished Dockerfile build: the image and what it took."""

    image: str
    layers: int = 0
    size_bytes: int = 0
    steps: int = 0
    cached_steps: int = 0
    ms: float = 0.0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BuildResult:
        """Parse a ``BuildResult`` from the build's ``done`` event."""
        return cls(d.get("image", ""), d.get("layers", 0), d.get("size_bytes", 0),
                   d.get("steps", 0), d.get("cached_steps", 0), float(d.get("ms", 0.0)))


@dataclass(slots=True)
class ImageInfo:
    """An image: an ordered list of read-only layers plus defaults."""

    name: str
    layers: list[str] = field(default_factory=list)
    size_bytes: int = 0
    created_at: str = ""
    env: list[str] = field(default_factory=list)
    workdir: str = ""
    user: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ImageInfo:
        """Parse an ``ImageInfo`` from its JSON object."""
        return cls(
            d.get("name", ""),
            list(d.get("layers") or ()),
            d.get("size_bytes", 0),
            d.get("created_at", ""),
            list(d.get("env") or ()),
            d.get("workdir", ""),
            d.get("user", ""),
        )


@dataclass(slots=True)
class TenantInfo:
    """A tenant. ``token`` is only set in the answer that created it."""

    name: str
    admin: bool = False
    token: str | None = None
    created_at: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TenantInfo:
        """Parse a ``TenantInfo`` from its JSON object."""
        return cls(d.get("name", ""), d.get("admin", False), d.get("token"),
                   d.get("created_at", ""))


@dataclass(slots=True)
class NodeStatus:
    """A node (edge) as the apiserver sees it."""

    name: str
    healthy: bool = False
    sandboxes: int = 0
    cpu_reserved: float = 0.0
    cpu_capacity: float = 0.0
    memory_reserved_mb: int = 0
    memory_capacity_mb: int = 0
    cgroup_version: int = 0
    #: Sandboxes being created, waiting in the creation queue, and paused.
    creating: int = 0
    queued: int = 0
    paused: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeStatus:
        """Parse a ``NodeStatus`` from its JSON object."""
        return cls(
            d.get("name", ""),
            d.get("healthy", False),
            d.get("sandboxes", 0),
            d.get("cpu_reserved", 0.0),
            d.get("cpu_capacity", 0.0),
            d.get("memory_reserved_mb", 0),
            d.get("memory_capacity_mb", 0),
            d.get("cgroup_version", 0),
            d.get("creating", 0),
            d.get("queued", 0),
            d.get("paused", 0),
        )


@dataclass(slots=True)
class Health:
    """``GET /healthz``: server status, version and nodes."""

    status: str
    version: str = ""
    nodes: list[NodeStatus] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Health:
        """Parse a ``Health`` from its JSON object."""
        return cls(d.get("status", ""), d.get("version", ""),
                   [NodeStatus.from_json(n) for n in d.get("nodes") or ()])


@dataclass(slots=True)
class SnapshotInfo:
    """A VM disk snapshot (:meth:`Sandbox.snapshot`, of a microVM or a full
    VM); start VMs from it with ``DSecRunArgs(snapshot=name)`` or
    :meth:`DSecClient.fork`.

    Attributes:
        name, id: its name (unique per tenant) and the node's id for it.
        source: the sandbox it was taken from.
        image, workspace, toolkits: the image stack it runs on.
        disk_limit_mb: the size of its disk.
        parent: the snapshot it chains onto (None: the empty disk).
        backend: what sandboxes started from it are (``microvm`` or ``vm``).
        bytes: bytes its own layer takes (what the source changed).
        created: False if an earlier call with the same idempotency key made it.
        frozen_ms: how long the source's vCPUs were stopped for the copy.
        memory: a memory snapshot (microVMs): sandboxes started from it
            continue the source's processes instead of booting.
    """

    name: str
    id: str = ""
    source: str = ""
    image: str = ""
    workspace: str | None = None
    toolkits: list[str] = field(default_factory=list)
    disk_limit_mb: int = 0
    parent: str | None = None
    bytes: int = 0
    created_at: str = ""
    backend: str = "microvm"
    created: bool = True
    frozen_ms: float = 0.0
    memory: bool = False

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SnapshotInfo:
        """Parse a ``Snapshot``."""
        return cls(name=d["name"], id=d.get("id", ""), source=d.get("source", ""),
                   image=d.get("image", ""), workspace=d.get("workspace"),
                   toolkits=list(d.get("toolkits", ())), disk_limit_mb=d.get("disk_limit_mb", 0),
                   parent=d.get("parent"), bytes=d.get("bytes", 0),
                   created_at=d.get("created_at", ""), created=bool(d.get("created", True)),
                   frozen_ms=d.get("frozen_ms", 0.0), backend=d.get("backend", "microvm"),
                   memory=bool(d.get("memory", False)))


@dataclass(slots=True)
class TcpForward:
    """A port of a sandbox published as a plain TCP port of its node
    (:meth:`Sandbox.forward_tcp`).

    Attributes:
        port: the sandbox's port.
        address: ``HOST:PORT`` to connect to.
        host: the host part of it.
        node_port: the node's port the forward listens on.
        expires_at: Unix seconds at which it closes (earlier if the sandbox
            stops).
        allow_from: the source prefixes it accepts (empty: any).
    """

    port: int
    address: str
    host: str
    node_port: int
    expires_at: int
    allow_from: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TcpForward:
        """Parse a ``TcpForward``."""
        return cls(port=d["port"], address=d["address"], host=d["host"], node_port=d["node_port"],
                   expires_at=d["expires_at"], allow_from=list(d.get("allow_from") or []))


@dataclass(slots=True)
class VolumeInfo:
    """A named volume (:meth:`DSecClient.create_volume`): a directory on the
    node's disk, bounded by its size, that sandboxes mount with
    ``volumes={"/data": name}`` and that outlives them until removed.

    Attributes:
        name: its name (unique per tenant on the node).
        size_mb: the most it may hold, in MiB.
        used_bytes: what its files hold now.
        created_at: RFC 3339.
        sandboxes: the sandboxes, not yet stopped, that mount it.
    """

    name: str
    size_mb: int = 0
    used_bytes: int = 0
    created_at: str = ""
    sandboxes: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VolumeInfo:
        """Parse a ``Volume``."""
        return cls(name=d["name"], size_mb=d.get("size_mb", 0), used_bytes=d.get("used_bytes", 0),
                   created_at=d.get("created_at", ""), sandboxes=list(d.get("sandboxes", ())))


@dataclass(slots=True)
class PackResult:
    """What :meth:`Sandbox.pack_diff` did.

    Attributes:
        image: the image written; start sandboxes from it (or :meth:`DSecClient.fork`).
        layer, layer_size: the new layer (``sha256:...``) and its size in bytes.
        layers: layers of the new image.
        incremental: True if only the changes since the sandbox's previous
            pack went into the layer.
        entries, bytes: files/links/directories copied and bytes of content.
        whiteouts: deletions recorded.
        scrubbed: entries left out by the scrub list.
        frozen_ms: how long the sandbox was frozen for the copy.
        build_ms: how long building the layer took.
        created: False if an earlier call with the same idempotency key
            packed it (this is that pack's report; nothing was packed now).
    """

    image: str
    layer: str
    layer_size: int = 0
    layers: int = 0
    incremental: bool = False
    entries: int = 0
    bytes: int = 0
    whiteouts: int = 0
    scrubbed: int = 0
    frozen_ms: float = 0.0
    build_ms: float = 0.0
    created: bool = True

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PackResult:
        """Parse a ``PackResult``."""
        return cls(image=d["image"], layer=d["layer"], layer_size=d.get("layer_size", 0),
                   layers=d.get("layers", 0), incremental=bool(d.get("incremental")),
                   entries=d.get("entries", 0), bytes=d.get("bytes", 0),
                   whiteouts=d.get("whiteouts", 0), scrubbed=d.get("scrubbed", 0),
                   frozen_ms=d.get("frozen_ms", 0.0), build_ms=d.get("build_ms", 0.0),
                   created=bool(d.get("created", True)))


@dataclass(slots=True)
class PauseResult:
    """What :meth:`Sandbox.pause` did.

    Attributes:
        sandbox: the record after the pause.
        changed: False if the sandbox was already paused.
        memory_before_bytes, memory_after_bytes: the sandbox's memory charge
            before and after its memory was pushed out of RAM.
        memory_freed_bytes: the difference.
        duration_ms: time the pause took on the server.
        suspended: True if the sandbox was suspended to disk (a microVM: its
            memory and device state saved, its process ended).
        disk_bytes: bytes the suspend image occupies on disk.
    """

    sandbox: SandboxInfo
    changed: bool
    memory_before_bytes: int = 0
    memory_after_bytes: int = 0
    memory_freed_bytes: int = 0
    duration_ms: float = 0.0
    suspended: bool = False
    disk_bytes: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PauseResult:
        """Parse a ``PauseResult``."""
        return cls(sandbox=SandboxInfo.from_json(d["sandbox"]), changed=bool(d.get("changed")),
                   memory_before_bytes=d.get("memory_before_bytes", 0),
                   memory_after_bytes=d.get("memory_after_bytes", 0),
                   memory_freed_bytes=d.get("memory_freed_bytes", 0),
                   duration_ms=d.get("duration_ms", 0.0),
                   suspended=bool(d.get("suspended", False)),
                   disk_bytes=d.get("disk_bytes", 0))


@dataclass(slots=True)
class ResumeResult:
    """What :meth:`Sandbox.resume` did (``changed`` is False if it was running)."""

    sandbox: SandboxInfo
    changed: bool
    duration_ms: float = 0.0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ResumeResult:
        """Parse a ``ResumeResult``."""
        return cls(sandbox=SandboxInfo.from_json(d["sandbox"]), changed=bool(d.get("changed")),
                   duration_ms=d.get("duration_ms", 0.0))


@dataclass(slots=True)
class JobFailure:
    """A sandbox a job-wide action could not change (``id`` is ``node:NAME``
    for a node that could not be reached)."""

    id: str
    code: str
    message: str


@dataclass(slots=True)
class JobActionResult:
    """What :meth:`DSecClient.pause_job` or :meth:`DSecClient.resume_job` did.

    Attributes:
        job: the job.
        matched: its sandboxes this token sees, on every node.
        changed: sandboxes whose state changed.
        unchanged: already in the asked-for state (the calls are idempotent).
        ended: stopped or failed ones, skipped.
        memory_freed_bytes: memory pushed out of RAM (pause).
        failed: the sandboxes that could not change, with the reason.
        duration_ms: time the whole call took on the server.
    """

    job: str
    matched: int = 0
    changed: int = 0
    unchanged: int = 0
    ended: int = 0
    memory_freed_bytes: int = 0
    failed: list[JobFailure] = field(default_factory=list)
    duration_ms: float = 0.0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobActionResult:
        """Parse a ``JobActionResult``."""
        return cls(job=d.get("job", ""), matched=d.get("matched", 0), changed=d.get("changed", 0),
                   unchanged=d.get("unchanged", 0), ended=d.get("ended", 0),
                   memory_freed_bytes=d.get("memory_freed_bytes", 0),
                   failed=[JobFailure(f.get("id", ""), f.get("code", ""), f.get("message", ""))
                           for f in d.get("failed") or ()],
                   duration_ms=d.get("duration_ms", 0.0))


@dataclass(slots=True)
class AuditEvent:
    """One attempt the sandbox's policy refused (see :meth:`Sandbox.audit_events`)."""

    seq: int
    time_ms: int
    kind: str
    pid: int
    detail: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AuditEvent:
        """Parse one event of ``GET /v1/sandboxes/{id}/audit``."""
        return cls(seq=d["seq"], time_ms=d.get("time_ms", 0), kind=d.get("kind", ""),
                   pid=d.get("pid", 0), detail=d.get("detail", ""))


@dataclass(slots=True)
class AuditEvents:
    """A page of audit events, with the sandbox's totals."""

    events: list[AuditEvent]
    total: int
    dropped: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AuditEvents:
        """Parse ``GET /v1/sandboxes/{id}/audit``."""
        return cls(events=[AuditEvent.from_json(e) for e in d.get("events") or ()],
                   total=d.get("total", 0), dropped=d.get("dropped", 0))


@dataclass(slots=True)
class MetricsSample:
    """One second of a sandbox's resource use."""

    time_ms: int
    #: CPU time used over that second, in cores (1.0: one core busy).
    cpu_cores: float
    memory_bytes: int
    #: Processes and threads.
    pids: int
    #: What its writable layer holds (None where the backend cannot say).
    disk_bytes: int | None = None
    #: Bytes per second over its network interfaces, loopback left out
    #: (None where it has no network namespace of its own: VMs).
    net_rx_bytes_per_s: int | None = None
    net_tx_bytes_per_s: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MetricsSample:
        """Parse one sample of ``GET /v1/sandboxes/{id}/metrics``."""
        return cls(time_ms=d["time_ms"], cpu_cores=float(d["cpu_cores"]), memory_bytes=d["memory_bytes"],
                   pids=d["pids"], disk_bytes=d.get("disk_bytes"),
                   net_rx_bytes_per_s=d.get("net_rx_bytes_per_s"),
                   net_tx_bytes_per_s=d.get("net_tx_bytes_per_s"))


@dataclass(slots=True)
class SandboxMetrics:
    """A sandbox's recent resource use, one sample a second, oldest first.

    A paused sandbox is not sampled (its series has a gap); a new one has
    its first sample after two seconds."""

    sandbox_id: str
    state: str
    limits: Limits
    interval_ms: int
    samples: list[MetricsSample]
    #: Bytes received and sent since its network namespace was made.
    net_rx_bytes: int | None = None
    net_tx_bytes: int | None = None

    @property
    def latest(self) -> MetricsSample | None:
        """The newest sample, if there is one."""
        return self.samples[-1] if self.samples else None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SandboxMetrics:
        """Parse ``GET /v1/sandboxes/{id}/metrics``."""
        return cls(sandbox_id=d["sandbox_id"], state=d["state"], limits=Limits.from_json(d.get("limits")),
                   interval_ms=d["interval_ms"],
                   samples=[MetricsSample.from_json(s) for s in d.get("samples") or ()],
                   net_rx_bytes=d.get("net_rx_bytes"), net_tx_bytes=d.get("net_tx_bytes"))


@dataclass(slots=True)
class NodeInfo:
    """A node of the cluster as ``GET /v1/nodes`` shows it."""

    name: str
    #: ``ready``, ``draining`` (no new placements) or ``unreachable``.
    state: str
    backends: list[str]
    labels: dict[str, str]
    cpu_reserved: float
    cpu_capacity: float
    memory_reserved_mb: int
    memory_capacity_mb: int
    #: Sandboxes admitted (running or starting) and the node's maximum.
    slots_used: int
    slots_capacity: int
    creating: int = 0
    queued: int = 0
    paused: int = 0
    sandboxes_by_backend: dict[str, int] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        """Whether placement may send new sandboxes here."""
        return self.state == "ready"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeInfo:
        """Parse one entry of ``GET /v1/nodes``."""
        state = d.get("state") or ("ready" if d.get("healthy") else "unreachable")
        return cls(name=d["name"], state=state, backends=list(d.get("backends") or ()),
                   labels=dict(d.get("labels") or {}),
                   cpu_reserved=float(d.get("cpu_reserved", 0.0)),
                   cpu_capacity=float(d.get("cpu_capacity", 0.0)),
                   memory_reserved_mb=d.get("memory_reserved_mb", 0),
                   memory_capacity_mb=d.get("memory_capacity_mb", 0),
                   slots_used=d.get("slots_used", 0), slots_capacity=d.get("slots_capacity", 0),
                   creating=d.get("creating", 0), queued=d.get("queued", 0),
                   paused=d.get("paused", 0), sandboxes_by_backend=dict(d.get("sandboxes_by_backend") or {}))


@dataclass(slots=True)
class NodeMetricsSample:
    """One second of a node's resource use."""

    time_ms: int
    #: CPU busy over that second on the whole host, in cores.
    cpu_cores: float
    #: Memory in use on the host (total less available).
    memory_bytes: int
    swap_bytes: int
    #: Sandboxes running on the node at that moment.
    sandboxes: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeMetricsSample:
        """Parse one sample of ``GET /v1/nodes/{node}/metrics``."""
        return cls(time_ms=d["time_ms"], cpu_cores=float(d["cpu_cores"]), memory_bytes=d["memory_bytes"],
                   swap_bytes=d["swap_bytes"], sandboxes=d["sandboxes"])


@dataclass(slots=True)
class NodeMetrics:
    """A node's recent resource use, one sample a second, oldest first."""

    node: str
    interval_ms: int
    cpus: int
    memory_total_bytes: int
    samples: list[NodeMetricsSample]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeMetrics:
        """Parse ``GET /v1/nodes/{node}/metrics``."""
        return cls(node=d["node"], interval_ms=d["interval_ms"], cpus=d["cpus"],
                   memory_total_bytes=d["memory_total_bytes"],
                   samples=[NodeMetricsSample.from_json(s) for s in d.get("samples") or ()])


@dataclass(slots=True)
class SandboxEvent:
    """One state change from :meth:`Sandbox.events` or :meth:`DSecClient.job_events`."""

    id: str
    state: str
    job: str | None = None
    state_reason: str | None = None
    at: str = ""
    queue_position: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SandboxEvent:
        """Parse one line of an event stream."""
        return cls(id=d["id"], state=d.get("state", "unknown"), job=d.get("job"),
                   state_reason=d.get("state_reason"), at=d.get("at", ""),
                   queue_position=d.get("queue_position"))


@dataclass(slots=True)
class ChangedFile:
    """A file an operation wrote, made or removed (``change``: ``changed`` or
    ``deleted``)."""

    path: str
    change: str = "changed"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ChangedFile:
        """Parse a ``ChangedFile`` from its JSON object."""
        return cls(d.get("path", ""), d.get("change", "changed"))


@dataclass(slots=True)
class TrajectoryStep:
    """One operation of a sandbox's trajectory log.

    ``kind`` is ``exec`` (buffered or streamed), ``pty`` (an interactive
    terminal, from open to exit), ``open_session``, ``close_session``,
    ``write_file``, ``mkdir``, ``remove`` or ``extract_archive``; ``status``
    is ``done``, ``running`` or ``interrupted`` (it was running when the edge
    lost it, or its client left a streamed command before its end).
    ``result`` is what the operation's call returned (an :class:`ExecResult`
    for ``exec`` and ``pty``), ``error`` the error it raised, ``changed_files`` the
    files changed while it ran (``None`` when unknown).
    """

    seq: int
    kind: str
    status: str
    step_id: str | None = None
    operation: dict[str, Any] = field(default_factory=dict)
    result: ExecResult | dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    changed_files: list[ChangedFile] | None = None
    changed_truncated: bool = False
    started_at: str = ""
    finished_at: str | None = None

    @property
    def command(self) -> str | None:
        """The command line (or argv joined) of an ``exec`` step."""
        cmd = self.operation.get("spec", {}).get("command") if self.kind == "exec" else None
        if isinstance(cmd, dict):
            if "Shell" in cmd:
                return str(cmd["Shell"])
            if "Argv" in cmd:
                return " ".join(cmd["Argv"])
        return None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TrajectoryStep:
        """Parse a ``TrajectoryStep`` from its JSON object."""
        kind = d.get("kind", "")
        raw = d.get("result")
        result: ExecResult | dict[str, Any] | None = raw
        if kind in ("exec", "pty") and isinstance(raw, dict):
            result = ExecResult.from_json(raw)
        changed = d.get("changed_files")
        return cls(
            seq=d.get("seq", 0),
            kind=kind,
            status=d.get("status", ""),
            step_id=d.get("step_id"),
            operation=d.get("operation") or {},
            result=result,
            error=d.get("error"),
            changed_files=None if changed is None else [ChangedFile.from_json(c) for c in changed],
            changed_truncated=d.get("changed_truncated", False),
            started_at=d.get("started_at", ""),
            finished_at=d.get("finished_at"),
        )


@dataclass(slots=True)
class Divergence:
    """Where a replayed step's outcome differs from the recorded one
    (``field``: ``exit_code``, ``signal``, ``stdout``, ``stderr``, ``error`` or
    ``skipped``)."""

    seq: int
    kind: str
    field: str
    recorded: str
    replayed: str
    step_id: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Divergence:
        """Parse a ``Divergence`` from its JSON object."""
        return cls(d.get("seq", 0), d.get("kind", ""), d.get("field", ""),
                   d.get("recorded", ""), d.get("replayed", ""), d.get("step_id"))


@dataclass(slots=True)
class ReplayReport:
    """The outcome of :meth:`Sandbox.replay`."""

    source_id: str
    replay_id: str
    steps: int
    replayed: int
    identical: bool
    kept: bool = False
    divergences: list[Divergence] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReplayReport:
        """Parse a ``ReplayReport`` from its JSON object."""
        return cls(
            source_id=d.get("source_id", ""),
            replay_id=d.get("replay_id", ""),
            steps=d.get("steps", 0),
            replayed=d.get("replayed", 0),
            identical=d.get("identical", False),
            kept=d.get("kept", False),
            divergences=[Divergence.from_json(x) for x in d.get("divergences", ())],
        )
