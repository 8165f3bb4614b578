"""Blocking wrapper of the SDK, for scripts and notebooks.

::

    from dsec.sync import DSecClient
    from dsec import DSecContainerRunArgs

    with DSecClient() as client:
        with client.run_container(DSecContainerRunArgs(container_image="python")) as sandbox:
            print(sandbox.run_shell("echo hello world").stdout)

Each client runs a private event loop in a background thread, and every
method hands its coroutine to that loop and waits for the answer. Because the
loop is not the caller's, this works the same in a plain script, in a thread
pool, and inside Jupyter (whose own loop is already running). A client may be
used from several threads at once.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import signal as _signal
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from . import client as _aclient
from . import sandbox as _asandbox
from . import streams as _astreams
from .args import BaseRunArgs, DSecContainerRunArgs, DSecRunArgs
from .errors import DSecError, SandboxNotFound
from .fncall import FnCallResult
from .results import (
    AuditEvents,
    BuildResult,
    ExecResult,
    FileInfo,
    Health,
    ImageInfo,
    JobActionResult,
    NodeInfo,
    NodeMetrics,
    OutputChunk,
    PackResult,
    SnapshotInfo,
    VolumeInfo,
    PauseResult,
    ReplayReport,
    ResumeResult,
    SandboxEvent,
    SandboxMetrics,
    SandboxInfo,
    TcpForward,
    TenantInfo,
    TrajectoryStep,
    WriteResult,
)

__all__ = ["DSecClient", "Sandbox", "Session", "ExecStream", "Pty",
           "DSecRunArgs", "DSecContainerRunArgs"]

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="dsec-sync-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a dsec.sync call was made from the SDK's own loop thread; "
                               "use the asyncio API (dsec.DSecClient) there")
        if self.loop.is_closed():
            coro.close()
            raise RuntimeError("this dsec.sync client is closed")
        # A plain lock as the waiter and one callback into the loop: cheaper
        # than run_coroutine_threadsafe's two chained futures and condition
        # variable, and this hand-over is paid on every blocking call.
        done = threading.Lock()
        done.acquire()
        box: list[asyncio.Task[T]] = []

        def start() -> None:
            task = self.loop.create_task(coro)
            box.append(task)
            task.add_done_callback(lambda _: done.release())

        self.loop.call_soon_threadsafe(start)
        try:
            done.acquire()
        except BaseException:
            # Ctrl-C (or any interruption of the waiting thread): do not leave
            # the call running behind the caller's back.
            self.loop.call_soon_threadsafe(lambda: box and box[0].cancel())
            raise
        return box[0].result()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


def _shutdown(runner: _LoopThread, aclient: _aclient.DSecClient) -> None:
    # Runs on close(), on garbage collection, or at interpreter exit.
    try:
        if not runner.loop.is_closed() and aclient.is_open:
            runner.run(aclient.close())
    except Exception:
        pass
    runner.stop()


class _Blocking:
    """The blocking twin of one of the async client's helpers
    (``projects``, ``tokens``): each coroutine method runs on the client's
    loop."""

    def __init__(self, client: DSecClient, aio: Any) -> None:
        self._client = client
        self._aio = aio

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._aio, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._client._run(attr(*args, **kwargs))
        call.__doc__ = attr.__doc__
        return call


class DSecClient:
    """Blocking twin of :class:`dsec.DSecClient`; same arguments and calls."""

    def __init__(
        self,
        endpoint: str | Sequence[str] | None = None,
        token: str | None = None,
        *,
        timeout: float | None = 60.0,
        connect_timeout: float = 10.0,
        max_connections: int = 1024,
    ) -> None:
        #: The asyncio client doing the work (usable only on :attr:`loop`).
        self.aio = _aclient.DSecClient(endpoint, token, timeout=timeout,
                                       connect_timeout=connect_timeout,
                                       max_connections=max_connections)
        self._runner = _LoopThread()
        self._finalizer = weakref.finalize(self, _shutdown, self._runner, self.aio)
        #: Projects and quotas, blocking (see :class:`dsec.iam.Projects`).
        self.projects = _Blocking(self, self.aio.projects)
        #: Scoped tokens, blocking (see :class:`dsec.iam.Tokens`).
        self.tokens = _Blocking(self, self.aio.tokens)

    def __repr__(self) -> str:
        return f"<dsec.sync.DSecClient {self.endpoint}>"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The private event loop the calls run on."""
        return self._runner.loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    @property
    def endpoint(self) -> str:
        """The base URL of the API (of the replica calls go to now)."""
        return self.aio.endpoint

    @property
    def endpoints(self) -> builtins.list[str]:
        """Every endpoint this client may use, in order of preference."""
        return self.aio.endpoints

    @property
    def is_open(self) -> bool:
        """True between :meth:`open` and :meth:`close`."""
        return self.aio.is_open

    def open(self) -> None:
        """Open the connection pool (calls also open it on first use)."""
        self._run(self.aio.open())

    def close(self) -> None:
        """Close the connection pool and stop the background loop."""
        self._finalizer()

    def __enter__(self) -> DSecClient:
        self.open()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _wrap(self, sb: _asandbox.Sandbox) -> Sandbox:
        return Sandbox(self, sb)

    def run(self, args: BaseRunArgs, timeout: float | None = 120,
            *, idempotency_key: str | None = None,
            first_command: str | Sequence[str] | None = None) -> Sandbox:
        """Create a sandbox and wait until it runs (``first_command``: see
        :meth:`dsec.DSecClient.run`)."""
        return self._wrap(self._run(self.aio.run(args, timeout=timeout,
                                                 idempotency_key=idempotency_key,
                                                 first_command=first_command)))

    def run_container(self, args: DSecContainerRunArgs | DSecRunArgs,
                      timeout: float | None = 120,
                      *, idempotency_key: str | None = None,
                      first_command: str | Sequence[str] | None = None) -> Sandbox:
        """Create a container sandbox and wait until it runs."""
        return self._wrap(self._run(self.aio.run_container(args, timeout=timeout,
                                                           idempotency_key=idempotency_key,
                                                           first_command=first_command)))

    def fork(self, source: Sandbox | SnapshotInfo | str, count: int,
             args: DSecContainerRunArgs | DSecRunArgs | None = None, *,
             name: str | None = None, timeout: float | None = 120) -> builtins.list[Sandbox]:
        """Start ``count`` sandboxes from a sandbox's current state, a
        microVM snapshot or an image."""
        src = source.aio if isinstance(source, Sandbox) else source
        return [self._wrap(sb) for sb in
                self._run(self.aio.fork(src, count, args, name=name, timeout=timeout))]

    def snapshots(self) -> builtins.list[SnapshotInfo]:
        """Your microVM snapshots."""
        return self._run(self.aio.snapshots())

    def delete_snapshot(self, name: str) -> None:
        """Delete your snapshot ``name`` (:class:`SnapshotInUse` while
        something backs onto it)."""
        self._run(self.aio.delete_snapshot(name))

    def create_volume(self, name: str, size_mb: int | None = None) -> VolumeInfo:
        """Make named volume ``name`` (see :meth:`DSecClient.create_volume`)."""
        return self._run(self.aio.create_volume(name, size_mb))

    def volumes(self) -> builtins.list[VolumeInfo]:
        """Your named volumes, each with the sandboxes that mount it."""
        return self._run(self.aio.volumes())

    def delete_volume(self, name: str) -> None:
        """Remove volume ``name`` (:class:`VolumeInUse` while mounted)."""
        self._run(self.aio.delete_volume(name))

    def get(self, sandbox_id: str) -> SandboxInfo:
        """The record of one sandbox."""
        return self._run(self.aio.get(sandbox_id))

    def list(self, state: str | None = None, job: str | None = None,
             labels: Mapping[str, str] | None = None, project: str | None = None) -> list[SandboxInfo]:
        """Records of the visible sandboxes, optionally filtered."""
        return self._run(self.aio.list(state=state, job=job, labels=labels, project=project))

    def connect(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing sandbox, checked with the server."""
        return self._wrap(self._run(self.aio.connect(sandbox_id)))

    def sandbox(self, sandbox_id: str) -> Sandbox:
        """A handle on a sandbox id without asking the server."""
        return self._wrap(self.aio.sandbox(sandbox_id))

    def fncall(self, language: str, code: str, *, timeout: float | None = 300,
               **options: Any) -> FnCallResult:
        """Run or judge code on a warm runner (see the async client)."""
        return self._run(self.aio.fncall(language, code, timeout=timeout, **options))

    def fncall_batch(self, calls: Sequence[Mapping[str, Any]], *,
                     timeout: float | None = 600) -> builtins.list[FnCallResult | DSecError]:
        """Many calls in one request (see the async client)."""
        return self._run(self.aio.fncall_batch(calls, timeout=timeout))

    def fncall_pools(self) -> builtins.list[dict[str, Any]]:
        """The runner pools."""
        return self._run(self.aio.fncall_pools())

    def pause_job(self, job: str, timeout: float | None = 300, *,
                  idempotent: bool = False) -> JobActionResult:
        """Pause every live sandbox of a job."""
        return self._run(self.aio.pause_job(job, timeout=timeout, idempotent=idempotent))

    def resume_job(self, job: str, timeout: float | None = 300) -> JobActionResult:
        """Resume every paused sandbox of a job."""
        return self._run(self.aio.resume_job(job, timeout=timeout))

    def job_events(self, job: str) -> Iterator[SandboxEvent]:
        """The job's sandboxes' states, then each change, until you stop."""
        return _iterate(self._runner, self.aio.job_events(job))

    def health(self) -> Health:
        """The server's status, version and nodes."""
        return self._run(self.aio.health())

    def images(self) -> builtins.list[ImageInfo]:
        """The images this server can run."""
        return self._run(self.aio.images())

    def build_image(self, name: str, context: str | os.PathLike[str] = ".", *,
                    dockerfile: str = "Dockerfile",
                    build_args: Mapping[str, str] | None = None,
                    target: str | None = None, no_cache: bool = False,
                    network: str | Mapping[str, bool] | None = None,
                    memory_mb: int | None = None, cpu_cores: float | None = None,
                    disk_mb: int | None = None, step_timeout_s: int | None = None,
                    on_progress: Callable[[dict[str, Any]], None] | None = None,
                    ) -> BuildResult:
        """Build an image from a Dockerfile (see :meth:`DSecClient.build_image`)."""
        return self._run(self.aio.build_image(
            name, context, dockerfile=dockerfile, build_args=build_args, target=target,
            no_cache=no_cache, network=network, memory_mb=memory_mb, cpu_cores=cpu_cores,
            disk_mb=disk_mb, step_timeout_s=step_timeout_s, on_progress=on_progress))

    def delete_image(self, name: str) -> None:
        """Delete an image (admin only)."""
        self._run(self.aio.delete_image(name))

    def create_tenant(self, name: str) -> TenantInfo:
        """Create a tenant (admin only); the answer carries its token."""
        return self._run(self.aio.create_tenant(name))

    def tenants(self) -> builtins.list[TenantInfo]:
        """All tenants (admin only)."""
        return self._run(self.aio.tenants())

    def nodes(self) -> builtins.list[NodeInfo]:
        """The cluster's nodes (admin only; see :meth:`dsec.DSecClient.nodes`)."""
        return self._run(self.aio.nodes())

    def drain_node(self, node: str) -> None:
        """Stop placing new sandboxes on ``node`` (admin only)."""
        return self._run(self.aio.drain_node(node))

    def undrain_node(self, node: str) -> None:
        """Place new sandboxes on a drained ``node`` again (admin only)."""
        return self._run(self.aio.undrain_node(node))

    def create_join_token(self, ttl_s: int | None = None) -> str:
        """A token that lets an edge join (admin only)."""
        return self._run(self.aio.create_join_token(ttl_s))

    def node_metrics(self, node: str, seconds: int | None = None) -> NodeMetrics:
        """A node's resource use, second by second (admin only; see
        :meth:`dsec.DSecClient.node_metrics`)."""
        return self._run(self.aio.node_metrics(node, seconds))


class Sandbox:
    """Blocking twin of :class:`dsec.Sandbox`. Deleted on exit of ``with``."""

    __slots__ = ("_client", "aio")

    def __init__(self, client: DSecClient, sandbox: _asandbox.Sandbox) -> None:
        self._client = client
        #: The asyncio handle doing the work.
        self.aio = sandbox

    def __repr__(self) -> str:
        return repr(self.aio)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._client._runner.run(coro)

    @property
    def client(self) -> DSecClient:
        """The client this sandbox talks through."""
        return self._client

    @property
    def id(self) -> str:
        """The sandbox id."""
        return self.aio.id

    @property
    def info(self) -> SandboxInfo:
        """The last record seen from the server."""
        return self.aio.info

    @property
    def first_result(self) -> ExecResult | None:
        """The result of the creation's ``first_command``, else ``None``."""
        return self.aio.first_result

    @property
    def state(self) -> str:
        """The state in :attr:`info`."""
        return self.aio.state

    def refresh(self) -> SandboxInfo:
        """Fetch the current record into :attr:`info`."""
        return self._run(self.aio.refresh())

    def audit_events(self, after: int = 0) -> AuditEvents:
        """Refused attempts of the sandbox's processes (see the async method)."""
        return self._run(self.aio.audit_events(after))

    def metrics(self, seconds: int | None = None) -> SandboxMetrics:
        """Resource use, second by second (see :meth:`dsec.Sandbox.metrics`)."""
        return self._run(self.aio.metrics(seconds))

    def set_network_rules(self, network_rules: dict[str, bool]) -> dict[str, bool]:
        """See :meth:`dsec.Sandbox.set_network_rules`."""
        return self._run(self.aio.set_network_rules(network_rules))

    def screenshot(self) -> bytes:
        """See :meth:`dsec.Sandbox.screenshot`."""
        return self._run(self.aio.screenshot())

    def send_keys(self, keys: str | Sequence[str]) -> None:
        """See :meth:`dsec.Sandbox.send_keys`."""
        self._run(self.aio.send_keys(keys))

    def type_text(self, text: str) -> None:
        """See :meth:`dsec.Sandbox.type_text`."""
        self._run(self.aio.type_text(text))

    def move(self, x: int, y: int) -> None:
        """See :meth:`dsec.Sandbox.move`."""
        self._run(self.aio.move(x, y))

    def click(self, x: int | None = None, y: int | None = None, button: str = "left",
              double: bool = False) -> None:
        """See :meth:`dsec.Sandbox.click`."""
        self._run(self.aio.click(x, y, button, double))

    def stop(self) -> SandboxInfo:
        """Stop the sandbox (the record stays until :meth:`delete`)."""
        return self._run(self.aio.stop())

    def delete(self) -> None:
        """Stop the sandbox if needed and forget it."""
        self._run(self.aio.delete())

    def pause(self, timeout: float | None = 120, *, mode: str = "auto") -> PauseResult:
        """Pause the sandbox (a microVM suspends to disk, a container freezes)."""
        return self._run(self.aio.pause(timeout=timeout, mode=mode))

    def expose(self, port: int, ttl_s: int | None = None, *, base: bool = False) -> str:
        """See :meth:`dsec.Sandbox.expose`."""
        return self._run(self.aio.expose(port, ttl_s, base=base))

    def forward_tcp(self, port: int, ttl_s: int | None = None,
                    allow_from: Sequence[str] | None = None) -> TcpForward:
        """See :meth:`dsec.Sandbox.forward_tcp`."""
        return self._run(self.aio.forward_tcp(port, ttl_s, allow_from))

    def suspend(self, timeout: float | None = 120) -> PauseResult:
        """Suspend a microVM to disk."""
        return self._run(self.aio.suspend(timeout=timeout))

    def snapshot(self, name: str, *, memory: bool = False, idempotency_key: str | None = None,
                 timeout: float | None = 600) -> SnapshotInfo:
        """Snapshot a VM's disk (with ``memory``, a microVM's memory too) as ``name``."""
        return self._run(self.aio.snapshot(name, memory=memory, idempotency_key=idempotency_key,
                                           timeout=timeout))

    def pack_diff(self, name: str, *, scrub: Sequence[str] | None = None,
                  idempotency_key: str | None = None,
                  timeout: float | None = 600) -> PackResult:
        """Capture what the sandbox changed as a new image."""
        return self._run(self.aio.pack_diff(name, scrub=scrub, idempotency_key=idempotency_key,
                                            timeout=timeout))

    def resume(self, timeout: float | None = 120) -> ResumeResult:
        """Thaw a paused sandbox."""
        return self._run(self.aio.resume(timeout=timeout))

    def set_timeout(self, lifetime_s: int | None = None,
                    ttl_running_stop: int | None = None) -> SandboxInfo:
        """Change the sandbox's lease."""
        return self._run(self.aio.set_timeout(lifetime_s=lifetime_s,
                                              ttl_running_stop=ttl_running_stop))

    def set_qos_class(self, qos_class: str) -> SandboxInfo:
        """Change the sandbox's CPU QoS class while it runs."""
        return self._run(self.aio.set_qos_class(qos_class))

    def extend(self, seconds: int) -> SandboxInfo:
        """Keep the sandbox for ``seconds`` more from now."""
        return self._run(self.aio.extend(seconds))

    def events(self) -> Iterator[SandboxEvent]:
        """The sandbox's state, then each change; ends after its final state."""
        return _iterate(self._client._runner, self.aio.events())

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.delete()
        except SandboxNotFound:
            pass

    def run_shell(self, cmd: str, timeout: float | None = None,
                  env: Mapping[str, str] | None = None, cwd: str | None = None,
                  user: str | None = None, session: str | None = None,
                  stdin: str | bytes | None = None,
                  max_output_bytes: int | None = None,
                  *, step_id: str | None = None) -> ExecResult:
        """Run a shell command line; see :meth:`dsec.Sandbox.run_shell`."""
        return self._run(self.aio.run_shell(cmd, timeout, env, cwd, user, session, stdin,
                                            max_output_bytes, step_id=step_id))

    def exec(self, argv: Sequence[str], timeout: float | None = None,
             env: Mapping[str, str] | None = None, cwd: str | None = None,
             user: str | None = None, session: str | None = None,
             stdin: str | bytes | None = None,
             max_output_bytes: int | None = None,
             *, step_id: str | None = None) -> ExecResult:
        """Run a program without a shell; see :meth:`dsec.Sandbox.exec`."""
        return self._run(self.aio.exec(argv, timeout, env, cwd, user, session, stdin,
                                       max_output_bytes, step_id=step_id))

    def stream_shell(self, cmd: str, timeout: float | None = None,
                     env: Mapping[str, str] | None = None, cwd: str | None = None,
                     user: str | None = None, session: str | None = None,
                     stdin: str | bytes | None = None,
                     max_output_bytes: int | None = None,
                     *, step_id: str | None = None) -> ExecStream:
        """Run a command line with streamed output; returns an open
        :class:`ExecStream` (iterate it; use it in ``with`` to close it)."""
        opening = self.aio.stream_shell(cmd, timeout, env, cwd, user, session, stdin,
                                        max_output_bytes, step_id=step_id)
        return ExecStream(self._client, self._run(_await(opening)))

    def stream_exec(self, argv: Sequence[str], timeout: float | None = None,
                    env: Mapping[str, str] | None = None, cwd: str | None = None,
                    user: str | None = None, session: str | None = None,
                    stdin: str | bytes | None = None,
                    max_output_bytes: int | None = None,
                    *, step_id: str | None = None) -> ExecStream:
        """Run a program with streamed output; returns an open :class:`ExecStream`."""
        opening = self.aio.stream_exec(argv, timeout, env, cwd, user, session, stdin,
                                       max_output_bytes, step_id=step_id)
        return ExecStream(self._client, self._run(_await(opening)))

    def create_session(self, env: Mapping[str, str] | None = None, cwd: str | None = None,
                       user: str | None = None, *, step_id: str | None = None) -> Session:
        """Open a persistent shell session."""
        return Session(self, self._run(self.aio.create_session(env=env, cwd=cwd, user=user,
                                                               step_id=step_id)))

    def trajectory(self) -> list[TrajectoryStep]:
        """The sandbox's trajectory log; see :meth:`dsec.Sandbox.trajectory`."""
        return self._run(self.aio.trajectory())

    def replay(self, keep: bool = False, timeout: float | None = 600) -> ReplayReport:
        """Re-run the log in a fresh sandbox; see :meth:`dsec.Sandbox.replay`."""
        return self._run(self.aio.replay(keep=keep, timeout=timeout))

    def pty(self, cmd: str | None = None, rows: int = 24, cols: int = 80,
            user: str | None = None, cwd: str | None = None) -> Pty:
        """Open an interactive terminal; returns an open :class:`Pty`."""
        opening = self.aio.pty(cmd, rows=rows, cols=cols, user=user, cwd=cwd)
        return Pty(self._client, self._run(_await(opening)))

    def read_file(self, path: str) -> bytes:
        """The whole content of a file."""
        return self._run(self.aio.read_file(path))

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The content of a text file."""
        return self._run(self.aio.read_text(path, encoding))

    def write_file(self, path: str, data: bytes | str, mode: int | None = None,
                   parents: bool = True, owner: str | None = None,
                   *, step_id: str | None = None) -> WriteResult:
        """Write a whole file."""
        return self._run(self.aio.write_file(path, data, mode=mode, parents=parents,
                                             owner=owner, step_id=step_id))

    def list_dir(self, path: str) -> list[FileInfo]:
        """The entries of a directory."""
        return self._run(self.aio.list_dir(path))

    def stat(self, path: str) -> FileInfo:
        """Metadata of a file or directory."""
        return self._run(self.aio.stat(path))

    def exists(self, path: str) -> bool:
        """True if something exists at ``path``."""
        return self._run(self.aio.exists(path))

    def mkdir(self, path: str, parents: bool = True, mode: int | None = None,
              *, step_id: str | None = None) -> None:
        """Create a directory."""
        self._run(self.aio.mkdir(path, parents=parents, mode=mode, step_id=step_id))

    def remove(self, path: str, recursive: bool = False, *, step_id: str | None = None) -> None:
        """Remove a file or directory."""
        self._run(self.aio.remove(path, recursive=recursive, step_id=step_id))

    def upload(self, local_path: str | os.PathLike[str], remote_path: str,
               mode: int | None = None, owner: str | None = None,
               *, step_id: str | None = None) -> WriteResult:
        """Copy a local file or directory into the sandbox."""
        return self._run(self.aio.upload(local_path, remote_path, mode=mode, owner=owner,
                                         step_id=step_id))

    def download(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a file or directory out of the sandbox."""
        self._run(self.aio.download(remote_path, local_path))


def _iterate(runner: _LoopThread, agen: AsyncIterator[T]) -> Iterator[T]:
    """Drives an async iterator on the client's loop, one item per call."""
    try:
        while True:
            try:
                yield runner.run(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        if isinstance(agen, AsyncGenerator):
            runner.run(agen.aclose())


async def _await(opening: _astreams.Opening[T]) -> T:
    return await opening


class Session:
    """Blocking twin of :class:`dsec.Session`."""

    __slots__ = ("sandbox", "aio")

    def __init__(self, sandbox: Sandbox, session: _asandbox.Session) -> None:
        #: The sandbox the session lives in.
        self.sandbox = sandbox
        #: The asyncio session doing the work.
        self.aio = session

    @property
    def id(self) -> str:
        """The session id."""
        return self.aio.id

    def run(self, cmd: str, timeout: float | None = None,
            env: Mapping[str, str] | None = None, stdin: str | bytes | None = None,
            max_output_bytes: int | None = None, *, step_id: str | None = None) -> ExecResult:
        """Run a command line in the session."""
        return self.sandbox._run(self.aio.run(cmd, timeout=timeout, env=env, stdin=stdin,
                                              max_output_bytes=max_output_bytes,
                                              step_id=step_id))

    def stream(self, cmd: str, timeout: float | None = None,
               env: Mapping[str, str] | None = None) -> ExecStream:
        """Run a command line in the session, its output streamed; returns
        an open :class:`ExecStream`."""
        return self.sandbox.stream_shell(cmd, timeout=timeout, env=env, session=self.id)

    def close(self, *, step_id: str | None = None) -> None:
        """End the session and kill its processes."""
        self.sandbox._run(self.aio.close(step_id=step_id))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class ExecStream:
    """Blocking twin of :class:`dsec.ExecStream`: iterate it for
    :class:`OutputChunk` items, the last item being the :class:`ExecResult`."""

    def __init__(self, client: DSecClient, stream: _astreams.ExecStream) -> None:
        self._client = client
        #: The asyncio stream doing the work.
        self.aio = stream

    @property
    def result(self) -> ExecResult | None:
        """The final result once the command has ended."""
        return self.aio.result

    def __iter__(self) -> ExecStream:
        return self

    def __next__(self) -> OutputChunk | ExecResult:
        try:
            return self._client._run(self.aio.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def wait(self) -> ExecResult:
        """Read the rest of the output and return the final result."""
        return self._client._run(self.aio.wait())

    def write(self, data: bytes | str) -> None:
        """Send data to the command's stdin."""
        self._client._run(self.aio.write(data))

    def close_stdin(self) -> None:
        """End the command's stdin."""
        self._client._run(self.aio.close_stdin())

    def send_signal(self, sig: int = _signal.SIGTERM) -> None:
        """Signal the command's process group."""
        self._client._run(self.aio.send_signal(sig))

    def kill(self) -> None:
        """SIGKILL the command's process group."""
        self._client._run(self.aio.kill())

    @property
    def closed(self) -> bool:
        """True once the WebSocket is closed."""
        return self.aio.closed

    def close(self) -> None:
        """Close the stream."""
        self._client._run(self.aio.close())

    def __enter__(self) -> ExecStream:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Pty:
    """Blocking twin of :class:`dsec.Pty`."""

    def __init__(self, client: DSecClient, pty: _astreams.Pty) -> None:
        self._client = client
        #: The asyncio terminal doing the work.
        self.aio = pty

    @property
    def result(self) -> ExecResult | None:
        """The program's result once it has ended."""
        return self.aio.result

    def read(self) -> bytes:
        """The next chunk of output; ``b""`` when the program ended."""
        return self._client._run(self.aio.read())

    def read_until(self, marker: bytes | str, timeout: float | None = None) -> bytes:
        """Read until ``marker`` appears; return everything read."""
        return self._client._run(self.aio.read_until(marker, timeout))

    def __iter__(self) -> Pty:
        return self

    def __next__(self) -> bytes:
        data = self.read()
        if not data:
            raise StopIteration
        return data

    def send(self, data: bytes | str) -> None:
        """Send keystrokes."""
        self._client._run(self.aio.send(data))

    def resize(self, rows: int, cols: int) -> None:
        """Change the window size."""
        self._client._run(self.aio.resize(rows, cols))

    def wait(self) -> ExecResult | None:
        """Discard output until the program ends; return its result."""
        return self._client._run(self.aio.wait())

    @property
    def closed(self) -> bool:
        """True once the WebSocket is closed."""
        return self.aio.closed

    def close(self) -> None:
        """Close the terminal."""
        self._client._run(self.aio.close())

    def __enter__(self) -> Pty:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
