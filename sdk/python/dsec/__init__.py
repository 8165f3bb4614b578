"""dsec: the Python SDK of the dsec sandbox platform (asyncio).

::

    from dsec import DSecClient, DSecContainerRunArgs

    client = DSecClient()          # DSEC_ENDPOINT / DSEC_TOKEN
    await client.open()
    args = DSecContainerRunArgs(container_image="python", memory_limit_mb=1024,
                                cpu_cores_limit=1, ttl_running_stop=300,
                                network_rules={}, init_user="root")
    sandbox = await client.run_container(args, timeout=120)
    result = await sandbox.run_shell("echo hello world")
    await sandbox.stop()

For blocking code (scripts, notebooks) use :mod:`dsec.sync`, which offers the
same calls without ``await``.
"""

from . import errors
from .args import Backend, BaseRunArgs, DSecContainerRunArgs, DSecRunArgs, QosClass, RunArgs
from .client import DSecClient
from .fncall import CaseResult, FnCallResult, StepResult, TestCase
from .errors import (
    AgentUnavailable,
    PortClosed,
    AlreadyExists,
    CreationQueueFull,
    DirectoryNotEmpty,
    DSecConnectionError,
    DSecError,
    DSecTimeoutError,
    EdgeUnavailable,
    FileNotFound,
    Forbidden,
    ImageNotFound,
    Internal,
    InvalidLimits,
    InvalidNetworkRule,
    InvalidPath,
    InvalidRequest,
    IsADirectory,
    JobNotFound,
    MethodNotAllowed,
    NoCapacity,
    NetworkNotEnabled,
    NodeNotFound,
    JoinRefused,
    VolumeInUse,
    VolumeNotFound,
    VolumesUnavailable,
    NoSpace,
    NotADirectory,
    NotFound,
    BuildFailed,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    SandboxEnded,
    SandboxNotFound,
    SandboxNotRunning,
    JobAlreadyPaused,
    SessionNotFound,
    SpawnFailed,
    Timeout,
    Unauthorized,
    UnknownNetworkService,
    UnsupportedBackend,
    UnsupportedMediaType,
    UnsupportedNetworkPolicy,
    UserNotFound,
)
from .results import (
    AuditEvent,
    AuditEvents,
    BuildResult,
    ChangedFile,
    Divergence,
    ExecResult,
    FileInfo,
    Health,
    ImageInfo,
    JobActionResult,
    JobFailure,
    Limits,
    MetricsSample,
    NodeInfo,
    NodeMetrics,
    NodeMetricsSample,
    NodeStatus,
    OutputChunk,
    PackResult,
    SnapshotInfo,
    PauseResult,
    ReplayReport,
    ResumeResult,
    SandboxEvent,
    SandboxInfo,
    SandboxMetrics,
    TenantInfo,
    TrajectoryStep,
    TcpForward,
    VolumeInfo,
    WriteResult,
)
from .sandbox import Sandbox, Session
from .streams import ExecStream, Pty

__version__ = "0.1.0"

#: ``dsec.ConnectionError`` names the SDK's connection failure; it is kept out
#: of ``__all__`` so ``from dsec import *`` does not shadow the builtin.
ConnectionError = DSecConnectionError

__all__ = [
    "DSecClient",
    "FnCallResult",
    "StepResult",
    "CaseResult",
    "TestCase",
    "Sandbox",
    "Session",
    "ExecStream",
    "Pty",
    "Backend",
    "QosClass",
    "BaseRunArgs",
    "DSecRunArgs",
    "DSecContainerRunArgs",
    "RunArgs",
    "ExecResult",
    "OutputChunk",
    "SandboxInfo",
    "Limits",
    "MetricsSample",
    "NodeInfo",
    "NodeMetrics",
    "NodeMetricsSample",
    "SandboxMetrics",
    "FileInfo",
    "WriteResult",
    "ImageInfo",
    "BuildResult",
    "TenantInfo",
    "NodeStatus",
    "Health",
    "PackResult",
    "SnapshotInfo",
    "TcpForward",
    "VolumeInfo",
    "PauseResult",
    "ResumeResult",
    "JobActionResult",
    "JobFailure",
    "AuditEvent",
    "AuditEvents",
    "SandboxEvent",
    "TrajectoryStep",
    "ChangedFile",
    "ReplayReport",
    "Divergence",
    "DSecError",
    "DSecConnectionError",
    "DSecTimeoutError",
    "errors",
    "InvalidRequest",
    "InvalidLimits",
    "InvalidPath",
    "UnsupportedBackend",
    "UnsupportedNetworkPolicy",
    "UserNotFound",
    "SpawnFailed",
    "NotADirectory",
    "IsADirectory",
    "Unauthorized",
    "Forbidden",
    "PermissionDenied",
    "NotFound",
    "SandboxNotFound",
    "ImageNotFound",
    "FileNotFound",
    "SessionNotFound",
    "JobNotFound",
    "MethodNotAllowed",
    "SandboxNotRunning",
    "JobAlreadyPaused",
    "SandboxEnded",
    "AlreadyExists",
    "DirectoryNotEmpty",
    "BuildFailed",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "RateLimited",
    "CreationQueueFull",
    "Internal",
    "AgentUnavailable",
    "PortClosed",
    "NoCapacity",
    "EdgeUnavailable",
    "Timeout",
    "NoSpace",
    "InvalidNetworkRule",
    "UnknownNetworkService",
    "NetworkNotEnabled",
    "NodeNotFound",
    "JoinRefused",
    "VolumeInUse",
    "VolumeNotFound",
    "VolumesUnavailable",
]

# Codes newer than the explicit classes (generated from error_codes.json at
# import) are exported too.
for _name in errors.__all__:
    if _name not in __all__ and isinstance(getattr(errors, _name), type):
        globals()[_name] = getattr(errors, _name)
        __all__.append(_name)
del _name
