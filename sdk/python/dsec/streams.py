"""Streaming exec and interactive PTYs over WebSockets.

Wire format (``docs/api.md``):

* exec stream (``/v1/sandboxes/{id}/exec/stream``): the client's first text
  frame is the ``ExecRequest`` JSON. The server sends binary frames whose
  first byte names the stream (1 stdout, 2 stderr) and a final text frame
  ``{"type": "exit", ...ExecResponse}`` or ``{"type": "error", "code", "message"}``.
  The client may send binary ``[0] + bytes`` (stdin), ``{"type": "eof"}`` and
  ``{"type": "signal", "signal": N}``.
* PTY (``/v1/sandboxes/{id}/pty``): binary frames both ways are terminal
  bytes; the client sends ``{"type": "resize", "rows", "cols"}``; the server
  ends with ``{"type": "exit", ...}``.
"""

from __future__ import annotations

import asyncio
import json
import signal as _signal
from collections.abc import Awaitable, Callable, Generator
from types import TracebackType
from typing import Any, Generic, TypeVar

import aiohttp

from .errors import DSecConnectionError, DSecError, DSecTimeoutError, error_from_detail
from .results import ExecResult, OutputChunk

__all__ = ["ExecStream", "Pty", "Opening", "DEFAULT_COLLECT_BYTES"]

_STDIN = b"\x00"
_STREAMS = {1: "stdout", 2: "stderr"}
_EOF_MSG = '{"type":"eof"}'

#: Per stream, how much output an :class:`ExecStream` keeps for its final
#: result (as the server does for a plain exec: 1 MiB).
DEFAULT_COLLECT_BYTES = 1 << 20

T = TypeVar("T")


class Opening(Generic[T]):
    """A stream being opened: ``await`` it, or use it in ``async with``.

    ``stream = await sandbox.stream_shell(cmd)`` gives the open stream, which
    the caller closes; ``async with sandbox.stream_shell(cmd) as stream:``
    closes it on exit.
    """

    __slots__ = ("_factory", "_value")

    def __init__(self, factory: Callable[[], Awaitable[T]]) -> None:
        self._factory = factory
        self._value: T | None = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._factory().__await__()

    async def __aenter__(self) -> T:
        self._value = await self._factory()
        return self._value

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        value = self._value
        if value is not None:
            await value.close()  # type: ignore[attr-defined]


def _exit_result(msg: dict[str, Any]) -> ExecResult:
    return ExecResult.from_json(msg)


def _error_from_frame(msg: dict[str, Any]) -> DSecError:
    # The error message is flattened into the frame: {"type":"error","code","message"}.
    inner = msg.get("error")
    return error_from_detail(inner if isinstance(inner, dict) else msg)


class ExecStream:
    """A running command whose output arrives while it runs.

    Iterate it to get :class:`OutputChunk` items as the process writes them;
    the last item is the :class:`ExecResult`, after which iteration stops::

        async with sandbox.stream_shell("make test") as stream:
            async for item in stream:
                if isinstance(item, OutputChunk):
                    print(item.text, end="")
                else:
                    print("exit", item.exit_code)

    Or call :meth:`wait` to drain it. The final result's ``stdout``/``stderr``
    hold the output the stream carried (up to ``collect_bytes`` per stream;
    beyond that ``truncated`` is set), so ``await stream.wait()`` gives the
    same result as a plain exec.

    Input: :meth:`write` sends stdin bytes, :meth:`close_stdin` ends stdin,
    :meth:`send_signal` signals the command's process group.
    """

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, *, collect_bytes: int,
                 connection_error: Callable[[BaseException], DSecConnectionError]) -> None:
        self._ws = ws
        self._send_lock = asyncio.Lock()
        self._collect = collect_bytes
        self._out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        self._kept = {"stdout": 0, "stderr": 0}
        self._dropped = False
        self._conn_error = connection_error
        #: The final result once the command has ended, else ``None``.
        self.result: ExecResult | None = None

    # --- output --------------------------------------------------------------

    def __aiter__(self) -> ExecStream:
        return self

    async def __anext__(self) -> OutputChunk | ExecResult:
        if self.result is not None:
            raise StopAsyncIteration
        while True:
            try:
                msg = await self._ws.receive()
            except aiohttp.ClientError as e:
                raise self._conn_error(e) from e
            t = msg.type
            if t is aiohttp.WSMsgType.BINARY:
                data: bytes = msg.data
                name = _STREAMS.get(data[0]) if data else None
                if name is None:
                    continue  # a stream tag this SDK does not know: skip it
                chunk = OutputChunk(name, data[1:])
                self._keep(name, chunk.data)
                return chunk
            if t is aiohttp.WSMsgType.TEXT:
                frame = json.loads(msg.data)
                kind = frame.get("type")
                if kind == "exit":
                    self.result = self._finish(_exit_result(frame))
                    await self._ws.close()
                    return self.result
                if kind == "error":
                    await self._ws.close()
                    raise _error_from_frame(frame)
                continue  # a message type from a newer server: ignore it
            cause = msg.data if isinstance(msg.data, BaseException) else None
            raise self._conn_error(ConnectionResetError(
                f"the exec stream closed before the command ended "
                f"(websocket {t.name}, close code {self._ws.close_code}, {cause})"))

    def _keep(self, name: str, data: bytes) -> None:
        room = self._collect - self._kept[name]
        if room <= 0:
            self._dropped = self._dropped or bool(data)
            return
        if len(data) > room:
            data = data[:room]
            self._dropped = True
        self._out[name].append(data)
        self._kept[name] += len(data)

    def _finish(self, r: ExecResult) -> ExecResult:
        # With streamed output the server's exit message carries no output;
        # put what the stream carried into the result.
        if not r.stdout and self._out["stdout"]:
            r.stdout = b"".join(self._out["stdout"]).decode("utf-8", "replace")
        if not r.stderr and self._out["stderr"]:
            r.stderr = b"".join(self._out["stderr"]).decode("utf-8", "replace")
        r.truncated = r.truncated or self._dropped
        self._out = {"stdout": [], "stderr": []}
        return r

    async def wait(self) -> ExecResult:
        """Read the rest of the output and return the final result."""
        async for _ in self:
            pass
        assert self.result is not None
        return self.result

    # --- input ---------------------------------------------------------------

    async def _send_bytes(self, data: bytes) -> None:
        try:
            async with self._send_lock:
                await self._ws.send_bytes(data)
        except (aiohttp.ClientError, ConnectionResetError) as e:
            raise self._conn_error(e) from e

    async def _send_str(self, text: str) -> None:
        try:
            async with self._send_lock:
                await self._ws.send_str(text)
        except (aiohttp.ClientError, ConnectionResetError) as e:
            raise self._conn_error(e) from e

    async def write(self, data: bytes | str) -> None:
        """Send ``data`` to the command's stdin (``str`` is sent as UTF-8)."""
        if isinstance(data, str):
            data = data.encode()
        if data:
            await self._send_bytes(_STDIN + data)

    async def close_stdin(self) -> None:
        """Tell the command that stdin has ended (EOF)."""
        await self._send_str(_EOF_MSG)

    async def send_signal(self, sig: int = _signal.SIGTERM) -> None:
        """Send signal ``sig`` (a number) to the command's process group."""
        await self._send_str(json.dumps({"type": "signal", "signal": int(sig)}))

    async def kill(self) -> None:
        """Send SIGKILL to the command's process group."""
        await self.send_signal(_signal.SIGKILL)

    # --- lifecycle -----------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the WebSocket is closed."""
        return self._ws.closed

    async def close(self) -> None:
        """Close the WebSocket. A command still running is left to the server,
        which ends it when its client goes away."""
        if not self._ws.closed:
            await self._ws.close()

    async def __aenter__(self) -> ExecStream:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


class Pty:
    """An interactive terminal in a sandbox.

    Send keystrokes with :meth:`send`, change the window with :meth:`resize`,
    read terminal output with :meth:`read` (``b""`` once the program ended),
    or iterate over output chunks. When the program ends, :attr:`result`
    holds its :class:`ExecResult`::

        async with sandbox.pty(rows=24, cols=80) as term:
            await term.send("echo hi\\n")
            print(await term.read())
    """

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, *,
                 connection_error: Callable[[BaseException], DSecConnectionError]) -> None:
        self._ws = ws
        self._send_lock = asyncio.Lock()
        self._conn_error = connection_error
        #: The program's result once it has ended, else ``None``.
        self.result: ExecResult | None = None

    async def read(self) -> bytes:
        """The next chunk of terminal output; ``b""`` when the program ended."""
        if self.result is not None or self._ws.closed:
            return b""
        while True:
            try:
                msg = await self._ws.receive()
            except aiohttp.ClientError as e:
                raise self._conn_error(e) from e
            t = msg.type
            if t is aiohttp.WSMsgType.BINARY:
                if msg.data:
                    return msg.data  # type: ignore[no-any-return]
                continue
            if t is aiohttp.WSMsgType.TEXT:
                frame = json.loads(msg.data)
                kind = frame.get("type")
                if kind == "exit":
                    self.result = _exit_result(frame)
                    await self._ws.close()
                    return b""
                if kind == "error":
                    await self._ws.close()
                    raise _error_from_frame(frame)
                continue
            # Closed without an exit message: treat as the end of output.
            return b""

    def __aiter__(self) -> Pty:
        return self

    async def __anext__(self) -> bytes:
        data = await self.read()
        if not data:
            raise StopAsyncIteration
        return data

    async def read_until(self, marker: bytes | str, timeout: float | None = None) -> bytes:
        """Read until ``marker`` appears in the output; return everything read.

        Raises :class:`DSecTimeoutError` after ``timeout`` seconds and
        :class:`EOFError` if the program ends first.
        """
        if isinstance(marker, str):
            marker = marker.encode()
        buf = bytearray()

        async def loop() -> bytes:
            while marker not in buf:
                data = await self.read()
                if not data:
                    raise EOFError(f"the terminal ended before {marker!r} appeared; "
                                   f"output: {bytes(buf)[-500:]!r}")
                buf.extend(data)
            return bytes(buf)

        try:
            return await asyncio.wait_for(loop(), timeout)
        except asyncio.TimeoutError as e:
            raise DSecTimeoutError("timeout", f"{marker!r} did not appear within {timeout}s; "
                                   f"output: {bytes(buf)[-500:]!r}") from e

    async def send(self, data: bytes | str) -> None:
        """Send keystrokes (``str`` is sent as UTF-8)."""
        if isinstance(data, str):
            data = data.encode()
        try:
            async with self._send_lock:
                await self._ws.send_bytes(data)
        except (aiohttp.ClientError, ConnectionResetError) as e:
            raise self._conn_error(e) from e

    async def resize(self, rows: int, cols: int) -> None:
        """Change the terminal window size."""
        try:
            async with self._send_lock:
                await self._ws.send_str(json.dumps({"type": "resize", "rows": int(rows),
                                                    "cols": int(cols)}))
        except (aiohttp.ClientError, ConnectionResetError) as e:
            raise self._conn_error(e) from e

    async def wait(self) -> ExecResult | None:
        """Discard output until the program ends; return its result (``None``
        if the connection closed without one)."""
        while await self.read():
            pass
        return self.result

    @property
    def closed(self) -> bool:
        """True once the WebSocket is closed."""
        return self._ws.closed

    async def close(self) -> None:
        """Close the terminal's WebSocket (the server then ends the program)."""
        if not self._ws.closed:
            await self._ws.close()

    async def __aenter__(self) -> Pty:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
