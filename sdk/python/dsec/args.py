"""Run arguments: what a new sandbox should be.

Two dataclasses describe a sandbox to create. :class:`DSecRunArgs` is the
general form that names its ``backend``; :class:`DSecContainerRunArgs` is the
container form of the paper's listing, whose image field is called
``container_image``. Both serialise to the body of ``POST /v1/sandboxes``.

Only fields that are set travel on the wire: ``None`` and empty collections
are left out, because the server rejects unknown fields and treats a missing
field as "use the server's default".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Union

__all__ = ["Backend", "BaseRunArgs", "DSecRunArgs", "DSecContainerRunArgs", "QosClass", "RunArgs"]

#: Backends the API names. Any string is accepted and sent as is, so a backend
#: added to the server later works before the SDK lists it.
Backend = Literal["container", "microvm", "vm", "fncall"]

#: CPU QoS classes: ``latency_sensitive`` (the default weight, for steps a
#: trainer waits on) or ``best_effort`` (runs on what the others leave).
QosClass = Literal["latency_sensitive", "best_effort"]


@dataclass(kw_only=True)
class BaseRunArgs:
    """Fields every backend shares (see the subclasses for the image field).

    Attributes:
        workspace: one workspace layer placed above the base image.
        toolkits: toolkit layers placed above the workspace; the last is topmost.
        memory_limit_mb: memory limit in MiB.
        cpu_cores_limit: CPU limit in cores (fractions allowed).
        disk_limit_mb: size of the writable layer in MiB (a full VM: the
            most its writes may take on the host, by default its image's
            disk size, at least 64; past it the guest gets I/O errors).
        pids_limit: maximum number of processes.
        qos_class: CPU QoS class, ``"latency_sensitive"`` or ``"best_effort"``
            (default: latency sensitive on every backend; a best-effort
            sandbox runs only on what the others leave);
            :meth:`Sandbox.set_qos_class` changes it while the sandbox runs.
        ttl_running_stop: idle lifetime in seconds: the sandbox is stopped after
            this long without any request (0 disables the idle timeout).
        max_lifetime_s: hard lifetime in seconds from creation (0 = the node's
            maximum).
        network_rules: egress to allow, e.g. ``{"pypi": True, "npm": False}``:
            named services of the node, IPv4 prefixes (``"tcp:198.18.0.0/24:443"``)
            or domains (``"*.example.org"``). Without any rule the sandbox has
            loopback only; with rules (even all ``False``) it has a network whose
            rules :meth:`Sandbox.set_network_rules` can change later.
        init_user: default user for commands: ``"root"`` or a user of the image.
        env: environment variables for every command.
        workdir: default working directory for commands.
        labels: free-form labels, for filtering in :meth:`DSecClient.list`.
        node_selector: place only on nodes carrying all these labels, e.g.
            ``{"kvm": "true"}`` (see :meth:`DSecClient.nodes`).
        job: the training job this sandbox belongs to.
        volumes: named volumes of yours (:meth:`DSecClient.create_volume`)
            to mount, by sandbox path: ``{"/data": "NAME"}`` (read-write) or
            ``{"/data": {"name": "NAME", "read_only": True}}``. Containers
            only.
    """

    workspace: str | None = None
    toolkits: list[str] = field(default_factory=list)
    memory_limit_mb: int | None = None
    cpu_cores_limit: float | None = None
    disk_limit_mb: int | None = None
    pids_limit: int | None = None
    qos_class: QosClass | None = None
    ttl_running_stop: int | None = None
    max_lifetime_s: int | None = None
    network_rules: dict[str, bool] = field(default_factory=dict)
    init_user: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    job: str | None = None
    volumes: dict[str, str | dict[str, Any]] = field(default_factory=dict)

    # Field names that are not sent under their own name (handled in to_json).
    _NOT_WIRE: ClassVar[frozenset[str]] = frozenset({"backend", "image", "container_image"})

    @property
    def backend_name(self) -> str:
        """The backend this request asks for."""
        raise NotImplementedError

    @property
    def image_name(self) -> str:
        """The base image this request asks for."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        """The body of ``POST /v1/sandboxes``: backend, image and every set field."""
        image = self.image_name
        if not isinstance(image, str) or not image:
            raise ValueError("an image is required (image=... or container_image=...)")
        body: dict[str, Any] = {"backend": self.backend_name, "image": image}
        for f in dataclasses.fields(self):
            name = f.name
            if name in self._NOT_WIRE:
                continue
            value = getattr(self, name)
            # None and empty collections mean "server default": leave them out.
            if value is None or (isinstance(value, (list, dict, tuple)) and not value):
                continue
            if isinstance(value, (list, tuple)):
                value = list(value)
            elif isinstance(value, dict):
                value = dict(value)
            body[name] = value
        return body


@dataclass(kw_only=True)
class DSecRunArgs(BaseRunArgs):
    """Arguments for :meth:`DSecClient.run`, for any backend.

    Example::

        args = DSecRunArgs(backend="container", image="python", memory_limit_mb=512)
        sandbox = await client.run(args)

    Attributes:
        backend: ``"container"`` (default), ``"microvm"``, ``"vm"`` or
            ``"fncall"``; switching backend is this one field.
        image: the base image (``name`` or ``name:tag``), e.g. ``"python"``.
        snapshot: start a microVM from this snapshot of yours
            (:meth:`Sandbox.snapshot`); its image, layers and disk size are
            the snapshot's.
    """

    backend: Backend | str = "container"
    image: str
    snapshot: str | None = None

    @property
    def backend_name(self) -> str:
        """The backend this request asks for (``backend``)."""
        return self.backend

    @property
    def image_name(self) -> str:
        """The base image this request asks for (``image``)."""
        return self.image


@dataclass(kw_only=True)
class DSecContainerRunArgs(BaseRunArgs):
    """Arguments for :meth:`DSecClient.run_container` (the container backend).

    The same as :class:`DSecRunArgs` with ``backend="container"``, except that
    the image field is named ``container_image`` (as in the paper's listing);
    it is sent as ``image``.
    """

    container_image: str

    #: Always the container backend.
    backend: ClassVar[str] = "container"

    @property
    def image(self) -> str:
        """The base image (alias of ``container_image``)."""
        return self.container_image

    @property
    def backend_name(self) -> str:
        """Always ``"container"``."""
        return "container"

    @property
    def image_name(self) -> str:
        """The base image this request asks for (``container_image``)."""
        return self.container_image


#: Either form of run arguments.
RunArgs = Union[DSecRunArgs, DSecContainerRunArgs]
