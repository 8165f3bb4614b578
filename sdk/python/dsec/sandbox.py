"""A handle on one sandbox: commands, sessions, terminals, files, lifecycle."""

from __future__ import annotations

import base64
import io
import os
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import aiohttp

from . import _transfer
from ._http import Transport
from .errors import (
    DSecError,
    FileNotFound,
    IsADirectory,
    SandboxNotFound,
    SessionNotFound,
    error_from_body,
)
from .results import (
    AuditEvents,
    SandboxMetrics,
    ExecResult,
    FileInfo,
    PackResult,
    PauseResult,
    ReplayReport,
    ResumeResult,
    SandboxEvent,
    SandboxInfo,
    SnapshotInfo,
    TcpForward,
    TrajectoryStep,
    WriteResult,
)
from .streams import DEFAULT_COLLECT_BYTES, ExecStream, Opening, Pty

if TYPE_CHECKING:
    from .client import DSecClient

__all__ = ["Sandbox", "Session"]

#: Extra seconds an exec request may take beyond the command's own timeout:
#: the server needs a moment to kill the command (SIGTERM, then SIGKILL) and
#: answer after the deadline.
EXEC_GRACE_S = 30.0

#: The request header that names a trajectory step.
STEP_ID_HEADER = "x-dsec-step-id"

#: Bodies at least this big are streamed from a file object.
_INLINE_BODY = 1 << 20


def _exec_body(cmd: str | None, argv: Sequence[str] | None, timeout: float | None,
               env: Mapping[str, str] | None, cwd: str | None, user: str | None,
               session: str | None, stdin: str | bytes | None,
               max_output_bytes: int | None) -> dict[str, Any]:
    # Only set fields: the server rejects unknown ones and defaults the rest.
    body: dict[str, Any] = {"cmd": cmd} if argv is None else {"argv": list(argv)}
    if timeout is not None:
        body["timeout"] = timeout
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if user is not None:
        body["user"] = user
    if session is not None:
        body["session"] = session
    if stdin is not None:
        if isinstance(stdin, str):
            body["stdin"] = stdin
        else:
            body["stdin_b64"] = base64.b64encode(stdin).decode("ascii")
    if max_output_bytes is not None:
        body["max_output_bytes"] = max_output_bytes
    return body


def first_exec_body(command: str | Sequence[str]) -> dict[str, Any]:
    """The ``first_exec`` of a creation: a command line or a list of arguments."""
    if isinstance(command, str):
        return {"cmd": command}
    if isinstance(command, bytes):
        raise TypeError("first_command takes a command line (str) or a list of arguments")
    argv = list(command)
    if not argv:
        raise ValueError("first_command must not be an empty list")
    return {"argv": argv}


def _step_headers(step_id: str | None,
                  base: Mapping[str, str] | None = None) -> Mapping[str, str] | None:
    """The request headers that name a trajectory step (``None``: no step id)."""
    if step_id is None:
        return base
    if not isinstance(step_id, str) or not step_id:
        raise ValueError("step_id must be a non-empty string")
    headers = dict(base or {})
    headers[STEP_ID_HEADER] = step_id
    return headers


class Sandbox:
    """A sandbox on the dsec platform.

    Get one from :meth:`DSecClient.run_container`, :meth:`DSecClient.run` or
    :meth:`DSecClient.connect`. Used as an async context manager, it is
    deleted on exit::

        async with await client.run_container(args) as sandbox:
            result = await sandbox.run_shell("echo hi")

    Attributes:
        id: the sandbox id.
        info: the last record seen from the server (creation, :meth:`refresh`,
            :meth:`stop`).
        first_result: the result of the ``first_command`` given at creation
            (:meth:`DSecClient.run`), else ``None``.
    """

    __slots__ = ("id", "info", "first_result", "_client", "_t", "_base", "_exec_url",
                 "_files_url")

    def __init__(self, client: DSecClient, info: SandboxInfo) -> None:
        self.id: str = info.id
        self.info: SandboxInfo = info
        self.first_result: ExecResult | None = None
        self._client = client
        self._t: Transport = client._transport
        # URLs are built once per sandbox, not per call.
        self._base = f"/v1/sandboxes/{Transport.quote(self.id)}"
        self._exec_url = self._t.url(self._base + "/exec")
        self._files_url = self._t.url(self._base + "/files")

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.info.state} image={self.info.image!r}>"

    @property
    def client(self) -> DSecClient:
        """The client this sandbox talks through."""
        return self._client

    @property
    def state(self) -> str:
        """The state in :attr:`info` (call :meth:`refresh` to update it)."""
        return self.info.state

    # --- lifecycle -------------------------------------------------------------

    async def refresh(self) -> SandboxInfo:
        """Fetch the current record from the server into :attr:`info`."""
        d = await self._t.request("GET", self._t.url(self._base))
        self.info = SandboxInfo.from_json(d)
        return self.info

    async def audit_events(self, after: int = 0) -> AuditEvents:
        """Attempts of the sandbox's processes that its policy refused (blocked
        system calls), oldest first, with sequence numbers above ``after``.
        The sandbox keeps its last 256; ``dropped`` counts older ones."""
        d = await self._t.request("GET", self._t.url(self._base + "/audit"),
                                  params={"after": str(after)})
        return AuditEvents.from_json(d)

    async def metrics(self, seconds: int | None = None) -> SandboxMetrics:
        """The sandbox's CPU, memory, pids, disk and network use, one sample a
        second, oldest first: the last ``seconds`` (default: all the node
        keeps, five minutes unless configured otherwise). Reading them does
        not resume a paused sandbox nor count as activity."""
        params = {"seconds": str(seconds)} if seconds is not None else None
        d = await self._t.request("GET", self._t.url(self._base + "/metrics"), params=params)
        return SandboxMetrics.from_json(d)

    async def set_network_rules(self, network_rules: dict[str, bool]) -> dict[str, bool]:
        """Replace the sandbox's network rules while it runs (same keys as
        ``network_rules`` at creation: service names such as ``"pypi"``,
        IPv4 prefixes like ``"tcp:198.18.0.0/24:443"``, domains like
        ``"*.example.org"``). New connections follow them at once. The
        sandbox must have been created with rules (even all ``False``)."""
        d = await self._t.request("PUT", self._t.url(self._base + "/network"),
                                  json_body={"network_rules": dict(network_rules)})
        return dict(d["network_rules"])

    async def stop(self) -> SandboxInfo:
        """Stop the sandbox. The record stays for inspection until :meth:`delete`."""
        d = await self._t.request("POST", self._t.url(self._base + "/stop"))
        if d:
            self.info = SandboxInfo.from_json(d)
        return self.info

    async def pause(self, timeout: float | None = 120, *, mode: str = "auto") -> PauseResult:
        """Pause the sandbox; it keeps every process and file. ``mode``:
        ``auto`` (default) suspends a VM (microVM or full VM) to disk and
        freezes a container; ``freeze`` freezes its processes and pushes
        their memory out of RAM; ``suspend`` saves a VM's memory and device
        state to disk and ends its process (no host memory held). A paused sandbox
        does not count against the running quota. Any later request resumes
        it first, transparently; so does :meth:`resume`. Pausing a paused
        sandbox changes nothing (``changed`` is False)."""
        if mode not in ("auto", "freeze", "suspend"):
            raise ValueError(f"mode must be auto, freeze or suspend, not {mode!r}")
        d = await self._t.request("POST", self._t.url(self._base + "/pause"),
                                  params={"mode": mode},
                                  timeout=self._t.timeout_for(timeout))
        r = PauseResult.from_json(d)
        self.info = r.sandbox
        return r

    async def expose(self, port: int, ttl_s: int | None = None, *, base: bool = False) -> str:
        """A URL that reaches TCP ``port`` inside the sandbox (a server
        listening there, on its loopback or any address) through the API:
        HTTP of any method and WebSocket, streamed. The URL is signed, so it
        works without a token (for a browser or a tool given only a URL)
        until ``ttl_s`` seconds from now (default an hour, at most a week);
        with the token, ``/v1/sandboxes/ID/ports/PORT/...`` needs no
        signature. A request while nothing listens raises or answers
        ``port_closed`` (502). Containers, microVMs and full VMs.

        With ``base``, the signature is in the path instead
        (``.../v1/port-urls/TOKEN``): a base URL for clients that append
        their own paths and queries (``f"{url}/health"``)."""
        body: dict[str, Any] = {"port": int(port)}
        if ttl_s is not None:
            body["ttl_s"] = int(ttl_s)
        d = await self._t.request("POST", self._t.url(self._base + "/expose"), json_body=body)
        if base:
            token = str(d["base_url"]).rpartition("/v1/port-urls/")[2]
            return str(self._t.url("/v1/port-urls/" + token))
        # The path on this client's own endpoint (which may sit behind a
        # proxy the server does not know of), with the server's signature.
        query = str(d["url"]).partition("?")[2]
        return f"{self._t.url(str(d['path']) + '/')}?{query}"

    async def forward_tcp(self, port: int, ttl_s: int | None = None,
                          allow_from: Sequence[str] | None = None) -> TcpForward:
        """Publish TCP ``port`` of the sandbox as a plain ``HOST:PORT`` of its
        node, for clients that speak something other than HTTP or cannot
        add a header or a path (a database driver, SSH). Each connection to
        ``address`` becomes a connection to the port on the sandbox's
        loopback (nothing need listen yet). Open for ``ttl_s`` seconds
        (default an hour, at most a week) or until the sandbox stops;
        ``allow_from`` keeps it to those source addresses or prefixes
        (``["10.0.0.0/8"]``). The node listens on its forward address
        (loopback unless the operator opens it: ``--port-forward-addr``)."""
        body: dict[str, Any] = {"port": int(port)}
        if ttl_s is not None:
            body["ttl_s"] = int(ttl_s)
        if allow_from:
            body["allow_from"] = list(allow_from)
        d = await self._t.request("POST", self._t.url(self._base + "/forwards"), json_body=body)
        return TcpForward.from_json(d)

    async def suspend(self, timeout: float | None = 120) -> PauseResult:
        """Suspend a VM (microVM or full VM) to disk: ``pause(mode="suspend")``."""
        return await self.pause(timeout, mode="suspend")

    async def snapshot(self, name: str, *, memory: bool = False, idempotency_key: str | None = None,
                       timeout: float | None = 600) -> SnapshotInfo:
        """Snapshot a VM's disk as ``name`` (unique among your snapshots):
        a microVM's writable disk, or a full VM's whole disk. A running VM's
        guest syncs and its vCPUs stop for the copy; a suspended one is
        snapshotted without being resumed. The snapshot holds what this
        sandbox wrote and chains onto the snapshot it started from. Start
        VMs of the same backend from it with
        ``DSecRunArgs(backend=..., image=..., snapshot=name)`` or
        :meth:`DSecClient.fork`. Retrying with the same ``idempotency_key``
        returns the first snapshot (``created`` False).

        With ``memory`` (microVMs only), a memory snapshot: the VM is
        suspended (it resumes on its next request) and its RAM and device
        state are kept too, so sandboxes started from the snapshot continue
        its processes, memory and files instead of booting (docs/microvm.md
        says what a child inherits)."""
        headers = None if idempotency_key is None else {"idempotency-key": idempotency_key}
        body: dict[str, Any] = {"name": name}
        if memory:
            body["memory"] = True
        d = await self._t.request("POST", self._t.url(self._base + "/snapshot"),
                                  json_body=body, headers=headers,
                                  timeout=self._t.timeout_for(timeout))
        return SnapshotInfo.from_json(d)

    async def pack_diff(self, name: str, *, scrub: Sequence[str] | None = None,
                        idempotency_key: str | None = None,
                        timeout: float | None = 600) -> PackResult:
        """Capture what this sandbox changed as a new image ``name[:tag]``:
        its layers plus one workspace layer with the changes (only those
        since its previous pack, when there was one). The sandbox is frozen
        while its changes are copied and keeps running after. ``scrub``
        replaces the default list of residue left out of the layer (shell
        histories, /tmp, caches, logs); paths are absolute, ``*`` matches
        within one component. Start sandboxes from the image with
        ``image=result.image`` or :meth:`DSecClient.fork`. Retrying with the
        same ``idempotency_key`` returns the first pack's report
        (``created`` False) without packing again."""
        body: dict[str, Any] = {"name": name}
        if scrub is not None:
            body["scrub"] = list(scrub)
        headers = None if idempotency_key is None else {"idempotency-key": idempotency_key}
        d = await self._t.request("POST", self._t.url(self._base + "/pack"), json_body=body,
                                  headers=headers, timeout=self._t.timeout_for(timeout))
        return PackResult.from_json(d)

    async def resume(self, timeout: float | None = 120) -> ResumeResult:
        """Thaw a paused sandbox (no-op if it runs). A stopped sandbox raises
        :class:`SandboxEnded`."""
        d = await self._t.request("POST", self._t.url(self._base + "/resume"),
                                  timeout=self._t.timeout_for(timeout))
        r = ResumeResult.from_json(d)
        self.info = r.sandbox
        return r

    async def set_timeout(self, lifetime_s: int | None = None,
                          ttl_running_stop: int | None = None) -> SandboxInfo:
        """Change the sandbox's lease: end it ``lifetime_s`` seconds from now
        (whatever its activity), and/or set its idle TTL. Bounded by the
        node's maximum lifetime."""
        body: dict[str, Any] = {}
        if lifetime_s is not None:
            body["lifetime_s"] = lifetime_s
        if ttl_running_stop is not None:
            body["ttl_running_stop"] = ttl_running_stop
        d = await self._t.request("POST", self._t.url(self._base + "/timeout"), json_body=body)
        self.info = SandboxInfo.from_json(d)
        return self.info

    async def set_qos_class(self, qos_class: str) -> SandboxInfo:
        """Change the sandbox's CPU QoS class (``"latency_sensitive"`` or
        ``"best_effort"``) while it runs: its cgroup's weights and its
        running processes change at once (``PATCH /v1/sandboxes/{id}``)."""
        d = await self._t.request("PATCH", self._t.url(self._base), json_body={"qos_class": qos_class})
        self.info = SandboxInfo.from_json(d)
        return self.info

    async def extend(self, seconds: int) -> SandboxInfo:
        """Keep the sandbox for ``seconds`` more from now (see :meth:`set_timeout`)."""
        return await self.set_timeout(lifetime_s=seconds)

    async def events(self) -> AsyncGenerator[SandboxEvent, None]:
        """The sandbox's current state, then each change as it happens; ends
        after ``stopped`` or ``failed``."""
        from .client import _event_lines
        async for e in _event_lines(self._t, self._t.url(self._base + "/events")):
            yield e

    async def delete(self) -> None:
        """Stop the sandbox if needed and forget it."""
        await self._t.request("DELETE", self._t.url(self._base))
        self.info.state = "stopped"
        self.info.state_reason = "deleted"

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await self.delete()
        except SandboxNotFound:
            pass  # already gone (deleted elsewhere, or reclaimed)

    # --- trajectory ------------------------------------------------------------

    async def trajectory(self) -> list[TrajectoryStep]:
        """The sandbox's trajectory log: every operation that changed it, in
        order, with its step id, result and the files it changed (provenance)."""
        d = await self._t.request("GET", self._t.url(self._base + "/trajectory"))
        return [TrajectoryStep.from_json(s) for s in d.get("steps", ())]

    async def replay(self, keep: bool = False, timeout: float | None = 600) -> ReplayReport:
        """Re-run this sandbox's log in a fresh sandbox of the same image,
        layers and run arguments, and report where the results diverge. The
        replay sandbox is removed afterwards unless ``keep``."""
        d = await self._t.request("POST", self._t.url(self._base + "/replay"),
                                  params={"keep": "true" if keep else "false"},
                                  timeout=self._t.timeout_for(timeout))
        return ReplayReport.from_json(d)

    # --- commands --------------------------------------------------------------

    async def run_shell(
        self,
        cmd: str,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        session: str | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
        *,
        step_id: str | None = None,
    ) -> ExecResult:
        """Run a shell command line (``/bin/sh -c``; bash when present).

        Args:
            cmd: the command line.
            timeout: seconds before the command is killed (SIGTERM, then
                SIGKILL); the result then has ``timed_out`` set. ``None`` = the
                server's default.
            env: extra environment variables.
            cwd: working directory.
            user: run as this user (default: the sandbox's ``init_user``).
            session: run in this persistent session (see :meth:`create_session`).
            stdin: text or bytes given on stdin.
            max_output_bytes: bytes kept per stream (server default 1 MiB);
                the rest is discarded and ``truncated`` set.
            step_id: the client's name for this step in the sandbox's
                trajectory log. Re-issuing a step id that is already logged
                returns the recorded result without running the command
                again (fast-forward after a restart); a different command
                under a logged step id raises :class:`StepConflict`.

        A non-zero exit code is not an error: it is in the result.
        """
        body = _exec_body(cmd, None, timeout, env, cwd, user, session, stdin, max_output_bytes)
        d = await self._t.request("POST", self._exec_url, json_body=body,
                                  headers=_step_headers(step_id),
                                  timeout=self._t.timeout_for(timeout, EXEC_GRACE_S))
        return ExecResult.from_json(d)

    async def exec(
        self,
        argv: Sequence[str],
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        session: str | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
        *,
        step_id: str | None = None,
    ) -> ExecResult:
        """Run a program with arguments, without a shell (``argv[0]`` is looked
        up in ``PATH``). Arguments as for :meth:`run_shell`."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("exec() takes a list of arguments; use run_shell() for a "
                            "command line")
        body = _exec_body(None, argv, timeout, env, cwd, user, session, stdin, max_output_bytes)
        d = await self._t.request("POST", self._exec_url, json_body=body,
                                  headers=_step_headers(step_id),
                                  timeout=self._t.timeout_for(timeout, EXEC_GRACE_S))
        return ExecResult.from_json(d)

    def stream_shell(
        self,
        cmd: str,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        session: str | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
        *,
        step_id: str | None = None,
    ) -> Opening[ExecStream]:
        """Run a shell command line, its output streamed as it is written.

        Returns an :class:`~dsec.streams.ExecStream`, to ``await`` or to use in
        ``async with``. ``stdin`` given here is sent whole at the start; use
        :meth:`ExecStream.write` to feed stdin while the command runs, and
        :meth:`ExecStream.close_stdin` to end it. ``max_output_bytes`` bounds
        the output kept in the final result (the trajectory log keeps up to
        1 MiB of each stream).
        ``step_id`` works as for :meth:`run_shell`: a step already in the log
        streams its recorded output instead of running again.
        """
        body = _exec_body(cmd, None, timeout, env, cwd, user, session, stdin, None)
        headers = _step_headers(step_id)
        return Opening(lambda: self._open_stream(body, max_output_bytes, headers))

    def stream_exec(
        self,
        argv: Sequence[str],
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        session: str | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
        *,
        step_id: str | None = None,
    ) -> Opening[ExecStream]:
        """:meth:`stream_shell` for a program with arguments, without a shell."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("stream_exec() takes a list of arguments; use stream_shell()")
        body = _exec_body(None, argv, timeout, env, cwd, user, session, stdin, None)
        headers = _step_headers(step_id)
        return Opening(lambda: self._open_stream(body, max_output_bytes, headers))

    async def _ws_connect(self, path: str, params: Mapping[str, str] | None = None,
                          headers: Mapping[str, str] | None = None
                          ) -> aiohttp.ClientWebSocketResponse:
        session = await self._t.ensure_open()
        try:
            return await session.ws_connect(
                self._t.on_current(self._t.url(self._base + path)), params=params, headers=headers,
                max_msg_size=64 << 20, autoping=True, compress=0,
            )
        except aiohttp.WSServerHandshakeError as e:
            raise await self._handshake_error(e) from e
        except aiohttp.ClientError as e:
            raise self._t.connection_error(e) from e

    async def _handshake_error(self, e: aiohttp.WSServerHandshakeError) -> DSecError:
        # aiohttp drops the body of a refused upgrade, so the error code is
        # lost. Ask the plain route why: it names a missing sandbox, a wrong
        # token or a stopped sandbox precisely.
        try:
            info = await self.refresh()
        except DSecError as probe:
            return probe
        if e.status == 409 or not info.is_running:
            return error_from_body(409, b'{"error":{"code":"sandbox_not_running","message":'
                                   b'"the sandbox is not running"}}')
        return error_from_body(e.status, f"websocket upgrade refused: {e.message}".encode())

    async def _open_stream(self, body: dict[str, Any], collect: int | None,
                           headers: Mapping[str, str] | None = None) -> ExecStream:
        ws = await self._ws_connect("/exec/stream", headers=headers)
        try:
            await ws.send_str(Transport.dumps(body))
        except BaseException:
            await ws.close()
            raise
        keep = collect if collect is not None else DEFAULT_COLLECT_BYTES
        return ExecStream(ws, collect_bytes=keep, connection_error=self._t.connection_error)

    # --- sessions ----------------------------------------------------------------

    async def create_session(self, env: Mapping[str, str] | None = None,
                             cwd: str | None = None, user: str | None = None,
                             *, step_id: str | None = None) -> Session:
        """Open a persistent shell session: the working directory and exported
        variables carry over between the commands run in it."""
        body: dict[str, Any] = {}
        if env:
            body["env"] = dict(env)
        if cwd is not None:
            body["cwd"] = cwd
        if user is not None:
            body["user"] = user
        d = await self._t.request("POST", self._t.url(self._base + "/sessions"), json_body=body,
                                  headers=_step_headers(step_id))
        return Session(self, d["session_id"])

    # --- terminals -------------------------------------------------------------

    def pty(self, cmd: str | None = None, rows: int = 24, cols: int = 80,
            user: str | None = None, cwd: str | None = None) -> Opening[Pty]:
        """Open an interactive terminal running ``cmd`` (default: the user's
        login shell). Returns a :class:`~dsec.streams.Pty`, to ``await`` or to
        use in ``async with``."""
        params = {"rows": str(int(rows)), "cols": str(int(cols))}
        if cmd is not None:
            params["cmd"] = cmd
        if user is not None:
            params["user"] = user
        if cwd is not None:
            params["cwd"] = cwd

        async def open_pty() -> Pty:
            ws = await self._ws_connect("/pty", params)
            return Pty(ws, connection_error=self._t.connection_error)

        return Opening(open_pty)

    # --- screen (full VMs, backend="vm") ------------------------------------------

    async def screenshot(self) -> bytes:
        """The VM's screen as PNG bytes. A sandbox without a screen (a
        container, a microVM) raises the ``no_screen`` error."""
        async with self._t.stream("GET", self._t.url(self._base + "/screenshot"),
                                  timeout=self._t.timeout_for(60)) as resp:
            try:
                return await resp.read()
            except aiohttp.ClientError as e:
                raise self._t.connection_error(e) from e

    async def send_keys(self, keys: str | Sequence[str]) -> None:
        """Press key combos one after the other: ``"ctrl-alt-delete"``, or
        ``["h", "i", "ret"]``. Names are QEMU key codes (``a``, ``ret``,
        ``esc``, ``f1``, ``bracket_left``...) or aliases (``enter``,
        ``escape``, ``control``, ``super``), joined by ``-`` or ``+``."""
        body = {"keys": [keys] if isinstance(keys, str) else list(keys)}
        await self._t.request("POST", self._t.url(self._base + "/screen/keys"), json_body=body)

    async def type_text(self, text: str) -> None:
        """Type ``text`` on the VM's keyboard (US layout: printable ASCII,
        newline, tab)."""
        await self._t.request("POST", self._t.url(self._base + "/screen/type"),
                              json_body={"text": text})

    async def move(self, x: int, y: int) -> None:
        """Move the pointer to pixel (``x``, ``y``) of the screen."""
        await self._t.request("POST", self._t.url(self._base + "/screen/move"),
                              json_body={"x": x, "y": y})

    async def click(self, x: int | None = None, y: int | None = None, button: str = "left",
                    double: bool = False) -> None:
        """Click ``button`` (left, right, middle) at (``x``, ``y``), or where
        the pointer is when both are None."""
        body: dict[str, Any] = {"button": button, "double": double}
        if x is not None or y is not None:
            body.update(x=x, y=y)
        await self._t.request("POST", self._t.url(self._base + "/screen/click"), json_body=body)

    # --- files -----------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        """The whole content of a file. (Use :meth:`download` for big files.)"""
        async with self._t.stream("GET", self._files_url, params={"path": path},
                                  timeout=self._t.timeout_for(None)) as resp:
            try:
                return await resp.read()
            except aiohttp.ClientError as e:
                raise self._t.connection_error(e) from e

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The content of a text file."""
        return (await self.read_file(path)).decode(encoding)

    async def write_file(self, path: str, data: bytes | str, mode: int | None = None,
                         parents: bool = True, owner: str | None = None,
                         *, step_id: str | None = None) -> WriteResult:
        """Write a whole file (``str`` as UTF-8), atomically.

        Args:
            mode: permission bits of a new file, e.g. ``0o755`` (server
                default ``0o644``).
            parents: create missing parent directories.
            owner: owner of a new file, a user name or uid (server default root).
        """
        if isinstance(data, str):
            data = data.encode()
        params = {"path": path, "parents": "true" if parents else "false"}
        if mode is not None:
            params["mode"] = str(int(mode))
        if owner is not None:
            params["owner"] = owner
        # Big bodies go as a file object, which aiohttp sends in pieces
        # instead of one write that would stall the event loop.
        body: bytes | io.BytesIO = data if len(data) < _INLINE_BODY else io.BytesIO(data)
        d = await self._t.request("PUT", self._files_url, data=body, params=params,
                                  headers=_step_headers(step_id, Transport.OCTET_HEADERS),
                                  timeout=self._t.timeout_for(None))
        return WriteResult.from_json(d or {"path": path, "bytes": len(data)})

    async def list_dir(self, path: str) -> list[FileInfo]:
        """The entries of a directory."""
        d = await self._t.request("GET", self._t.url(self._base + "/files/list"),
                                  params={"path": path})
        return [FileInfo.from_json(e) for e in d.get("entries", ())]

    async def stat(self, path: str) -> FileInfo:
        """Metadata of a file or directory (raises :class:`FileNotFound`)."""
        d = await self._t.request("GET", self._t.url(self._base + "/files/stat"),
                                  params={"path": path})
        return FileInfo.from_json(d)

    async def exists(self, path: str) -> bool:
        """True if something exists at ``path``."""
        try:
            await self.stat(path)
        except FileNotFound:
            return False
        return True

    async def mkdir(self, path: str, parents: bool = True, mode: int | None = None,
                    *, step_id: str | None = None) -> None:
        """Create a directory (with its parents by default)."""
        body: dict[str, Any] = {"path": path, "parents": parents}
        if mode is not None:
            body["mode"] = int(mode)
        await self._t.request("POST", self._t.url(self._base + "/files/mkdir"), json_body=body,
                              headers=_step_headers(step_id))

    async def remove(self, path: str, recursive: bool = False,
                     *, step_id: str | None = None) -> None:
        """Remove a file, or a directory (non-empty only with ``recursive``)."""
        await self._t.request("DELETE", self._files_url,
                              params={"path": path, "recursive": "true" if recursive else "false"},
                              headers=_step_headers(step_id))

    async def upload(self, local_path: str | os.PathLike[str], remote_path: str,
                     mode: int | None = None, owner: str | None = None,
                     *, step_id: str | None = None) -> WriteResult:
        """Copy a local file or directory into the sandbox, streaming it.

        A file is written at ``remote_path`` (with the local file's permission
        bits unless ``mode`` is given, owned by ``owner`` if given). A
        directory is sent as a tar stream and extracted into ``remote_path``
        (created if missing), so ``remote_path`` then mirrors ``local_path``.
        """
        local = Path(local_path)
        if local.is_dir():
            chunks: AsyncGenerator[bytes, None] = _transfer.tar_directory(local)
            try:
                d = await self._t.request(
                    "PUT", self._t.url(self._base + "/archive"), data=chunks,
                    params={"path": remote_path},
                    headers=_step_headers(step_id, Transport.TAR_HEADERS),
                    timeout=self._t.timeout_for(None), streamed=True)
            finally:
                await chunks.aclose()
            return WriteResult.from_json(d or {"path": remote_path, "bytes": 0})
        if mode is None:
            mode = local.stat().st_mode & 0o7777
        with open(local, "rb") as f:
            params = {"path": remote_path, "parents": "true", "mode": str(mode)}
            if owner is not None:
                params["owner"] = owner
            d = await self._t.request("PUT", self._files_url, data=f, params=params,
                                      headers=_step_headers(step_id, Transport.OCTET_HEADERS),
                                      timeout=self._t.timeout_for(None))
        return WriteResult.from_json(d or {"path": remote_path, "bytes": 0})

    async def download(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a file or directory out of the sandbox, streaming it to disk.

        A file is written at ``local_path``. A directory arrives as a tar stream
        and is extracted into ``local_path`` (created if missing), so
        ``local_path`` then mirrors ``remote_path``. A file, or a directory
        that did not exist, appears whole or not at all.
        """
        info = await self.stat(remote_path)
        if info.is_dir:
            await self._download_dir(remote_path, local_path)
            return
        try:
            await self._download_file(remote_path, Path(local_path))
        except IsADirectory:
            if not info.is_symlink:
                raise
            # A symlink to a directory: stat did not follow it, the read did.
            await self._download_dir(remote_path, local_path)

    async def _download_dir(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        async with self._t.stream("GET", self._t.url(self._base + "/archive"),
                                  params={"path": remote_path}) as resp:
            await _transfer.extract_tar_stream(
                resp.content.iter_chunked(_transfer.CHUNK), local_path)

    async def _download_file(self, remote_path: str, local: Path) -> None:
        partial = local.with_name(local.name + ".dsec-part")
        async with self._t.stream("GET", self._files_url, params={"path": remote_path}) as resp:
            try:
                with open(partial, "wb") as f:
                    async for chunk in resp.content.iter_chunked(_transfer.CHUNK):
                        f.write(chunk)
                # The file appears whole or not at all.
                os.replace(partial, local)
            finally:
                if partial.exists():
                    partial.unlink()


class Session:
    """A persistent shell session in a sandbox.

    The working directory and exported variables carry over between the
    commands run in it. Close it with :meth:`close` (or ``async with``); that
    kills every process its commands started.
    """

    __slots__ = ("sandbox", "id", "_closed")

    def __init__(self, sandbox: Sandbox, session_id: str) -> None:
        #: The sandbox the session lives in.
        self.sandbox = sandbox
        #: The session id (the ``session`` argument of exec calls).
        self.id = session_id
        self._closed = False

    def __repr__(self) -> str:
        return f"<Session {self.id} in {self.sandbox.id}>"

    async def run(self, cmd: str, timeout: float | None = None,
                  env: Mapping[str, str] | None = None, stdin: str | bytes | None = None,
                  max_output_bytes: int | None = None, *, step_id: str | None = None) -> ExecResult:
        """Run a command line in the session."""
        return await self.sandbox.run_shell(cmd, timeout=timeout, env=env, session=self.id,
                                            stdin=stdin, max_output_bytes=max_output_bytes,
                                            step_id=step_id)

    def stream(self, cmd: str, timeout: float | None = None,
               env: Mapping[str, str] | None = None) -> Opening[ExecStream]:
        """Run a command line in the session, its output streamed."""
        return self.sandbox.stream_shell(cmd, timeout=timeout, env=env, session=self.id)

    async def close(self, *, step_id: str | None = None) -> None:
        """End the session and kill its processes (idempotent)."""
        if self._closed:
            return
        try:
            await self.sandbox._t.request(
                "DELETE",
                self.sandbox._t.url(f"{self.sandbox._base}/sessions/{Transport.quote(self.id)}"),
                headers=_step_headers(step_id))
        except SessionNotFound:
            pass
        self._closed = True

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
