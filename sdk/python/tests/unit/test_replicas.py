"""Several endpoints: which calls go to the next replica when one cannot be
reached, and that a creation retried there makes one sandbox."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from dsec import DSecClient, DSecContainerRunArgs
from dsec.errors import DSecConnectionError

from .fake_server import TOKEN, FakeDSec


def _closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


def _read_request(conn: socket.socket) -> bytes:
    """One HTTP request with a Content-Length body (what the SDK sends)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


class DyingReplica:
    """A replica that dies after doing the work: it passes each request on
    to ``upstream`` (the server really acts on it), reads the answer, and
    closes the client's connection without answering."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.seen: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                request = _read_request(conn)
                if not request:
                    continue
                self.seen.append(request)
                with socket.create_connection(self.upstream) as up:
                    up.sendall(request)
                    up.recv(65536)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def dying(fake: FakeDSec) -> Iterator[DyingReplica]:
    r = DyingReplica(fake.url)
    yield r
    r.close()


def test_endpoints_from_the_environment_and_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSEC_ENDPOINT", "http://10.0.0.1:8080, 10.0.0.2:8080/")
    c = DSecClient()
    assert c.endpoints == ["http://10.0.0.1:8080", "http://10.0.0.2:8080"]
    assert c.endpoint == "http://10.0.0.1:8080"
    assert DSecClient(["a:1", "http://b:2"]).endpoints == ["http://a:1", "http://b:2"]
    assert DSecClient("http://a:1,http://b:2").endpoints == ["http://a:1", "http://b:2"]
    with pytest.raises(ValueError, match="no endpoint"):
        DSecClient(" , ")


async def test_a_replica_refusing_connections_is_passed_over(fake: FakeDSec) -> None:
    dead = f"http://127.0.0.1:{_closed_port()}"
    async with DSecClient([dead, fake.url], TOKEN) as c:
        assert await c.list() == []
        assert c.endpoint == fake.url, "the replica that answered is current"
        sb = await c.run_container(DSecContainerRunArgs(container_image="busybox"))
        # Never sent anywhere else: even a call that is not safe to repeat
        # goes to the next replica when the first refused the connection.
        assert (await sb.run_shell("echo hi")).exit_code == 0
    async with DSecClient([dead, fake.url], TOKEN) as c:
        await c.sandbox(sb.id).run_shell("echo again")


async def test_every_creation_carries_a_key_but_a_first_command(client: DSecClient,
                                                                fake: FakeDSec) -> None:
    await client.run_container(DSecContainerRunArgs(container_image="busybox"))
    await client.run_container(DSecContainerRunArgs(container_image="busybox"))
    keys = [h.get("idempotency-key") for h in fake.headers if "idempotency-key" in h]
    assert len(keys) == 2 and keys[0] != keys[1] and all(len(k) == 32 for k in keys)
    await client.run_container(DSecContainerRunArgs(container_image="busybox"),
                               first_command="true")
    assert "idempotency-key" not in fake.headers[-1]


async def test_a_creation_retried_through_another_replica_makes_one_sandbox(
        fake: FakeDSec, dying: DyingReplica) -> None:
    async with DSecClient([dying.url, fake.url], TOKEN) as c:
        sb = await c.run_container(DSecContainerRunArgs(container_image="busybox"))
        assert c.endpoint == fake.url
    assert len(dying.seen) == 1, "the first replica got the creation and acted on it"
    assert list(fake.sandboxes) == [sb.id], "the retry found the sandbox the first try made"
    sent = [h["idempotency-key"] for h in fake.headers if "idempotency-key" in h]
    assert len(sent) == 2 and sent[0] == sent[1], "both tries carried the same key"


async def test_a_call_that_may_have_run_is_not_sent_again(fake: FakeDSec,
                                                          dying: DyingReplica) -> None:
    async with DSecClient(fake.url, TOKEN) as c:
        sb = await c.run_container(DSecContainerRunArgs(container_image="busybox"))
    execs_before = sum(1 for m, p, _ in fake.requests if p.endswith("/exec"))
    async with DSecClient([dying.url, fake.url], TOKEN) as c:
        with pytest.raises(DSecConnectionError, match=dying.url):
            await c.sandbox(sb.id).run_shell("echo once")
        # The replica died under a command that may have run: it is not
        # sent again; the next call (a read) moves on.
        assert [s.id for s in await c.list()] == [sb.id]
        assert c.endpoint == fake.url
    execs = sum(1 for m, p, _ in fake.requests if p.endswith("/exec"))
    assert execs == execs_before + 1, "the command ran once, through the replica that died"


async def test_streams_and_downloads_follow_the_current_replica(fake: FakeDSec) -> None:
    dead = f"http://127.0.0.1:{_closed_port()}"
    async with DSecClient([dead, fake.url], TOKEN) as c:
        sb = await c.run_container(DSecContainerRunArgs(container_image="busybox"))
        await sb.write_file("/tmp/a.txt", b"over there")
        # Through aiohttp (a download, a WebSocket), not the pooled calls.
        assert await sb.read_file("/tmp/a.txt") == b"over there"
        async with sb.stream_shell("echo hi") as stream:
            result = await stream.wait()
        assert result.stdout == "line 1\nline 2\n", "the fake's scripted stream answered"
