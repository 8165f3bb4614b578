"""E2B's ``get_host(port)`` against dsec: the sandbox domain the API answers
(``dsec up --sandbox-domain``) makes ``PORT-ID.DOMAIN``, which the port
proxy serves; a request to that host (with the dsec token, which E2B users
already hold as their API key) reaches the server inside."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request

import pytest
from e2b import AsyncSandbox, Sandbox

from ..conftest import SANDBOX_DOMAIN, Server, Tenant

PORT = 8000
#: Generous: the host is busy and Python starts slowly there.
READY_TIMEOUT_S = 90


def get_via_host(server: Server, host: str, path: str, token: str | None) -> tuple[int, bytes]:
    req = urllib.request.Request(server.url + path, headers={"Host": host})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_for(server: Server, host: str, token: str) -> bytes:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        status, body = get_via_host(server, host, "/hi.txt", token)
        if status == 200:
            return body
        assert status == 502, body
        if time.monotonic() > deadline:
            pytest.fail(f"nothing answered at {host} in {READY_TIMEOUT_S} s: {body!r}")
        time.sleep(0.3)


def test_get_host_reaches_a_server_in_the_sandbox(sbx: Sandbox, server: Server, tenant: Tenant) -> None:
    host = sbx.get_host(PORT)
    assert host == f"{PORT}-{sbx.sandbox_id}.{SANDBOX_DOMAIN}"
    sbx.files.write("/tmp/www/hi.txt", "hello from e2b\n")
    sbx.commands.run(f"python3 -m http.server {PORT} --directory /tmp/www", background=True)
    assert wait_for(server, host, tenant.token) == b"hello from e2b\n"
    assert get_via_host(server, host, "/hi.txt", None)[0] == 401


async def test_get_host_with_the_async_client(image: str, server: Server, tenant: Tenant) -> None:
    s = await AsyncSandbox.create(template=image, timeout=120, metadata={"suite": "e2b"})
    try:
        host = s.get_host(PORT)
        assert host == f"{PORT}-{s.sandbox_id}.{SANDBOX_DOMAIN}"
        await s.files.write("/tmp/www/hi.txt", "async\n")
        await s.commands.run(f"python3 -m http.server {PORT} --directory /tmp/www", background=True)
        # urllib blocks: keep it off the event loop.
        assert await asyncio.to_thread(wait_for, server, host, tenant.token) == b"async\n"
    finally:
        await s.kill()
