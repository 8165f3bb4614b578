"""Sandbox ports reached from outside through the API: a server inside a
container answers HTTP (streamed both ways) and WebSocket at
``/v1/sandboxes/{id}/ports/{port}/...`` and at the host ``PORT-ID.DOMAIN``,
with the bearer token or a signed URL; nothing else of the sandbox or the
host is reachable, and a stopped sandbox's ports are refused."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

import dsec.sync

from dsec import DSecClient, InvalidRequest
from dsec.sandbox import Sandbox

from .conftest import SANDBOX_DOMAIN, Server, Tenant, run_args

PORT = 8000
SERVER_SCRIPT = (Path(__file__).parent / "port_echo_server.py").read_bytes()
#: Larger than any buffer on the way, so only a streamed body gets through
#: quickly and whole.
BIG = 48 << 20
#: Generous: the host is busy and Python starts slowly there.
READY_TIMEOUT_S = 90


def pattern(n: int) -> bytes:
    block = bytes(range(256)) * 256
    return (block * (n // len(block) + 1))[:n]


async def start_server(sb: Sandbox, session: aiohttp.ClientSession, base: str, token: str) -> None:
    """Uploads and starts the echo server, then waits until the proxy
    reaches it."""
    await sb.write_file("/tmp/port_echo_server.py", SERVER_SCRIPT)
    r = await sb.run_shell(f"(setsid python3 /tmp/port_echo_server.py {PORT} >/tmp/srv.log 2>&1 &)")
    assert r.exit_code == 0, r
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        async with session.get(f"{base}/ready", headers=bearer(token)) as resp:
            if resp.status == 200:
                return
            body = await resp.json()
            assert resp.status == 502 and body["error"]["code"] == "port_closed", body
        if time.monotonic() > deadline:
            log = (await sb.run_shell("cat /tmp/srv.log")).stdout
            pytest.fail(f"the echo server did not come up in {READY_TIMEOUT_S} s; its log: {log}")
        await asyncio.sleep(0.3)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
        yield s


@pytest.fixture
async def served(sandbox: Sandbox, http: aiohttp.ClientSession, server: Server,
                 tenant: Tenant) -> tuple[Sandbox, str]:
    """A sandbox running the echo server, and the proxy's base URL for it."""
    base = f"{server.url}/v1/sandboxes/{sandbox.id}/ports/{PORT}"
    await start_server(sandbox, http, base, tenant.token)
    return sandbox, base


async def test_get_and_post_stream_large_bodies_both_ways(served: tuple[Sandbox, str],
                                                           http: aiohttp.ClientSession,
                                                           tenant: Tenant) -> None:
    _, base = served
    async with http.get(f"{base}/bytes", params={"n": str(BIG)}, headers=bearer(tenant.token)) as resp:
        assert resp.status == 200
        h, n = hashlib.sha256(), 0
        async for piece in resp.content.iter_chunked(1 << 16):
            h.update(piece)
            n += len(piece)
    assert n == BIG and h.hexdigest() == hashlib.sha256(pattern(BIG)).hexdigest()

    async def upload() -> AsyncIterator[bytes]:
        data = pattern(BIG)
        for i in range(0, BIG, 1 << 20):
            yield data[i:i + (1 << 20)]

    # A chunked upload of unknown length, then one with a Content-Length.
    for body in (upload(), pattern(BIG)):
        async with http.post(f"{base}/sha256", data=body, headers=bearer(tenant.token)) as resp:
            assert resp.status == 200, await resp.text()
            got = await resp.json()
        assert got == {"sha256": hashlib.sha256(pattern(BIG)).hexdigest(), "length": BIG}


async def test_the_server_sees_its_own_path_query_and_headers_not_the_token(
        served: tuple[Sandbox, str], http: aiohttp.ClientSession, tenant: Tenant) -> None:
    _, base = served
    async with http.put(f"{base}/a/b%20c?x=1&y=two", data=b"payload",
                        headers={**bearer(tenant.token), "X-App": "mine"}) as resp:
        assert resp.status == 200
        seen = await resp.json()
    assert seen["method"] == "PUT"
    assert seen["path"] == "/a/b%20c?x=1&y=two"
    assert seen["headers"]["x-app"] == "mine"
    assert seen["body"] == "payload"
    assert "authorization" not in seen["headers"], "the platform's token must not reach the sandbox"
    assert not any(k.startswith("x-dsec") for k in seen["headers"])


async def test_websocket_echo_through_the_proxy(served: tuple[Sandbox, str],
                                                http: aiohttp.ClientSession, tenant: Tenant) -> None:
    _, base = served
    async with http.ws_connect(f"{base}/ws", headers=bearer(tenant.token)) as ws:
        await ws.send_str("hello")
        assert (await ws.receive(timeout=60)).data == "hello"
        blob = os.urandom(200_000)
        await ws.send_bytes(blob)
        assert (await ws.receive(timeout=60)).data == blob


async def test_signed_url_works_without_a_token_until_it_expires_or_is_altered(
        served: tuple[Sandbox, str], http: aiohttp.ClientSession) -> None:
    sb, _ = served
    url = await sb.expose(PORT)
    assert "dsec_sig=" in url
    async with http.get(url.replace("/?", "/echo?extra=1&", 1)) as resp:
        assert resp.status == 200, await resp.text()
        seen = await resp.json()
    assert seen["path"] == "/echo?extra=1", "the signature's parameters are not passed on"
    # WebSocket by signed URL.
    async with http.ws_connect(url.replace("/?", "/ws?", 1)) as ws:
        await ws.send_str("signed")
        assert (await ws.receive(timeout=60)).data == "signed"
    # An altered signature, tenant or expiry.
    sig = url.rsplit("dsec_sig=", 1)[1][:64]
    flipped = ("0" if sig[0] != "0" else "1") + sig[1:]
    for bad in (url.replace(sig, flipped), url.replace("dsec_tenant=", "dsec_tenant=x"),
                url.replace("dsec_expires=", "dsec_expires=9")):
        async with http.get(bad) as resp:
            assert resp.status == 401, bad
            assert (await resp.json())["error"]["code"] == "unauthorized"
    # A URL for another port of the same sandbox is not this one's.
    async with http.get(url.replace(f"/ports/{PORT}/", f"/ports/{PORT + 1}/")) as resp:
        assert resp.status == 401
    # The signature in the path: a base URL to append paths and queries to.
    base_url = await sb.expose(PORT, base=True)
    assert "/v1/port-urls/" in base_url and "?" not in base_url
    async with http.post(f"{base_url}/p/q?r=1", data=b"x") as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["path"] == "/p/q?r=1"
    async with http.ws_connect(f"{base_url}/ws") as ws:
        await ws.send_str("by path")
        assert (await ws.receive(timeout=60)).data == "by path"
    token = base_url.rsplit("/", 1)[1]
    async with http.get(base_url.replace(token, token[:-1] + ("0" if token[-1] != "0" else "1"))) as resp:
        assert resp.status == 401
    short = await sb.expose(PORT, ttl_s=1)
    short_base = await sb.expose(PORT, ttl_s=1, base=True)
    await asyncio.sleep(2.5)
    for expired in (short, short_base + "/"):
        async with http.get(expired) as resp:
            assert resp.status == 401
            assert "expired" in (await resp.json())["error"]["message"]


async def test_bad_credentials_and_bad_ports_are_refused(served: tuple[Sandbox, str],
                                                        http: aiohttp.ClientSession, server: Server,
                                                        other_tenant: Tenant, tenant: Tenant) -> None:
    sb, base = served
    async with http.get(f"{base}/") as resp:
        assert resp.status == 401
    async with http.get(f"{base}/", headers=bearer("dsec_wrong")) as resp:
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "unauthorized"
    # Another tenant does not see the sandbox at all.
    async with http.get(f"{base}/", headers=bearer(other_tenant.token)) as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "sandbox_not_found"
    for port in ("0", "65536", "http"):
        async with http.get(f"{server.url}/v1/sandboxes/{sb.id}/ports/{port}/",
                            headers=bearer(tenant.token)) as resp:
            assert resp.status == 400, port
    async with DSecClient(server.url, tenant.token) as c:
        with pytest.raises(InvalidRequest):
            await c.sandbox(sb.id).expose(0)


async def test_nothing_but_the_sandbox_loopback_is_reachable(served: tuple[Sandbox, str],
                                                            http: aiohttp.ClientSession,
                                                            server: Server, tenant: Tenant) -> None:
    sb, _ = served
    # A listener on the host's loopback, on a port the sandbox does not use.
    with socket.socket() as host_listener:
        host_listener.bind(("127.0.0.1", 0))
        host_listener.listen(1)
        host_port = host_listener.getsockname()[1]
        async with http.get(f"{server.url}/v1/sandboxes/{sb.id}/ports/{host_port}/",
                            headers=bearer(tenant.token)) as resp:
            assert resp.status == 502
            assert (await resp.json())["error"]["code"] == "port_closed"
        # The API's own port, as seen from the host, is not the sandbox's either.
        api_port = int(server.url.rsplit(":", 1)[1])
        async with http.get(f"{server.url}/v1/sandboxes/{sb.id}/ports/{api_port}/healthz",
                            headers=bearer(tenant.token)) as resp:
            assert resp.status == 502


async def test_host_based_routing_reaches_the_same_port(served: tuple[Sandbox, str],
                                                       http: aiohttp.ClientSession,
                                                       server: Server, tenant: Tenant) -> None:
    sb, _ = served
    host = f"{PORT}-{sb.id}.{SANDBOX_DOMAIN}"
    async with http.get(f"{server.url}/files?x=1", headers={**bearer(tenant.token), "Host": host}) as resp:
        assert resp.status == 200, await resp.text()
        seen = await resp.json()
    assert seen["path"] == "/files?x=1", "the sandbox's own paths, not the API's routes"
    async with http.get(f"{server.url}/", headers={"Host": host}) as resp:
        assert resp.status == 401
    # The signed query works on the host too.
    url = await sb.expose(PORT)
    query = url.split("?", 1)[1]
    async with http.get(f"{server.url}/q?{query}", headers={"Host": host}) as resp:
        assert resp.status == 200
        assert (await resp.json())["path"] == "/q"
    # The API's own host is still the API.
    async with http.get(f"{server.url}/healthz") as resp:
        assert resp.status == 200 and "nodes" in await resp.json()


async def test_a_stopped_sandbox_drops_its_connections_and_refuses_new_ones(
        served: tuple[Sandbox, str], http: aiohttp.ClientSession, tenant: Tenant) -> None:
    sb, base = served
    url = await sb.expose(PORT)
    async with http.ws_connect(f"{base}/ws", headers=bearer(tenant.token)) as ws:
        await ws.send_str("before")
        assert (await ws.receive(timeout=60)).data == "before"
        await sb.stop()
        msg = await ws.receive(timeout=120)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR), msg
    for target, headers in ((f"{base}/", bearer(tenant.token)), (url, {})):
        async with http.get(target, headers=headers) as resp:
            assert resp.status == 409
            assert (await resp.json())["error"]["code"] == "sandbox_not_running"


async def test_sync_client_and_cli_give_working_urls(served: tuple[Sandbox, str], server: Server,
                                                    tenant: Tenant, http: aiohttp.ClientSession) -> None:
    sb, _ = served
    def sync_url() -> str:
        with dsec.sync.DSecClient(server.url, tenant.token) as c:
            return c.sandbox(sb.id).expose(PORT, ttl_s=600)

    binary = os.environ.get("DSEC_BIN") or "dsec"
    cli = subprocess.run([binary, "port", sb.id, str(PORT), "--endpoint", server.url, "--token", tenant.token],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    for url in (await asyncio.to_thread(sync_url), cli.stdout.strip()):
        async with http.get(url.replace("/?", "/from-url?", 1)) as resp:
            assert resp.status == 200, url
            assert json.loads(await resp.text())["path"] == "/from-url"


def _raw_get(address: str, path: str) -> bytes:
    """One HTTP/1.0 request over a plain socket: what a client that knows
    only HOST:PORT does."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: anything\r\n\r\n".encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def _dechunk(response: bytes) -> bytes:
    """The body of a chunked HTTP response."""
    head, _, rest = response.partition(b"\r\n\r\n")
    assert b"chunked" in head.lower(), head
    body = b""
    while True:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return body
        body, rest = body + rest[:n], rest[n + 2:]


async def test_a_tcp_forward_publishes_the_port_as_host_and_port(served: tuple[Sandbox, str],
                                                                 server: Server,
                                                                 tenant: Tenant) -> None:
    sb, _ = served
    fwd = await sb.forward_tcp(PORT, ttl_s=600)
    assert fwd.port == PORT and fwd.host == "127.0.0.1" and fwd.address == f"127.0.0.1:{fwd.node_port}"
    assert fwd.expires_at > time.time() + 500
    # Several connections, one at a time and at once, each its own.
    answer = await asyncio.to_thread(_raw_get, fwd.address, "/plain?n=1")
    assert answer.startswith(b"HTTP/1.") and b'"/plain?n=1"' in answer, answer[:300]
    many = await asyncio.gather(*(asyncio.to_thread(_raw_get, fwd.address, f"/c{i}") for i in range(8)))
    assert all(f'"/c{i}"'.encode() in a for i, a in enumerate(many))
    big = await asyncio.to_thread(_raw_get, fwd.address, f"/bytes?n={8 << 20}")
    assert _dechunk(big) == pattern(8 << 20)
    # A source it does not allow is dropped at once, before the sandbox.
    only_elsewhere = await sb.forward_tcp(PORT, allow_from=["192.0.2.0/24"])
    try:
        dropped = await asyncio.to_thread(_raw_get, only_elsewhere.address, "/")
    except ConnectionResetError:
        dropped = b""
    assert dropped == b"", dropped[:200]
    mine = await sb.forward_tcp(PORT, allow_from=["127.0.0.0/8"])
    assert b'"/ok"' in await asyncio.to_thread(_raw_get, mine.address, "/ok")
    # The CLI prints the address; bad requests are refused clearly.
    binary = os.environ.get("DSEC_BIN") or "dsec"
    cli = subprocess.run([binary, "port", sb.id, str(PORT), "--tcp", "--ttl", "60", "--endpoint", server.url,
                          "--token", tenant.token], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert b'"/cli"' in await asyncio.to_thread(_raw_get, cli.stdout.strip(), "/cli")
    for bad in ({"ttl_s": 0}, {"ttl_s": 8 * 24 * 3600}, {"allow_from": ["10.0.0.0/40"]},
                {"allow_from": ["example.org"]}):
        with pytest.raises(InvalidRequest):
            await sb.forward_tcp(PORT, **bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        await sb.forward_tcp(0)
    # It closes at its expiry, and with the sandbox.
    short = await sb.forward_tcp(PORT, ttl_s=1)
    await asyncio.sleep(2.5)
    with pytest.raises(OSError):
        await asyncio.to_thread(_raw_get, short.address, "/")
    await sb.stop()
    for f in (fwd, mine):
        deadline = time.monotonic() + 30
        while True:
            try:
                await asyncio.to_thread(_raw_get, f.address, "/")
            except OSError:
                break
            assert time.monotonic() < deadline, f"{f.address} still open after the sandbox stopped"
            await asyncio.sleep(0.2)
