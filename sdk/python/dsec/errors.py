"""Typed exceptions for every failure the dsec API can report.

The server answers each failure with ``{"error": {"code": CODE, "message": TEXT}}``
and an HTTP status taken from one table (``error_codes.json``, generated from the
Rust crate ``dsec-api``). Each code has its own exception class here, named by
turning the code into CamelCase (``sandbox_not_found`` -> :class:`SandboxNotFound`).

The classes are declared explicitly below so type checkers and IDEs see them,
and checked at import against the JSON table the package ships. A code present
in the table but not declared here (a table newer than this module) still gets
a class, generated at import. A code the table does not know at all (a server
newer than this SDK) is raised as the base class :class:`DSecError`, with its
``code`` attribute set to what the server sent.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

__all__ = [
    "DSecError",
    "DSecConnectionError",
    "DSecTimeoutError",
    "ERROR_CODES",
    "error_class",
    "error_from_body",
    "error_from_detail",
    # Generated from the table; the explicit ones follow.
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
    "SnapshotNotFound",
    "ImageNotFound",
    "FileNotFound",
    "SessionNotFound",
    "JobNotFound",
    "TrajectoryNotFound",
    "MethodNotAllowed",
    "SandboxNotRunning",
    "JobAlreadyPaused",
    "SandboxEnded",
    "AlreadyExists",
    "DirectoryNotEmpty",
    "StepConflict",
    "StepInterrupted",
    "IdempotencyConflict",
    "NoScreen",
    "SnapshotInUse",
    "ProjectNotEmpty",
    "BuildFailed",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "QuotaExceeded",
    "RateLimited",
    "CreationQueueFull",
    "Internal",
    "AgentUnavailable",
    "PortClosed",
    "NoCapacity",
    "EdgeUnavailable",
    "Timeout",
    "NoSpace",
]


class DSecError(Exception):
    """Base class of every error the SDK raises for a failed dsec call.

    Attributes:
        code: the machine-readable code (``"sandbox_not_found"``...). For a
            class made for one code, this equals the class attribute ``code``.
        message: the human-readable text the server sent.
        status: the HTTP status of the answer, or ``None`` when no answer came
            (connection failure, client-side timeout).
        retry_after: seconds from a ``Retry-After`` header, when the server
            sent one (rate limiting, no capacity).
    """

    #: The wire code this class stands for (``None`` on the base class).
    code: str | None = None
    #: The HTTP status the table gives this code.
    http_status: int | None = None
    #: The table's description of the code.
    description: str = ""

    def __init__(
        self,
        code: str | None,
        message: str,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        # args keeps every constructor argument, so errors survive pickling
        # (multiprocessing, concurrent.futures) as the same class.
        super().__init__(code, message, status, retry_after)
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{self.code}: {self.message}{where}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"status={self.status!r})"
        )


# --- One class per code in the table. -------------------------------------
# Keep this list in the table's order; the import-time check below names any
# disagreement with error_codes.json.


class InvalidRequest(DSecError):
    """The request is malformed: bad JSON, an unknown field, a missing or ill-typed value."""

    code = "invalid_request"


class InvalidLimits(DSecError):
    """A resource limit is impossible (zero, negative, or above the node's maximum)."""

    code = "invalid_limits"


class InvalidPath(DSecError):
    """A file path is not absolute, contains '..', or is otherwise unusable."""

    code = "invalid_path"


class UnsupportedBackend(DSecError):
    """The requested backend is not available on this platform."""

    code = "unsupported_backend"


class UnsupportedNetworkPolicy(DSecError):
    """The requested network rules cannot be enforced by this platform."""

    code = "unsupported_network_policy"


class UserNotFound(DSecError):
    """The named user does not exist in the sandbox's image."""

    code = "user_not_found"


class SpawnFailed(DSecError):
    """The program could not be started (not found or not executable)."""

    code = "spawn_failed"


class NotADirectory(DSecError):
    """A path component that must be a directory is not one."""

    code = "not_a_directory"


class IsADirectory(DSecError):
    """The path is a directory where a file was expected."""

    code = "is_a_directory"


class Unauthorized(DSecError):
    """The bearer token is missing or wrong."""

    code = "unauthorized"


class Forbidden(DSecError):
    """The token is valid but may not do this (e.g. an admin-only call)."""

    code = "forbidden"


class PermissionDenied(DSecError):
    """The sandbox's filesystem refused the operation."""

    code = "permission_denied"


class NotFound(DSecError):
    """No such route or resource."""

    code = "not_found"


class SandboxNotFound(DSecError):
    """No sandbox with this id is visible to this tenant."""

    code = "sandbox_not_found"


class SnapshotNotFound(DSecError):
    """No microVM snapshot with this name is visible to this tenant on the node."""

    code = "snapshot_not_found"


class ImageNotFound(DSecError):
    """No image or layer with this name exists."""

    code = "image_not_found"


class FileNotFound(DSecError):
    """No file or directory at this path in the sandbox."""

    code = "file_not_found"


class SessionNotFound(DSecError):
    """No terminal session with this id in the sandbox."""

    code = "session_not_found"


class JobNotFound(DSecError):
    """No sandbox of this job is visible to this tenant."""

    code = "job_not_found"


class TrajectoryNotFound(DSecError):
    """The sandbox has no trajectory log (no operation was recorded in it)."""

    code = "trajectory_not_found"


class MethodNotAllowed(DSecError):
    """The route exists but not for this HTTP method."""

    code = "method_not_allowed"


class JobAlreadyPaused(DSecError):
    """Every live sandbox of this job is already paused: nothing was done."""

    code = "job_already_paused"


class SandboxNotRunning(DSecError):
    """The sandbox is not running (stopped, failed or still starting)."""

    code = "sandbox_not_running"


class SandboxEnded(DSecError):
    """The sandbox has stopped or failed, or was stopped before it started: its processes are gone, so it cannot be paused, resumed or waited for."""

    code = "sandbox_ended"


class AlreadyExists(DSecError):
    """Something already exists at this path or with this name."""

    code = "already_exists"


class DirectoryNotEmpty(DSecError):
    """The directory is not empty (use recursive removal)."""

    code = "directory_not_empty"


class StepConflict(DSecError):
    """The step id is already in the sandbox's trajectory log for a different operation; a step id names one operation."""

    code = "step_conflict"


class StepInterrupted(DSecError):
    """The step with this id was running when the edge lost it; whether it took effect is unknown. Check the sandbox and continue with a new step id."""

    code = "step_interrupted"


class IdempotencyConflict(DSecError):
    """The idempotency key was already used by this tenant for a different request."""

    code = "idempotency_conflict"


class NoScreen(DSecError):
    """The sandbox has no screen: screenshots and keyboard and mouse input need a full VM (backend "vm")."""

    code = "no_screen"


class SnapshotInUse(DSecError):
    """The snapshot still backs other disks (a snapshot chained onto it, or a live sandbox started from it): delete those first."""

    code = "snapshot_in_use"


class ProjectNotEmpty(DSecError):
    """The project still has sub-projects or live sandboxes: delete those first."""

    code = "project_not_empty"


class BuildFailed(DSecError):
    """A step of an image build failed (a RUN command exited with an error, a COPY source is missing); the message names the step's line and ends with the command's output."""

    code = "build_failed"


class PayloadTooLarge(DSecError):
    """The upload is larger than the allowed maximum."""

    code = "payload_too_large"


class UnsupportedMediaType(DSecError):
    """The request body must be JSON (Content-Type: application/json)."""

    code = "unsupported_media_type"


class QuotaExceeded(DSecError):
    """A quota of the sandbox's project or of a project above it is used up; the message names the project and the limit."""

    code = "quota_exceeded"


class RateLimited(DSecError):
    """Too many requests; retry after ``retry_after`` seconds."""

    code = "rate_limited"


class CreationQueueFull(DSecError):
    """The node's creation queue is full; retry after ``retry_after`` seconds."""

    code = "creation_queue_full"


class Internal(DSecError):
    """An unexpected fault in the platform; it was logged."""

    code = "internal"


class AgentUnavailable(DSecError):
    """The sandbox's guest agent stopped answering; the sandbox is being marked failed."""

    code = "agent_unavailable"


class PortClosed(DSecError):
    """Nothing accepts connections on this port of the sandbox (no server listens on its loopback there)."""

    code = "port_closed"


class NoCapacity(DSecError):
    """No node has room for this sandbox now (admission refused)."""

    code = "no_capacity"


class EdgeUnavailable(DSecError):
    """The node that owns this sandbox cannot be reached."""

    code = "edge_unavailable"


class Timeout(DSecError):
    """The operation did not finish within its deadline."""

    code = "timeout"


class NoSpace(DSecError):
    """The sandbox's disk is full."""

    code = "no_space"


class InvalidNetworkRule(DSecError):
    """A network rule is not a service, an IPv4 prefix or a domain, or names the sandbox subnet."""

    code = "invalid_network_rule"


class UnknownNetworkService(DSecError):
    """A network rule names a service this node's network configuration does not define."""

    code = "unknown_network_service"


class NetworkNotEnabled(DSecError):
    """The sandbox was created without network rules: loopback only, its rules cannot change."""

    code = "network_not_enabled"


class NodeNotFound(DSecError):
    """No node with this name is in the node registry."""

    code = "node_not_found"


class JoinRefused(DSecError):
    """The join token is unknown, revoked or expired: the edge was not registered."""

    code = "join_refused"


class VolumeNotFound(DSecError):
    """No named volume with this name is visible to this tenant on the node."""

    code = "volume_not_found"


class VolumeInUse(DSecError):
    """The volume is mounted in sandboxes that are not yet stopped: stop or delete them first."""

    code = "volume_in_use"


class VolumesUnavailable(DSecError):
    """This node keeps writable layers in memory, so it has no disk for named volumes."""

    code = "volumes_unavailable"


# --- Client-side failures. --------------------------------------------------


class DSecConnectionError(EdgeUnavailable, builtins.ConnectionError):
    """The SDK could not reach the dsec server (refused, reset, DNS failure...).

    It carries the code ``edge_unavailable`` (status ``None``): like the
    server's own ``edge_unavailable``, it says that the thing that runs the
    sandbox cannot be reached now, and the same retry policy fits both. It is
    also a builtin :class:`ConnectionError`, so generic handlers catch it.
    """


class DSecTimeoutError(Timeout, builtins.TimeoutError):
    """The SDK gave up waiting for an answer (code ``timeout``, status ``None``).

    Raised when a client-side deadline passes, e.g. ``run_container(...,
    timeout=120)``. It is also a builtin :class:`TimeoutError`.
    """


# --- The table, and the mapping from codes to classes. ---------------------


def _load_table() -> list[dict[str, Any]]:
    text = resources.files(__package__ or "dsec").joinpath("error_codes.json").read_text("utf-8")
    rows = json.loads(text)
    if not isinstance(rows, list):
        raise ImportError("dsec/error_codes.json must hold a JSON list")
    return rows


def _class_name(code: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in code.split("_"))


#: The error table shipped with the SDK: code -> (http_status, description).
ERROR_CODES: dict[str, tuple[int, str]] = {
    row["code"]: (int(row["http_status"]), str(row.get("description", ""))) for row in _load_table()
}

_BY_CODE: dict[str, type[DSecError]] = {}


def _register() -> None:
    explicit = {
        cls.code: cls
        for cls in DSecError.__subclasses__()
        if cls.code is not None and cls.__module__ == __name__
    }
    # The explicit list must not name codes the table lacks, nor disagree on
    # class names: that would mean this module and the Rust table diverged.
    # (A raise, not an assert, so `python -O` keeps the check.)
    for code, cls in explicit.items():
        if code not in ERROR_CODES:
            raise ImportError(f"dsec.errors declares {cls.__name__} for {code!r}, "
                              "which error_codes.json does not list")
        if cls.__name__ != _class_name(code):
            raise ImportError(f"dsec.errors: class {cls.__name__} should be named "
                              f"{_class_name(code)} after its code {code!r}")
    g = globals()
    for code, (status, description) in ERROR_CODES.items():
        found = explicit.get(code)
        if found is not None:
            cls = found
        else:
            # A code newer than this module: generate its class so callers can
            # still catch it by name (dsec.errors.<Name>).
            name = _class_name(code)
            cls = type(name, (DSecError,), {"__doc__": description, "code": code,
                                            "__module__": __name__})
            g[name] = cls
            if name not in __all__:
                __all__.append(name)
        cls.http_status = status
        cls.description = description
        _BY_CODE[code] = cls
    DSecConnectionError.http_status = None
    DSecTimeoutError.http_status = None


_register()

# When a body carries no code (a proxy's HTML page, an empty 502...), the HTTP
# status alone picks the most generic fitting class.
_BY_STATUS: dict[int, str] = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
    500: "internal",
    504: "timeout",
}


def error_class(code: str | None) -> type[DSecError]:
    """Return the exception class for a wire code (the base class if unknown)."""
    if code is None:
        return DSecError
    return _BY_CODE.get(code, DSecError)


def error_from_detail(detail: Mapping[str, Any], status: int | None = None,
                      retry_after: float | None = None) -> DSecError:
    """Build the exception for an ``ErrorDetail`` object ``{"code", "message"}``."""
    code = detail.get("code")
    message = detail.get("message")
    if not isinstance(message, str):
        message = "" if message is None else str(message)
    if not isinstance(code, str):
        code = _BY_STATUS.get(status or 0, f"http_{status}" if status else "unknown")
    return error_class(code)(code, message, status, retry_after)


def error_from_body(status: int, body: bytes,
                    headers: Mapping[str, str] | None = None) -> DSecError:
    """Build the exception for a failed HTTP answer.

    ``body`` should be the API's ``{"error": {...}}`` JSON. Anything else (an
    empty body, a proxy's page) is mapped by ``status`` alone, with the start
    of the body as the message.
    """
    retry_after: float | None = None
    if headers is not None:
        raw = headers.get("Retry-After")
        if raw:
            try:
                retry_after = float(raw)
            except ValueError:
                retry_after = None
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return error_from_detail(parsed["error"], status, retry_after)
    text = body[:500].decode("utf-8", "replace").strip() if body else ""
    code = _BY_STATUS.get(status, f"http_{status}")
    return error_class(code)(code, text or f"HTTP {status}", status, retry_after)
