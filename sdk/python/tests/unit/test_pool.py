"""The pooled HTTP/1.1 transport against raw servers that answer byte by byte
as written here: framing, keep-alive reuse, stale connections, deadlines,
the connection limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from dsec import DSecConnectionError, DSecTimeoutError
from dsec._http import Transport
from dsec.errors import SandboxNotFound

#: Reads one request (head and body) and writes whatever it wants; returns
#: False to close the connection.
Handler = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


class RawServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.open_now = 0
        self.most_open = 0
        self.requests: list[bytes] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                self.requests.append(head + body)
                if not await self.handler(head + body, reader, writer):
                    return
                await writer.drain()
        finally:
            self.open_now -= 1
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


def ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + extra +
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


@pytest.fixture
async def transports() -> AsyncIterator[list[Transport]]:
    made: list[Transport] = []
    yield made
    for t in made:
        await t.close()


async def open_transport(made: list[Transport], url: str, *, timeout: float | None = 5,
                         max_connections: int = 16) -> Transport:
    t = Transport(url, "tok", timeout=timeout, connect_timeout=2,
                  max_connections=max_connections)
    await t.open()
    made.append(t)
    return t


async def test_keep_alive_reuses_one_connection(transports: list[Transport]) -> None:
    async def handler(req: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(ok())
        return True

    srv = RawServer(handler)
    async with srv as url:
        t = await open_transport(transports, url)
        for _ in range(20):
            assert await t.request("POST", t.url("/v1/x"), json_body={"a": 1}) == {"ok": True}
    assert srv.connections == 1
    first = srv.requests[0]
    assert first.startswith(b"POST /v1/x HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer tok\r\n" in first
    assert b"\r\nContent-Type: application/json\r\n" in first
    assert first.endswith(b'\r\n\r\n{"a":1}')


async def test_chunked_answer_interim_answer_and_query(transports: list[Transport]) -> None:
    async def handler(req: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"4\r\n{\"a\"\r\n")
        await w.drain()
        await asyncio.sleep(0.01)  # the rest in another read
        w.write(b"3;ext=1\r\n:[1\r\n2\r\n]}\r\n0\r\n\r\n")
        return True

    srv = RawServer(handler)
    async with srv as url:
        t = await open_transport(transports, url)
        got = await t.request("GET", t.url("/v1/y"), params=[("label", "a=b c"), ("x", "1")])
        assert got == {"a": [1]}
        assert await t.request("GET", t.url("/v1/y")) == {"a": [1]}
    assert srv.requests[0].startswith(b"GET /v1/y?label=a%3Db%20c&x=1 HTTP/1.1\r\n")
    assert srv.connections == 1


async def test_answer_delimited_by_close(transports: list[Transport]) -> None:
    async def handler(req: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(b'HTTP/1.0 200 OK\r\n\r\n{"closed":')
        await w.drain()
        w.write(b"1}")
        return False

    srv = RawServer(handler)
    async with srv as url:
        t = await open_transport(transports, url)
        assert await t.request("GET", t.url("/a")) == {"closed": 1}
        assert await t.request("GET", t.url("/a")) == {"closed": 1}
    assert srv.connections == 2


async def test_empty_answer_and_error_answer(transports: list[Transport]) -> None:
    async def handler(req: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        if req.startswith(b"DELETE"):
            w.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        else:
            w.write(b"HTTP/1.1 404 Not Found\r\nRetry-After: 7\r\n" + ok(
                b'{"error":{"code":"sandbox_not_found","message":"gone"}}')[17:])
        return True

    srv = RawServer(handler)
    async with srv as url:
        t = await open_transport(transports, url)
        assert await t.request("DELETE", t.url("/s")) is None
        with pytest.raises(SandboxNotFound) as e:
            await t.request("GET", t.url("/s"))
        assert e.value.status == 404
        assert e.value.retry_after == 7
        assert await t.request("DELETE", t.url("/s")) is None
    assert srv.connections == 1


def drop_second_request(state: dict[str, int]) -> Handler:
    """Answers the first request of each connection; closes a connection on
    its second request without answering (a server dropping an idle
    connection just as the request arrives)."""
    async def handler(req: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        state["n"] += 1
        if state["n"] == 2:
            return False
        w.write(ok())
        return True
    return handler


async def test_stale_connection_is_retried_for_idempotent_calls(
        transports: list[Transport]) -> None:
    srv = RawServer(drop_second_request({"n": 0}))
    async with srv as url:
        t = await open_transport(transports, url)
        assert await t.request("GET", t.url("/a")) == {"ok": True}
        assert await t.request("GET", t.url("/a")) == {"ok": True}
    assert srv.connections == 2
    assert len(srv.requests) == 3


async def test_stale_connection_is_not_retried_for_post(transports: list[Transport]) -> None:
    srv = RawServer(drop_second_request({"n": 0}))
    async with srv as url:
        t = await open_transport(transports, url)
        assert await t.request("POST", t.url("/exec"), json_body={}) == {"ok": True}
        with pytest.raises(DSecConnectionError):
            await t.request("POST", t.url("/exec"), json_body={})
        # The pool recovers with a fresh connection.
        assert await t.request("POST", t.url("/exec"), json_body={}) == {"ok": True}
    assert len(srv.requests) == 3


async def test_deadline_drops_the_connection(transports: list[Transport]) -> None:
    async def handler(req: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        if b"/slow" in req:
            await asyncio.sleep(5)
            return False
        w.write(ok())
        return True

    srv = RawServer(handler)
    async with srv as url:
        t = await open_transport(transports, url, timeout=0.2)
        with pytest.raises(DSecTimeoutError):
            await t.request("GET", t.url("/slow"))
        assert await t.request("GET", t.url("/fast")) == {"ok": True}
    assert srv.connections == 2


async def test_cancelled_call_drops_its_connection(transports: list[Transport]) -> None:
    async def handler(req: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        if b"/slow" in req:
            await asyncio.sleep(0.3)
        w.write(ok())
        return True

    srv = RawServer(handler)
    async with srv as url:
        t = await open_transport(transports, url)
        task = asyncio.ensure_future(t.request("GET", t.url("/slow")))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Not answered by the late answer of the cancelled call.
        assert await t.request("GET", t.url("/fast")) == {"ok": True}
    assert srv.connections == 2


async def test_connection_limit_queues_callers(transports: list[Transport]) -> None:
    async def handler(req: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.02)
        w.write(ok())
        return True

    srv = RawServer(handler)
    async with srv as url:
        t = await open_transport(transports, url, max_connections=2)
        got = await asyncio.gather(*(t.request("GET", t.url("/a")) for _ in range(10)))
        assert got == [{"ok": True}] * 10
    assert srv.most_open == 2


async def test_garbage_answer_is_a_connection_error(transports: list[Transport]) -> None:
    async def handler(req: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        return True

    srv = RawServer(handler)
    async with srv as url:
        t = await open_transport(transports, url)
        with pytest.raises(DSecConnectionError, match="bad status line"):
            await t.request("GET", t.url("/a"))


async def test_refused_connection_is_a_connection_error(transports: list[Transport]) -> None:
    srv = RawServer(drop_second_request({"n": 0}))
    async with srv as url:
        pass  # closed: nothing listens there any more
    t = await open_transport(transports, url)
    with pytest.raises(DSecConnectionError, match="cannot reach"):
        await t.request("GET", t.url("/a"))
