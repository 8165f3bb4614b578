"""Bad input at the HTTP level: every case is a clear 4xx with its error code,
never a 500, and nothing is left behind.

Raw requests (http.client) so that malformed bodies, wrong content types and
lying Content-Length headers reach the server exactly as written.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import dsec
from dsec.sandbox import Sandbox

from .conftest import MAX_UPLOAD_MB, Server, Tenant


def raw(server: Server, token: str | None, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    u = urlsplit(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    try:
        parsed = json.loads(data) if data else {}
    except ValueError:
        pytest.fail(f"{method} {path} answered {resp.status} with a non-JSON body: {data[:200]!r}")
    return resp.status, parsed


def put_chunked(server: Server, token: str, path: str, chunks: list[bytes]) -> bytes:
    """Sends a chunked PUT over a raw socket, the whole body before reading,
    and returns all the server wrote back. The server may answer before the
    body ends; it then reads and drops the rest (a lingering close), so the
    send completes and the answer is there to read, not a reset."""
    u = urlsplit(server.url)
    assert u.hostname and u.port
    head = (f"PUT {path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
            f"Authorization: Bearer {token}\r\nTransfer-Encoding: chunked\r\n"
            "Connection: close\r\n\r\n").encode()
    with socket.create_connection((u.hostname, u.port), timeout=60) as s:
        s.sendall(head)
        for c in chunks:
            s.sendall(b"%x\r\n%s\r\n" % (len(c), c))
        s.sendall(b"0\r\n\r\n")
        reply = b""
        while data := s.recv(1 << 16):
            reply += data
    return reply


def code(body: dict[str, object]) -> object:
    err = body.get("error")
    return err.get("code") if isinstance(err, dict) else None


JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize("payload", [b"{", b"not json", b'{"image": 5}', b"[]", b""])
def test_malformed_json_is_invalid_request(server: Server, tenant: Tenant, payload: bytes) -> None:
    status, body = raw(server, tenant.token, "POST", "/v1/sandboxes", payload, JSON)
    assert (status, code(body)) == (400, "invalid_request"), body


def test_unknown_field_names_the_field(server: Server, tenant: Tenant) -> None:
    status, body = raw(server, tenant.token, "POST", "/v1/sandboxes",
                       json.dumps({"image": "busybox", "imgae": "x"}).encode(), JSON)
    assert (status, code(body)) == (400, "invalid_request")
    assert "imgae" in str(body["error"])


def test_wrong_content_type_is_415(server: Server, tenant: Tenant) -> None:
    status, body = raw(server, tenant.token, "POST", "/v1/sandboxes", b'{"image":"busybox"}',
                       {"Content-Type": "text/plain"})
    assert (status, code(body)) == (415, "unsupported_media_type")


def test_unknown_route_and_method(server: Server, tenant: Tenant) -> None:
    status, body = raw(server, tenant.token, "GET", "/v1/nope")
    assert (status, code(body)) == (404, "not_found")
    status, body = raw(server, tenant.token, "PATCH", "/v1/sandboxes")
    assert (status, code(body)) == (405, "method_not_allowed")


def test_malformed_and_unknown_ids_are_404(server: Server, tenant: Tenant) -> None:
    for sid in ["x", "nosuchnode.abcdefghjkmn", "..%2F..%2Fetc", "a" * 300]:
        status, body = raw(server, tenant.token, "GET", f"/v1/sandboxes/{sid}")
        assert (status, code(body)) == (404, "sandbox_not_found"), sid
        status, body = raw(server, tenant.token, "POST", f"/v1/sandboxes/{sid}/exec",
                           b'{"cmd":"true"}', JSON)
        assert (status, code(body)) == (404, "sandbox_not_found"), sid
    # Dot segments make a path that is no route at all.
    status, body = raw(server, tenant.token, "GET", "/v1/sandboxes/../../etc")
    assert (status, code(body)) == (404, "not_found")


def test_bad_query_values(server: Server, tenant: Tenant) -> None:
    status, body = raw(server, tenant.token, "GET", "/v1/sandboxes?state=sleeping")
    assert (status, code(body)) == (400, "invalid_request")
    status, body = raw(server, tenant.token, "GET", "/v1/sandboxes?label=novalue")
    assert (status, code(body)) == (400, "invalid_request")


def test_missing_token_on_every_kind_of_route(server: Server) -> None:
    for method, path in [("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"),
                         ("GET", "/v1/images"), ("POST", "/v1/tenants")]:
        status, body = raw(server, None, method, path, b"{}", JSON)
        assert (status, code(body)) == (401, "unauthorized"), path


async def test_upload_beyond_the_limit_is_413_and_leaves_nothing(
        server: Server, tenant: Tenant, sandbox: Sandbox) -> None:
    limit = MAX_UPLOAD_MB << 20
    # A Content-Length over the limit is refused before any byte is read.
    path = f"/v1/sandboxes/{sandbox.id}/files?path=/tmp/huge"
    status, body = raw(server, tenant.token, "PUT", path, b"",
                       {"Content-Length": str(limit + 1)})
    assert (status, code(body)) == (413, "payload_too_large")
    # A streamed body (no length) is cut off by the agent at the limit, and
    # answered while the client is still sending.
    chunk = os.urandom(1 << 20)
    reply = put_chunked(server, tenant.token, path, [chunk] * (MAX_UPLOAD_MB + 2))
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413"), reply[:300]
    assert b'"payload_too_large"' in rest, reply[:600]
    assert not await sandbox.exists("/tmp/huge")
    listing = await sandbox.run_shell("ls -a /tmp")
    assert ".tmp" not in listing.stdout and "huge" not in listing.stdout, listing.stdout


async def test_sdk_uploads_beyond_the_limit_raise_payload_too_large(
        sandbox: Sandbox, tmp_path: Path) -> None:
    """Each way the SDK uploads meets the limit differently: a known length
    is refused before the body is read, a tar stream only once the agent has
    seen too much. The user gets PayloadTooLarge either way, never a broken
    pipe, and the client's next call works (its connection pool holds no
    connection the server closed)."""
    big = os.urandom((MAX_UPLOAD_MB + 2) << 20)
    (tmp_path / "file").write_bytes(big)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "big").write_bytes(big)
    uploads = {
        "write_file": lambda: sandbox.write_file("/tmp/w", big),
        "upload of a file": lambda: sandbox.upload(tmp_path / "file", "/tmp/u"),
        "upload of a directory": lambda: sandbox.upload(tmp_path / "dir", "/tmp/d"),
    }
    await sandbox.run_shell("mkdir -p /tmp/kept && echo before > /tmp/kept/big")
    uploads["upload into an existing directory"] = lambda: sandbox.upload(tmp_path / "dir", "/tmp/kept")
    for what, upload in uploads.items():
        for _ in range(2):
            with pytest.raises(dsec.PayloadTooLarge):
                await upload()
            assert (await sandbox.run_shell("echo next")).stdout == "next\n", what
    # Nothing of a refused upload is left: no file, no directory, no partial
    # extraction, no temporary name; what was there is as it was.
    listing = await sandbox.run_shell("ls -a /tmp /tmp/kept")
    for name in ["w", "u", "d"]:
        assert name not in listing.stdout.split(), listing.stdout
    assert ".dsec" not in listing.stdout, listing.stdout
    assert await sandbox.read_file("/tmp/kept/big") == b"before\n"


async def test_symlinks_do_not_leave_the_sandbox(sandbox: Sandbox, tmp_path: object) -> None:
    # A file on the host, at a path that a symlink in the sandbox names.
    marker = f"/tmp/dsec-host-secret-{uuid.uuid4().hex}"
    with open(marker, "w") as f:
        f.write("host secret")
    try:
        await sandbox.run_shell(f"ln -s {marker} /tmp/abs; ln -s ../../../../../..{marker} /tmp/rel; "
                                "ln -s /proc/1/root/etc/hostname /tmp/magic")
        for link in ["/tmp/abs", "/tmp/rel"]:
            with pytest.raises(dsec.FileNotFound):
                await sandbox.read_file(link)
        with pytest.raises((dsec.InvalidPath, dsec.FileNotFound)):
            await sandbox.read_file("/tmp/magic")
        # Writing through a dangling symlink stays inside too.
        await sandbox.write_file("/tmp/abs", b"x")
        with open(marker) as f:
            assert f.read() == "host secret"
    finally:
        os.unlink(marker)
