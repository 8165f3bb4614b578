"""Keep-alive HTTP/1.1 connections for the SDK's request/answer calls.

Commands, creation and the other control calls are small JSON requests
with small JSON answers, sent by the thousand per second by one trainer
process. Through aiohttp each of them cost ~250 us of the caller's CPU
(request and response objects, a payload writer, a stream reader, a
timer context, a task per connection attempt); here a request is one
pre-built byte string written to a pooled socket and its answer is parsed
in the protocol's ``data_received``, so a call costs a few tens of
microseconds. See docs/sdk-performance.md for the profile.

Scope: requests whose body is in memory and answers of any length
(``Content-Length``, chunked, or up to the close). Streams, WebSockets,
uploads of unknown length and downloads to disk stay on aiohttp.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
import time
from collections import deque
from typing import Any

__all__ = ["Pool", "Answer", "ProtocolError", "StaleConnection"]

#: An answer: status, raw header lines (name, value), body.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]

#: Longest status line plus headers accepted (the server's are ~150 bytes).
_MAX_HEAD = 64 * 1024


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.1 as this client reads it."""


class StaleConnection(ConnectionError):
    """A reused connection was closed before any byte of the answer came:
    the server dropped an idle connection as the request went out.
    ``unsent``: the request was not written at all."""

    def __init__(self, message: str, unsent: bool = False) -> None:
        super().__init__(message)
        self.unsent = unsent


class _Conn(asyncio.Protocol):
    """One connection; one request at a time."""

    __slots__ = ("transport", "closed", "reused", "idle_since", "_fut", "_buf", "_status",
                 "_headers", "_length", "_chunked", "_keep", "_body", "_got_bytes",
                 "_head_request")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self._fut: asyncio.Future[Answer] | None = None
        self._buf = bytearray()
        self._head_request = False
        self._reset()

    def _reset(self) -> None:
        self._status = 0  # 0: the head has not been parsed yet
        self._headers: list[tuple[bytes, bytes]] = []
        self._length = -1  # -1: read to the close
        self._chunked = False
        self._keep = True
        self._body = bytearray()
        self._got_bytes = False

    # --- asyncio.Protocol -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        fut = self._fut
        if fut is None or fut.done():
            return
        self._fut = None
        if self._status and self._length == -1 and not self._chunked and exc is None:
            # An answer delimited by the end of the connection.
            fut.set_result((self._status, self._headers, bytes(self._body)))
            return
        if not self._got_bytes and self.reused:
            fut.set_exception(StaleConnection("the server closed an idle connection"))
        else:
            fut.set_exception(exc or ConnectionResetError("the server closed the connection "
                                                          "before its answer ended"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost does the rest

    def data_received(self, data: bytes) -> None:
        fut = self._fut
        if fut is None:
            # Bytes no request asked for: this connection cannot be trusted.
            self.close()
            return
        self._got_bytes = True
        buf = self._buf
        buf += data
        try:
            if not self._status and not self._parse_head():
                return
            if self._chunked:
                done = self._parse_chunks()
            elif self._length >= 0:
                done = len(buf) >= self._length
                if done:
                    if len(buf) > self._length:
                        raise ProtocolError("more bytes than Content-Length")
                    self._body = bytes(buf)  # type: ignore[assignment]
                    buf.clear()
            else:
                self._body += buf
                buf.clear()
                return
        except (ProtocolError, ValueError) as e:
            self._fut = None
            self.close()
            if not fut.done():
                fut.set_exception(e if isinstance(e, ProtocolError) else ProtocolError(str(e)))
            return
        if done:
            self._fut = None
            body = self._body
            answer = (self._status, self._headers,
                      body if type(body) is bytes else bytes(body))
            if not self._keep:
                self.close()
            if not fut.done():
                fut.set_result(answer)

    # --- parsing ------------------------------------------------------------------

    def _parse_head(self) -> bool:
        """Parse the status line and headers once they are all in; True then.
        Bytes throughout: only an error answer's headers are ever decoded."""
        buf = self._buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise ProtocolError("answer head too long")
                return False
            head = bytes(buf[:end])
            del buf[:end + 4]
            if head[:7] != b"HTTP/1." or len(head) < 12:
                raise ProtocolError(f"bad status line {head[:80].decode('latin-1')!r}")
            status = int(head[9:12])
            if 100 <= status < 200:
                continue  # an interim answer (100 Continue): the real one follows
            break
        keep = head[7:8] == b"1"
        length = -1
        headers = []
        for h in head.split(b"\r\n")[1:]:
            name, sep, value = h.partition(b":")
            if not sep:
                raise ProtocolError(f"bad header line {h[:80].decode('latin-1')!r}")
            value = value.strip()
            headers.append((name, value))
            low = name.lower()
            if low == b"content-length":
                length = int(value)
            elif low == b"transfer-encoding":
                self._chunked = b"chunked" in value.lower()
            elif low == b"connection":
                v = value.lower()
                keep = b"close" not in v and (keep or b"keep-alive" in v)
        if status in (204, 304) or self._head_request:
            length = 0
        if self._chunked:
            length = -1
        self._status, self._headers, self._length, self._keep = status, headers, length, keep
        if length == -1 and not self._chunked:
            self._keep = False  # delimited by the close: never reusable
        return True

    def _parse_chunks(self) -> bool:
        buf, body = self._buf, self._body
        while True:
            end = buf.find(b"\r\n")
            if end < 0:
                return False
            size = int(bytes(buf[:end]).split(b";", 1)[0], 16)
            if size == 0:
                # Last chunk, then trailers up to an empty line.
                tail = buf.find(b"\r\n\r\n", end)
                if tail < 0:
                    return False
                del buf[:tail + 4]
                if buf:
                    raise ProtocolError("bytes after the last chunk")
                return True
            if len(buf) < end + 2 + size + 2:
                return False
            body += buf[end + 2:end + 2 + size]
            del buf[:end + 2 + size + 2]

    # --- use ------------------------------------------------------------------------

    def send(self, data: bytes, fut: asyncio.Future[Answer], head_request: bool) -> None:
        self._reset()
        self._buf.clear()
        self._head_request = head_request
        t = self.transport
        if t is None or t.is_closing():
            raise StaleConnection("the connection is closing", unsent=True)
        self._fut = fut
        t.write(data)

    @property
    def busy(self) -> bool:
        return self._fut is not None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Keep-alive connections to one ``host:port``, reused most recent first.

    Args:
        host, port: where the API listens.
        ssl: TLS for ``https`` endpoints (``None``: plain TCP).
        limit: connections at most (0: no limit); callers beyond it wait.
        connect_timeout: seconds to open a connection.
        keepalive: seconds an idle connection is kept.
    """

    def __init__(self, host: str, port: int, *, ssl: _ssl.SSLContext | None, limit: int,
                 connect_timeout: float, keepalive: float = 60.0) -> None:
        self.host, self.port, self.ssl = host, port, ssl
        self.limit = limit
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self._idle: list[_Conn] = []
        self._open = 0  # connections open or opening, idle ones included
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def request(self, data: bytes, timeout: float | None, *,
                      head_request: bool = False, idempotent: bool = False) -> Answer:
        """Send one request (``data``: its bytes, head and body) and return the
        answer. ``timeout`` bounds the whole call, connecting included.

        A reused connection that turns out closed before the request could be
        answered is replaced and the request sent again when the request was
        never seen by the server (the write failed) or is ``idempotent``.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        retried = False
        while True:
            # An idle connection without a coroutine of its own: the common case.
            conn = self._take_idle() or await self._acquire(loop, deadline)
            fut: asyncio.Future[Answer] = loop.create_future()
            timer = None
            if deadline is not None:
                timer = loop.call_at(deadline, _expire, fut)
            ok = False
            try:
                conn.send(data, fut, head_request)
                answer = await fut
                ok = not conn.closed
                return answer
            except StaleConnection as e:
                # A request the server may have run is not sent twice.
                if retried or not (e.unsent or idempotent):
                    raise
                retried = True
            finally:
                if timer is not None:
                    timer.cancel()
                self._release(conn, ok)

    def _take_idle(self) -> _Conn | None:
        """The most recently used idle connection still open, if any."""
        idle = self._idle
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive:
                conn.reused = True
                return conn
            self._drop(conn)
        return None

    async def _acquire(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> _Conn:
        """A connection: a new one, or one freed by another call once the
        pool is at its limit."""
        if self._closed:
            raise RuntimeError("the connection pool is closed")
        idle = self._idle
        while self.limit and self._open >= self.limit:
            w: asyncio.Future[None] = loop.create_future()
            self._waiters.append(w)
            try:
                await _bounded(w, deadline, loop)
            finally:
                if not w.done():
                    w.cancel()
                try:
                    self._waiters.remove(w)
                except ValueError:
                    pass
            if idle:
                conn = idle.pop()
                if not conn.closed:
                    conn.reused = True
                    return conn
                self._drop(conn)
        self._open += 1
        try:
            timeout = self.connect_timeout
            if deadline is not None:
                timeout = min(timeout, max(0.0, deadline - loop.time()))
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Conn, self.host, self.port, ssl=self.ssl,
                                       server_hostname=self.host if self.ssl else None),
                timeout)
        except BaseException:
            self._open -= 1
            self._wake()
            raise
        return conn

    def _release(self, conn: _Conn, ok: bool) -> None:
        if ok and not self._closed and not conn.closed and not conn.busy:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
            self._wake()
        else:
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        conn.close()
        self._open -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def close(self) -> None:
        """Close every idle connection; busy ones close when their call ends."""
        self._closed = True
        for conn in self._idle:
            conn.close()
        self._open -= len(self._idle)
        self._idle.clear()
        for w in self._waiters:
            if not w.done():
                w.set_exception(RuntimeError("the connection pool is closed"))
        self._waiters.clear()


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())


async def _bounded(fut: asyncio.Future[None], deadline: float | None,
                   loop: asyncio.AbstractEventLoop) -> None:
    if deadline is None:
        await fut
        return
    timer = loop.call_at(deadline, _expire, fut)
    try:
        await fut
    finally:
        timer.cancel()
