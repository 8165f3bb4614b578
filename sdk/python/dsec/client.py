"""The asyncio client: create, find and manage sandboxes."""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import json
import os
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from . import _transfer
from ._http import Transport, resolve_endpoints, resolve_token
from .errors import DSecError, error_from_detail
from .args import BaseRunArgs, DSecContainerRunArgs, DSecRunArgs
from .fncall import FnCallResult, fncall_body
from .iam import Projects, Tokens
from .results import (BuildResult, ExecResult, Health, ImageInfo, JobActionResult, NodeInfo, NodeMetrics, SandboxEvent,
                      SandboxInfo, SnapshotInfo, TenantInfo, VolumeInfo)
from .sandbox import Sandbox, first_exec_body

__all__ = ["DSecClient"]


class DSecClient:
    """A connection to a dsec server.

    Args:
        endpoint: base URL of the API, or several (a list, or one string
            with commas: replicas of one cluster). Default: ``DSEC_ENDPOINT``
            (the same forms), else ``http://127.0.0.1:8080``. With several,
            a call that cannot reach one replica goes to the next when that
            is safe: reads and other idempotent calls, creations (each
            carries an idempotency key), trajectory steps, and anything
            refused at connect; the replica that answered stays current.
        token: bearer token. Default: ``DSEC_TOKEN``, else the content of the
            file named by ``DSEC_TOKEN_FILE``.
        ca_cert: a PEM file of the CA that ``https://`` endpoints' certificates
            must chain to (a cluster's CA, ``dsec cluster init``). Default:
            ``DSEC_CA_CERT``, else the system's trusted roots.
        timeout: deadline in seconds for control calls (get, list, stop,
            delete, file operations). Commands use their own ``timeout``;
            creation uses the ``timeout`` of :meth:`run`.
        connect_timeout: deadline for opening a TCP connection.
        max_connections: size of the keep-alive connection pool. Each request
            in flight and each open stream or terminal holds one connection, so
            this bounds how many sandbox calls one client runs at once (the
            default drives 1,000 sandboxes concurrently).

    Use it as an async context manager, or call :meth:`open` and
    :meth:`close`::

        client = DSecClient()
        await client.open()
        sandbox = await client.run_container(DSecContainerRunArgs(container_image="python"))
        print((await sandbox.run_shell("echo hello world")).stdout)
        await sandbox.stop()
        await client.close()

    One client is meant to be shared by every task of a process: it keeps one
    pool of connections. It must be used from the event loop that opened it.
    """

    def __init__(
        self,
        endpoint: str | Sequence[str] | None = None,
        token: str | None = None,
        *,
        ca_cert: str | None = None,
        timeout: float | None = 60.0,
        connect_timeout: float = 10.0,
        max_connections: int = 1024,
    ) -> None:
        self._transport = Transport(
            resolve_endpoints(endpoint), resolve_token(token), timeout=timeout,
            connect_timeout=connect_timeout, max_connections=max_connections,
            ca_cert=ca_cert or os.environ.get("DSEC_CA_CERT") or None)
        self._sandboxes_url = self._transport.url("/v1/sandboxes")
        #: Projects and their quotas (:class:`dsec.iam.Projects`).
        self.projects = Projects(self._transport)
        #: Scoped tokens (:class:`dsec.iam.Tokens`).
        self.tokens = Tokens(self._transport)

    def __repr__(self) -> str:
        return f"<DSecClient {self.endpoint} {'open' if self.is_open else 'closed'}>"

    @property
    def endpoint(self) -> str:
        """The base URL of the API (of the replica calls go to now)."""
        return self._transport.endpoint

    @property
    def endpoints(self) -> builtins.list[str]:
        """Every endpoint this client may use, in order of preference."""
        return builtins.list(self._transport.endpoints)

    @property
    def is_open(self) -> bool:
        """True between :meth:`open` and :meth:`close`."""
        return self._transport.is_open

    # --- lifecycle ---------------------------------------------------------------

    async def open(self) -> None:
        """Open the connection pool. Calls also open it on first use."""
        await self._transport.open()

    async def close(self) -> None:
        """Close the connection pool. Sandboxes keep running on the server."""
        await self._transport.close()

    async def __aenter__(self) -> DSecClient:
        await self.open()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # --- sandboxes -------------------------------------------------------------

    async def run(self, args: BaseRunArgs, timeout: float | None = 120,
                  *, idempotency_key: str | None = None,
                  first_command: str | Sequence[str] | None = None) -> Sandbox:
        """Create a sandbox and wait until it runs.

        Args:
            args: :class:`DSecRunArgs` (any backend) or
                :class:`DSecContainerRunArgs`.
            timeout: seconds to wait for the running sandbox; then
                :class:`DSecTimeoutError` is raised (the server may still finish
                the creation: find it by its labels or job).
            idempotency_key: retrying with the same key (and the same
                arguments) returns the sandbox the first call made instead of
                making a second one; the same key with other arguments raises
                :class:`IdempotencyConflict`. Default: a fresh random key for
                this call (none with ``first_command``), so that the client's
                own retry through another replica makes one sandbox.
            first_command: a command run as soon as the sandbox runs, in the
                same request (one round trip instead of two): a command line
                (as :meth:`Sandbox.run_shell`) or a list of arguments (as
                :meth:`Sandbox.exec`). Its result is the sandbox's
                :attr:`Sandbox.first_result`. ``timeout`` covers both; if
                the command cannot run (an error, not a non-zero exit), the
                server deletes the sandbox and the error is raised. Not
                allowed with ``idempotency_key`` (a retry would run it again).
        """
        if not isinstance(args, BaseRunArgs):
            raise TypeError(f"run() takes DSecRunArgs or DSecContainerRunArgs, not "
                            f"{type(args).__name__}")
        body = args.to_json()
        if first_command is not None:
            if idempotency_key is not None:
                raise ValueError("first_command cannot be combined with idempotency_key: "
                                 "a retry would run the command again")
            body["first_exec"] = first_exec_body(first_command)
        elif idempotency_key is None:
            idempotency_key = secrets.token_hex(16)
        headers = None if idempotency_key is None else {"idempotency-key": idempotency_key}
        d = await self._transport.request("POST", self._sandboxes_url, json_body=body,
                                          headers=headers,
                                          timeout=self._transport.timeout_for(timeout))
        sandbox = Sandbox(self, SandboxInfo.from_json(d))
        first = d.get("first_exec")
        if first is not None:
            sandbox.first_result = ExecResult.from_json(first)
        return sandbox

    async def run_container(self, args: DSecContainerRunArgs | DSecRunArgs,
                            timeout: float | None = 120,
                            *, idempotency_key: str | None = None,
                            first_command: str | Sequence[str] | None = None) -> Sandbox:
        """Create a container sandbox and wait until it runs (see :meth:`run`)."""
        if isinstance(args, DSecRunArgs) and args.backend != "container":
            raise ValueError(f"run_container() got backend={args.backend!r}; use run()")
        return await self.run(args, timeout=timeout, idempotency_key=idempotency_key,
                              first_command=first_command)

    async def get(self, sandbox_id: str) -> SandboxInfo:
        """The record of one sandbox (raises :class:`SandboxNotFound`)."""
        d = await self._transport.request(
            "GET", self._transport.url(f"/v1/sandboxes/{Transport.quote(sandbox_id)}"))
        return SandboxInfo.from_json(d)

    async def list(self, state: str | None = None, job: str | None = None,
                   labels: Mapping[str, str] | None = None,
                   project: str | None = None) -> list[SandboxInfo]:
        """Records of the sandboxes this token sees, optionally filtered by
        state, job, project (it and the projects below it) and labels (a
        sandbox must carry every label given)."""
        params: list[tuple[str, str]] = []
        if project is not None:
            params.append(("project", project))
        if state is not None:
            params.append(("state", state))
        if job is not None:
            params.append(("job", job))
        for k, v in (labels or {}).items():
            params.append(("label", f"{k}={v}"))
        d = await self._transport.request("GET", self._sandboxes_url, params=params or None)
        return [SandboxInfo.from_json(s) for s in d.get("sandboxes", ())]

    async def connect(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing sandbox, checked with the server (raises
        :class:`SandboxNotFound`)."""
        return Sandbox(self, await self.get(sandbox_id))

    def sandbox(self, sandbox_id: str) -> Sandbox:
        """A handle on a sandbox id without asking the server (no request; the
        first call reveals whether the sandbox exists)."""
        return Sandbox(self, SandboxInfo(id=sandbox_id))

    # --- FnCall -----------------------------------------------------------------

    async def fncall(self, language: str, code: str, *, timeout: float | None = 300,
                     **options: Any) -> FnCallResult:
        """Run ``code`` once on a warm runner, or judge it against ``test_cases``.

        Args:
            language: ``python``, ``bash``, ``c``, ``cpp``, ``java``, ``javascript``, ``go``,
                ``rust``, ``php``, ``ruby``, ``perl`` or ``lua``.
            code: the program's source.
            timeout: seconds to wait for the answer (queueing included).
            **options: ``stdin``, ``files`` (path -> bytes or str),
                ``fetch_files``, ``env``, ``time_limit`` (s), ``memory_limit_mb``,
                ``output_limit_bytes``, ``compile_time_limit`` (s), ``test_cases``
                (:class:`TestCase` list), ``compare`` (``exact``, ``whitespace``,
                ``float``), ``float_tolerance``, ``checker`` (``(language,
                code)``: exits 0 to accept; gets ``input.txt``, ``output.txt``,
                ``expected.txt``), ``stop_on_first_failure``.

        A program that fails is a result (``status``, ``verdict``), not an
        exception; bad requests raise (:class:`InvalidRequest`, ...), a full
        queue raises :class:`QueueFull` (HTTP 429, retry later).
        """
        d = await self._transport.request(
            "POST", self._transport.url("/v1/fncall"), json_body=fncall_body(language, code, **options),
            timeout=self._transport.timeout_for(timeout))
        return FnCallResult.from_json(d)

    async def fncall_batch(self, calls: Sequence[Mapping[str, Any]], *,
                           timeout: float | None = 600) -> builtins.list[FnCallResult | DSecError]:
        """Run many calls in one request. Each call is a dict of
        :meth:`fncall`'s arguments (``language``, ``code``, options). Returns,
        in order, a result or the :class:`DSecError` of each call."""
        body = {"calls": [fncall_body(**c) for c in calls]}
        d = await self._transport.request(
            "POST", self._transport.url("/v1/fncall/batch"), json_body=body,
            timeout=self._transport.timeout_for(timeout))
        out: builtins.list[FnCallResult | DSecError] = []
        for item in d.get("results", ()):
            if "error" in item:
                out.append(error_from_detail(item["error"], None, None))
            else:
                out.append(FnCallResult.from_json(item))
        return out

    async def fncall_pools(self) -> builtins.list[dict[str, Any]]:
        """The runner pools: size, idle runners, queue, calls served."""
        d = await self._transport.request("GET", self._transport.url("/v1/fncall/pools"))
        return builtins.list(d.get("pools", ()))

    # --- forks -----------------------------------------------------------------

    async def fork(self, source: Sandbox | SnapshotInfo | str, count: int,
                   args: DSecContainerRunArgs | DSecRunArgs | None = None, *,
                   name: str | None = None, timeout: float | None = 120) -> builtins.list[Sandbox]:
        """Start ``count`` sandboxes from a sandbox's current state, a
        microVM snapshot, or an image, at once.

        A container :class:`Sandbox` source is packed first
        (:meth:`Sandbox.pack_diff` into ``name``, default
        ``fork-<id>:<random>``); a full VM source is snapshotted
        (:meth:`Sandbox.snapshot`, default name ``fork-<id>-<random>``), a
        microVM source too, with its memory (``memory=True``: it is
        suspended, and its children continue its processes, memory and
        files, each with its own id, hostname, clock and random seed). The
        children start from that image or snapshot and do not depend on
        the parent, which may be stopped right after. ``args`` are the children's run arguments
        (their image is replaced by the source's); by default the parent's
        backend, limits, user, job and labels, or plain defaults for an
        image source. All or nothing: if one child cannot start, the others
        are stopped and the error is raised."""
        if count < 1:
            raise ValueError("count must be at least 1")
        snapshot: SnapshotInfo | None = source if isinstance(source, SnapshotInfo) else None
        if isinstance(source, Sandbox):
            if not source.info.backend:
                await source.refresh()
            tag = secrets.token_hex(4)
            stem = "".join(c if c.isalnum() or c in "-." else "-" for c in source.id.lower())
            if source.info.backend in ("microvm", "vm"):
                snapshot = await source.snapshot(name or f"fork-{stem}-{tag}",
                                                 memory=source.info.backend == "microvm")
                image = snapshot.image
            else:
                packed = await source.pack_diff(name or f"fork-{stem}:{tag}")
                image = packed.image
        elif snapshot is not None:
            image = snapshot.image
        else:
            image = source
        child = self._fork_args(source, image, args)
        if snapshot is not None:
            child = dataclasses.replace(child, backend=snapshot.backend, snapshot=snapshot.name)
        results = await asyncio.gather(*(self.run(child, timeout=timeout) for _ in range(count)),
                                       return_exceptions=True)
        started = [r for r in results if isinstance(r, Sandbox)]
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await asyncio.gather(*(sb.stop() for sb in started), return_exceptions=True)
            raise failure
        return started

    async def snapshots(self) -> builtins.list[SnapshotInfo]:
        """Your microVM snapshots."""
        d = await self._transport.request("GET", self._transport.url("/v1/snapshots"))
        return [SnapshotInfo.from_json(s) for s in d.get("snapshots", ())]

    async def delete_snapshot(self, name: str) -> None:
        """Delete your snapshot ``name``. Raises :class:`SnapshotInUse`
        while a snapshot chains onto it or a sandbox started from it is not
        yet stopped (its layer backs their disks): delete those first, as
        with an image that has children or containers. A snapshot
        :meth:`fork` made for a sandbox source is yours to delete too."""
        await self._transport.request(
            "DELETE", self._transport.url(f"/v1/snapshots/{Transport.quote(name)}"))

    async def create_volume(self, name: str, size_mb: int | None = None) -> VolumeInfo:
        """Make named volume ``name`` of yours, bounded to ``size_mb`` MiB
        (default 1024): mount it into any number of your container sandboxes
        with ``volumes={"/data": name}`` (or ``{"/data": {"name": name,
        "read_only": True}}``); it outlives them until
        :meth:`delete_volume`. Raises :class:`AlreadyExists` for a name in
        use, :class:`VolumesUnavailable` on a node without a disk layer."""
        body: dict[str, Any] = {"name": name}
        if size_mb is not None:
            body["size_mb"] = size_mb
        d = await self._transport.request("POST", self._transport.url("/v1/volumes"), json_body=body)
        return VolumeInfo.from_json(d)

    async def volumes(self) -> builtins.list[VolumeInfo]:
        """Your named volumes, each with the sandboxes that mount it."""
        d = await self._transport.request("GET", self._transport.url("/v1/volumes"))
        return [VolumeInfo.from_json(v) for v in d.get("volumes", ())]

    async def delete_volume(self, name: str) -> None:
        """Remove volume ``name`` and its files. Raises :class:`VolumeInUse`
        while a sandbox that is not yet stopped mounts it,
        :class:`VolumeNotFound` if you have none of that name."""
        await self._transport.request(
            "DELETE", self._transport.url(f"/v1/volumes/{Transport.quote(name)}"))

    @staticmethod
    def _fork_args(source: Sandbox | SnapshotInfo | str, image: str,
                   args: DSecContainerRunArgs | DSecRunArgs | None) -> DSecRunArgs:
        if isinstance(args, DSecContainerRunArgs):
            fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)
                      if f.name != "container_image"}
            return DSecRunArgs(image=image, backend="container", **fields)
        if isinstance(args, DSecRunArgs):
            return dataclasses.replace(args, image=image, workspace=None, toolkits=[])
        if isinstance(source, Sandbox):
            info = source.info
            return DSecRunArgs(
                image=image, backend=info.backend or "container",
                memory_limit_mb=info.limits.memory_limit_mb or None,
                cpu_cores_limit=info.limits.cpu_cores_limit or None,
                disk_limit_mb=info.limits.disk_limit_mb or None,
                pids_limit=info.limits.pids_limit or None,
                qos_class=info.qos_class or None,
                init_user=info.init_user or None, job=info.job,
                labels=dict(info.labels))
        return DSecRunArgs(image=image)

    # --- jobs ------------------------------------------------------------------

    async def pause_job(self, job: str, timeout: float | None = 300, *,
                        idempotent: bool = False) -> JobActionResult:
        """Pause every live sandbox of ``job`` on every node, in parallel.

        Sandboxes already paused count as ``unchanged``. Raises
        :class:`JobAlreadyPaused` if every live sandbox of the job was paused
        already (nothing done; a retried pause may take it as success) and
        :class:`JobNotFound` if no sandbox of the job is visible. Sandboxes
        that could not be paused are listed in ``failed``. With
        ``idempotent=True`` an already-paused job answers with its counts
        (``changed == 0``) instead of raising.
        """
        return await self._job_action(job, "pause", timeout, idempotent)

    async def resume_job(self, job: str, timeout: float | None = 300) -> JobActionResult:
        """Resume every paused sandbox of ``job`` (stopped ones count as
        ``ended``). Needless if requests follow: any request to a paused
        sandbox resumes it first."""
        return await self._job_action(job, "resume", timeout)

    async def _job_action(self, job: str, verb: str, timeout: float | None,
                          idempotent: bool = False) -> JobActionResult:
        d = await self._transport.request(
            "POST", self._transport.url(f"/v1/jobs/{Transport.quote(job)}/{verb}"),
            params={"idempotent": "true"} if idempotent else None,
            timeout=self._transport.timeout_for(timeout))
        return JobActionResult.from_json(d)

    async def job_events(self, job: str) -> AsyncIterator[SandboxEvent]:
        """The state of every sandbox of ``job``, then each change, as they
        happen (on every node), until the caller stops iterating."""
        url = self._transport.url(f"/v1/jobs/{Transport.quote(job)}/events")
        async for e in _event_lines(self._transport, url):
            yield e

    # --- platform ----------------------------------------------------------------

    async def health(self) -> Health:
        """``GET /healthz``: the server's status, version and nodes."""
        d = await self._transport.request("GET", self._transport.url("/healthz"))
        return Health.from_json(d)

    async def images(self) -> builtins.list[ImageInfo]:
        """The images this server can run."""
        d = await self._transport.request("GET", self._transport.url("/v1/images"))
        return [ImageInfo.from_json(i) for i in d.get("images", ())]

    async def build_image(self, name: str, context: str | os.PathLike[str] = ".", *,
                          dockerfile: str = "Dockerfile",
                          build_args: Mapping[str, str] | None = None,
                          target: str | None = None, no_cache: bool = False,
                          network: str | Mapping[str, bool] | None = None,
                          memory_mb: int | None = None, cpu_cores: float | None = None,
                          disk_mb: int | None = None, step_timeout_s: int | None = None,
                          on_progress: Callable[[dict[str, Any]], None] | None = None,
                          ) -> BuildResult:
        """Build the image ``name[:tag]`` from a Dockerfile, the way
        ``docker build`` does: ``context`` is the local build context (sent
        as a tar stream; ``.dockerignore`` applies on the server),
        ``dockerfile`` its Dockerfile's path inside it. Each ``RUN`` runs in a
        sandbox of the stage so far; unchanged steps come from the step
        cache (``no_cache=True`` runs them all). ``network`` is the ``RUN``
        steps' network: ``"default"`` (the node's named services),
        ``"none"`` or a dict of rules. ``on_progress`` is called with each
        progress event (``{"type": "step", "step", "steps", "text", ...}``
        and ``{"type": "step_done", "cached", "ms", ...}``). A failing step
        raises :class:`BuildFailed` (its message ends with the command's
        output); cancelling the call cancels the build."""
        params: list[tuple[str, str]] = [("name", name), ("dockerfile", dockerfile)]
        for k, v in (build_args or {}).items():
            params.append(("build_arg", f"{k}={v}"))
        if target is not None:
            params.append(("target", target))
        if no_cache:
            params.append(("no_cache", "true"))
        if network is not None:
            params.append(("network", network if isinstance(network, str) else json.dumps(dict(network))))
        for key, val in (("memory_mb", memory_mb), ("cpu_cores", cpu_cores), ("disk_mb", disk_mb),
                         ("step_timeout_s", step_timeout_s)):
            if val is not None:
                params.append((key, str(val)))
        chunks = _transfer.tar_directory(context)
        try:
            async with self._transport.stream(
                    "POST", self._transport.url("/v1/images/build"), params=params, data=chunks,
                    headers=Transport.TAR_HEADERS) as resp:
                async for raw in resp.content:
                    if not raw.strip():
                        continue
                    event = json.loads(raw)
                    kind = event.get("type")
                    if kind == "done":
                        return BuildResult.from_json(event)
                    if kind == "error":
                        raise error_from_detail(event)
                    if on_progress is not None:
                        on_progress(event)
        finally:
            await chunks.aclose()
        raise DSecError("internal", "the build's answer ended without a result")

    async def delete_image(self, name: str) -> None:
        """Delete an image (admin token only)."""
        await self._transport.request(
            "DELETE", self._transport.url(f"/v1/images/{Transport.quote(name)}"))

    async def create_tenant(self, name: str) -> TenantInfo:
        """Create a tenant (admin token only); the answer carries its token."""
        d = await self._transport.request("POST", self._transport.url("/v1/tenants"),
                                          json_body={"name": name})
        return TenantInfo.from_json(d)

    async def tenants(self) -> builtins.list[TenantInfo]:
        """All tenants (admin token only)."""
        d = await self._transport.request("GET", self._transport.url("/v1/tenants"))
        return [TenantInfo.from_json(t) for t in d.get("tenants", ())]

    async def nodes(self) -> builtins.list[NodeInfo]:
        """The cluster's nodes: state, backends, labels, capacity and load
        (admin token only)."""
        d = await self._transport.request("GET", self._transport.url("/v1/nodes"))
        return [NodeInfo.from_json(n) for n in d]

    async def drain_node(self, node: str) -> None:
        """Stop placing new sandboxes on ``node``; what runs there goes on
        (admin token only)."""
        url = self._transport.url(f"/v1/nodes/{Transport.quote(node)}/drain")
        await self._transport.request("POST", url)

    async def undrain_node(self, node: str) -> None:
        """Place new sandboxes on a drained ``node`` again (admin token only)."""
        url = self._transport.url(f"/v1/nodes/{Transport.quote(node)}/undrain")
        await self._transport.request("POST", url)

    async def create_join_token(self, ttl_s: int | None = None) -> str:
        """A token that lets an edge join (``dsec edge --join URL
        --join-token T``); admin token only."""
        body: dict[str, Any] = {} if ttl_s is None else {"ttl_s": ttl_s}
        url = self._transport.url("/v1/cluster/join-tokens")
        d = await self._transport.request("POST", url, json_body=body)
        return str(d["token"])

    async def node_metrics(self, node: str, seconds: int | None = None) -> NodeMetrics:
        """Node ``node``'s CPU, memory and swap use and running sandboxes, one
        sample a second, oldest first (admin token only); node names are in
        :meth:`health`."""
        params = {"seconds": str(seconds)} if seconds is not None else None
        d = await self._transport.request(
            "GET", self._transport.url(f"/v1/nodes/{Transport.quote(node)}/metrics"), params=params)
        return NodeMetrics.from_json(d)


async def _event_lines(transport: Transport, url: object) -> AsyncIterator[SandboxEvent]:
    """Parse an NDJSON event stream."""
    async with transport.stream("GET", url) as resp:  # type: ignore[arg-type]
        async for raw in resp.content:
            line = raw.strip()
            if line:
                yield SandboxEvent.from_json(json.loads(line))
