"""The asyncio client against the fake server: wire format and error mapping."""

from __future__ import annotations

import asyncio
from typing import Any
import base64
import os
import socket
from pathlib import Path

import pytest

import dsec
from dsec import DSecClient, DSecContainerRunArgs, DSecRunArgs, ExecResult, OutputChunk

from .fake_server import TOKEN, FakeDSec


def listing_args(**kw: Any) -> DSecContainerRunArgs:
    return DSecContainerRunArgs(container_image="python", memory_limit_mb=1024,
                                cpu_cores_limit=1, ttl_running_stop=300,
                                network_rules={}, init_user="root", **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- configuration -----------------------------------------------------------------


async def test_paper_listing_with_env(fake: FakeDSec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSEC_ENDPOINT", fake.url)
    monkeypatch.setenv("DSEC_TOKEN", TOKEN)
    client = DSecClient()
    await client.open()
    args = DSecContainerRunArgs(container_image="python", memory_limit_mb=1024,
                                cpu_cores_limit=1, ttl_running_stop=300,
                                network_rules={}, init_user="root")
    sandbox = await client.run_container(args, timeout=120)
    result = await sandbox.run_shell("echo hello world")
    assert result.exit_code == 0 and result.stdout == "hello world\n"
    await sandbox.stop()
    await client.close()
    method, path, body = fake.requests[0]
    assert (method, path) == ("POST", "/v1/sandboxes")
    assert body == {"backend": "container", "image": "python", "memory_limit_mb": 1024,
                    "cpu_cores_limit": 1, "ttl_running_stop": 300, "init_user": "root"}
    assert fake.headers[0]["Authorization"] == f"Bearer {TOKEN}"
    assert fake.headers[-1]["Authorization"] == f"Bearer {TOKEN}"
    assert sandbox.info.state == "stopped"


async def test_token_file(fake: FakeDSec, monkeypatch: pytest.MonkeyPatch,
                          tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("DSEC_TOKEN_FILE", str(token_file))
    async with DSecClient(fake.url) as client:
        assert await client.list() == []


async def test_token_env_wins_over_file(fake: FakeDSec, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    (tmp_path / "token").write_text("wrong")
    monkeypatch.setenv("DSEC_TOKEN_FILE", str(tmp_path / "token"))
    monkeypatch.setenv("DSEC_TOKEN", TOKEN)
    async with DSecClient(fake.url) as client:
        assert await client.list() == []


def test_default_endpoint() -> None:
    assert DSecClient().endpoint == "http://127.0.0.1:8080"
    assert DSecClient("127.0.0.1:9/").endpoint == "http://127.0.0.1:9"


async def test_lazy_open(fake: FakeDSec) -> None:
    client = DSecClient(fake.url, TOKEN)
    assert not client.is_open
    assert (await client.health()).status == "ok"
    assert client.is_open
    await client.close()
    assert not client.is_open


async def test_health_needs_no_token(fake: FakeDSec) -> None:
    async with DSecClient(fake.url) as client:
        h = await client.health()
        assert h.nodes[0].name == "node-1"
    assert "Authorization" not in fake.headers[-1]


# --- sandboxes -------------------------------------------------------------------


async def test_run_generic_backend(client: DSecClient, fake: FakeDSec) -> None:
    sb = await client.run(DSecRunArgs(backend="container", image="busybox", labels={"a": "b"}))
    assert sb.info.image == "busybox"
    assert fake.requests[-1][2] == {"backend": "container", "image": "busybox",
                                    "labels": {"a": "b"}}


async def test_run_container_refuses_other_backend(client: DSecClient) -> None:
    with pytest.raises(ValueError):
        await client.run_container(DSecRunArgs(backend="vm", image="x"))
    with pytest.raises(TypeError):
        await client.run({"image": "x"})  # type: ignore[arg-type]


async def test_get_connect_and_handle(client: DSecClient) -> None:
    sb = await client.run_container(listing_args())
    info = await client.get(sb.id)
    assert info.id == sb.id and info.state == "running"
    assert info.limits.memory_limit_mb == 1024
    other = await client.connect(sb.id)
    assert other.info.id == sb.id
    handle = client.sandbox(sb.id)
    assert (await handle.run_shell("true")).exit_code == 0
    with pytest.raises(dsec.SandboxNotFound):
        await client.connect("sb-missing")
    with pytest.raises(dsec.SandboxNotFound):
        await client.sandbox("sb-missing").run_shell("true")


async def test_list_filters(client: DSecClient, fake: FakeDSec) -> None:
    a = await client.run(DSecRunArgs(image="python", labels={"task": "t1", "run": "1"},
                                     job="j1"))
    await client.run(DSecRunArgs(image="python", labels={"task": "t2"}, job="j1"))
    await client.run(DSecRunArgs(image="python"))
    assert len(await client.list()) == 3
    assert [s.id for s in await client.list(labels={"task": "t1", "run": "1"})] == [a.id]
    assert len(await client.list(job="j1")) == 2
    assert len(await client.list(state="running", job="j1", labels={"task": "t2"})) == 1
    await a.stop()
    assert [s.id for s in await client.list(state="stopped")] == [a.id]
    path = fake.requests[-1][1]
    assert path == "/v1/sandboxes?state=stopped"
    labelled = [p for m, p, _ in fake.requests if "label=" in p][0]
    assert "label=task%3Dt1" in labelled or "label=task=t1" in labelled


async def test_stop_delete_and_context_manager(client: DSecClient, fake: FakeDSec) -> None:
    sb = await client.run_container(listing_args())
    info = await sb.stop()
    assert info.state == "stopped" and sb.state == "stopped"
    with pytest.raises(dsec.SandboxNotRunning):
        await sb.run_shell("true")
    await sb.delete()
    assert sb.id not in fake.sandboxes
    with pytest.raises(dsec.SandboxNotFound):
        await sb.refresh()

    async with await client.run_container(listing_args()) as sb2:
        assert (await sb2.refresh()).is_running
    assert sb2.id not in fake.sandboxes

    async with await client.run_container(listing_args()) as sb3:
        await sb3.delete()  # deleting inside the block is fine
    assert not fake.sandboxes


async def test_qos_class_at_creation_and_while_running(client: DSecClient, fake: FakeDSec) -> None:
    sb = await client.run_container(listing_args(qos_class="best_effort"))
    assert fake.sandboxes[sb.id].body["qos_class"] == "best_effort"
    assert sb.info.qos_class == "best_effort"
    info = await sb.set_qos_class("latency_sensitive")
    assert info.qos_class == "latency_sensitive" == sb.info.qos_class
    # Without one, the field is left out: the server's default per backend.
    plain = await client.run_container(listing_args())
    assert "qos_class" not in fake.sandboxes[plain.id].body


# --- exec ------------------------------------------------------------------------


async def test_exec_body_only_set_fields(client: DSecClient, fake: FakeDSec) -> None:
    sb = await client.run_container(listing_args())
    await sb.run_shell("true")
    assert fake.requests[-1][2] == {"cmd": "true"}
    await sb.run_shell("whoami", timeout=5, env={"A": "1"}, cwd="/tmp", user="root",
                       session="s1", stdin="in", max_output_bytes=10)
    assert fake.requests[-1][2] == {"cmd": "whoami", "timeout": 5, "env": {"A": "1"},
                                    "cwd": "/tmp", "user": "root", "session": "s1",
                                    "stdin": "in", "max_output_bytes": 10}
    await sb.exec(["printf", "%s", "a b"], stdin=b"\x00\xff")
    assert fake.requests[-1][2] == {"argv": ["printf", "%s", "a b"],
                                    "stdin_b64": base64.b64encode(b"\x00\xff").decode()}
    assert fake.requests[-1][1] == f"/v1/sandboxes/{sb.id}/exec"
    assert fake.headers[-1]["Content-Type"] == "application/json"


async def test_exec_results(client: DSecClient) -> None:
    sb = await client.run_container(listing_args())
    r = await sb.run_shell("exit 3")
    assert isinstance(r, ExecResult)
    assert r.exit_code == 3 and not r.ok
    r = await sb.run_shell("sleep-forever", timeout=1)
    assert r.timed_out and r.signal == 15 and r.exit_code == 143
    r = await sb.run_shell("binary")
    assert r.stdout == "hi"
    r = await sb.exec(["echo", "x y"])
    assert r.stdout == "x y\n"


async def test_exec_rejects_a_string_argv(client: DSecClient) -> None:
    sb = await client.run_container(listing_args())
    with pytest.raises(TypeError):
        await sb.exec("echo hi")  # type: ignore[arg-type]


async def test_exec_server_error(client: DSecClient) -> None:
    sb = await client.run_container(listing_args())
    with pytest.raises(dsec.AgentUnavailable) as ei:
        await sb.run_shell("explode")
    assert ei.value.status == 502


async def test_concurrent_execs_share_the_pool(client: DSecClient) -> None:
    sbs = await asyncio.gather(*(client.run_container(listing_args()) for _ in range(20)))
    results = await asyncio.gather(*(sb.run_shell(f"echo {i}") for i, sb in enumerate(sbs)
                                     for _ in range(5)))
    assert sorted({r.stdout for r in results}) == sorted({f"{i}\n" for i in range(20)})
    await asyncio.gather(*(sb.delete() for sb in sbs))


# --- errors ---------------------------------------------------------------------------


async def test_create_errors(client: DSecClient, fake: FakeDSec) -> None:
    with pytest.raises(dsec.ImageNotFound) as ei:
        await client.run_container(DSecContainerRunArgs(container_image="no-such-image"))
    assert ei.value.status == 404 and ei.value.message == "unknown image"
    with pytest.raises(dsec.InvalidLimits):
        await client.run_container(DSecContainerRunArgs(container_image="python",
                                                        memory_limit_mb=0))
    with pytest.raises(dsec.NoCapacity) as nc:
        await client.run_container(DSecContainerRunArgs(container_image="busy"))
    assert nc.value.retry_after == 3.0
    with pytest.raises(dsec.DSecError) as fut, fake.contract.beyond("a newer server's code"):
        await client.run_container(DSecContainerRunArgs(container_image="future"))
    assert type(fut.value) is dsec.DSecError and fut.value.code == "teapot_overflow"


async def test_unknown_field_is_invalid_request(client: DSecClient, fake: FakeDSec) -> None:
    # Reach below the SDK (which never sends unknown fields) to check the mapping.
    with pytest.raises(dsec.InvalidRequest), fake.contract.beyond("an unknown field"):
        await client._transport.request("POST", client._transport.url("/v1/sandboxes"),
                                        json_body={"image": "python", "bogus": 1})


async def test_wrong_token(fake: FakeDSec) -> None:
    async with DSecClient(fake.url, "wrong") as client:
        with pytest.raises(dsec.Unauthorized) as ei:
            await client.list()
    assert ei.value.status == 401


async def test_non_json_error_page(client: DSecClient) -> None:
    with pytest.raises(dsec.DSecError) as ei:
        await client._transport.request("GET", client._transport.url("/v1/proxy-page"))
    assert ei.value.status == 502 and "bad gateway" in ei.value.message


async def test_connection_refused() -> None:
    async with DSecClient(f"http://127.0.0.1:{free_port()}", "t", connect_timeout=2) as client:
        with pytest.raises(dsec.DSecConnectionError) as ei:
            await client.list()
    e = ei.value
    assert isinstance(e, dsec.EdgeUnavailable) and isinstance(e, ConnectionError)
    assert e.code == "edge_unavailable" and e.status is None
    assert "127.0.0.1" in e.message


async def test_client_side_timeout(client: DSecClient) -> None:
    with pytest.raises(dsec.DSecTimeoutError) as ei:
        await client.run_container(DSecContainerRunArgs(container_image="slow"), timeout=0.3)
    assert isinstance(ei.value, TimeoutError) and isinstance(ei.value, dsec.Timeout)


async def test_bad_path(client: DSecClient) -> None:
    sb = await client.run_container(listing_args())
    with pytest.raises(dsec.InvalidPath):
        await sb.read_file("/tmp/../etc/passwd")
    with pytest.raises(dsec.FileNotFound):
        await sb.read_file("/nope")
    with pytest.raises(dsec.IsADirectory):
        await sb.read_file("/tmp")


# --- streams -------------------------------------------------------------------------


async def test_stream_shell(client: DSecClient, fake: FakeDSec) -> None:
    sb = await client.run_container(listing_args())
    items = []
    async with sb.stream_shell("make", env={"X": "1"}) as stream:
        async for item in stream:
            items.append(item)
    assert fake.requests[-1] == ("WS", f"/v1/sandboxes/{sb.id}/exec/stream",
                                 {"cmd": "make", "env": {"X": "1"}})
    assert items[:3] == [OutputChunk("stdout", b"line 1\n"), OutputChunk("stderr", b"oops\n"),
                         OutputChunk("stdout", b"line 2\n")]
    result = items[-1]
    assert isinstance(result, ExecResult) and len(items) == 4
    assert result.exit_code == 3
    # Output that came as frames is put into the final result.
    assert result.stdout == "line 1\nline 2\n" and result.stderr == "oops\n"
    assert stream.result is result and stream.closed


async def test_stream_wait_and_collect_limit(client: DSecClient) -> None:
    sb = await client.run_container(listing_args())
    stream = await sb.stream_exec(["make"], max_output_bytes=4)
    r = await stream.wait()
    assert r.stdout == "line" and r.stderr == "oops" and r.truncated
    assert await stream.wait() is r
    await stream.close()


async def test_stream_stdin_and_eof(client: DSecClient) -> None:
    sb = await client.run_container(listing_args())
    async with sb.stream_shell("cat") as stream:
        await stream.write("hello ")
        first = await stream.__anext__()
        assert first == OutputChunk("stdout", b"hello ")
        await stream.write(b"world")
        await stream.close_stdin()
        r = await stream.wait()
    assert r.exit_code == 0 and r.stdout == "hello world"


async def test_stream_signal(client: DSecClient) -> None:
    sb = await client.run_container(listing_args())
    async with sb.stream_shell("cat") as stream:
        await stream.kill()
        r = await stream.wait()
    assert r.signal == 9 and r.exit_code == 137


async def test_stream_error_frame(client: DSecClient) -> None:
    sb = await client.run_container(listing_args())
    async with sb.stream_shell("fail") as stream:
        with pytest.raises(dsec.SpawnFailed):
            await stream.wait()


async def test_stream_dropped(client: DSecClient) -> None:
    sb = await client.run_container(listing_args())
    async with sb.stream_shell("drop") as stream:
        assert (await stream.__anext__()).data == b"partial"  # type: ignore[union-attr]
        with pytest.raises(dsec.DSecConnectionError):
            await stream.__anext__()


async def test_stream_refused_upgrade(client: DSecClient) -> None:
    sb = await client.run_container(listing_args())
    await sb.stop()
    # A stopped sandbox's stream opens, and its first message is the error.
    async with sb.stream_shell("true") as stream:
        with pytest.raises(dsec.SandboxNotRunning):
            await stream.wait()
    with pytest.raises(dsec.SandboxNotFound):
        await client.sandbox("sb-missing").stream_shell("true")


# --- pty ------------------------------------------------------------------------------


async def test_pty(client: DSecClient, fake: FakeDSec) -> None:
    sb = await client.run_container(listing_args())
    async with sb.pty(cmd="bash", rows=30, cols=100, user="root", cwd="/tmp") as term:
        assert await term.read() == b"$ "
        await term.send("ls\n")
        assert await term.read_until("ls\n", timeout=5) == b"ls\n"
        await term.resize(40, 120)
        assert await term.read() == b"resized 40x120"
        await term.send(b"exit\n")
        assert await term.read() == b""
        assert term.result is not None and term.result.exit_code == 0
    _, path, _ = fake.requests[-1]
    assert path.startswith(f"/v1/sandboxes/{sb.id}/pty?")
    for part in ("rows=30", "cols=100", "cmd=bash", "user=root", "cwd=%2Ftmp"):
        assert part in path or part.replace("%2F", "/") in path


async def test_pty_iteration_and_timeout(client: DSecClient) -> None:
    sb = await client.run_container(listing_args())
    term = await sb.pty()
    with pytest.raises(dsec.DSecTimeoutError):
        await term.read_until("never", timeout=0.2)
    await term.send("exit\n")
    rest = [chunk async for chunk in term]
    assert rest == []
    await term.close()
    assert term.closed


# --- sessions -------------------------------------------------------------------------


async def test_sessions(client: DSecClient, fake: FakeDSec) -> None:
    sb = await client.run_container(listing_args())
    async with await sb.create_session(env={"A": "1"}, cwd="/tmp") as session:
        assert fake.requests[-1][2] == {"env": {"A": "1"}, "cwd": "/tmp"}
        await session.run("cd /")
        assert fake.requests[-1][2] == {"cmd": "cd /", "session": session.id}
        assert fake.sandboxes[sb.id].sessions
    assert not fake.sandboxes[sb.id].sessions
    await session.close()  # idempotent
    s2 = await sb.create_session()
    assert fake.requests[-1][2] == {}
    await sb._t.request("DELETE", sb._t.url(f"{sb._base}/sessions/{s2.id}"))
    await s2.close()  # already gone on the server: fine


# --- files ----------------------------------------------------------------------------


async def test_files(client: DSecClient, fake: FakeDSec) -> None:
    sb = await client.run_container(listing_args())
    blob = os.urandom(3 << 20)
    w = await sb.write_file("/data/blob.bin", blob, mode=0o600)
    assert w.bytes == len(blob)
    put = [r for r in fake.requests if r[0] == "PUT"][-1]
    assert "mode=384" in put[1] and "parents=true" in put[1]
    assert put[2] == "application/octet-stream"
    assert await sb.read_file("/data/blob.bin") == blob
    await sb.write_file("/data/t.txt", "héllo", owner="user")
    put = [r for r in fake.requests if r[0] == "PUT"][-1]
    assert "owner=user" in put[1] and "mode=" not in put[1]
    assert await sb.read_text("/data/t.txt") == "héllo"
    st = await sb.stat("/data/blob.bin")
    assert st.is_file and st.size == len(blob) and st.name == "blob.bin"
    await sb.mkdir("/data/sub")
    assert fake.requests[-1][2] == {"path": "/data/sub", "parents": True}
    await sb.mkdir("/data/sub2", parents=False, mode=0o700)
    assert fake.requests[-1][2] == {"path": "/data/sub2", "parents": False, "mode": 0o700}
    names = [e.name for e in await sb.list_dir("/data")]
    assert names == ["blob.bin", "sub", "sub2", "t.txt"]
    assert await sb.exists("/data/sub") and not await sb.exists("/data/none")
    await sb.remove("/data/t.txt")
    with pytest.raises(dsec.DirectoryNotEmpty):
        await sb.remove("/data")
    await sb.remove("/data", recursive=True)
    assert not await sb.exists("/data/blob.bin")


async def test_upload_download_file(client: DSecClient, tmp_path: Path) -> None:
    sb = await client.run_container(listing_args())
    src = tmp_path / "in.bin"
    src.write_bytes(os.urandom(1_500_000))
    src.chmod(0o750)
    w = await sb.upload(src, "/up/in.bin")
    assert w.bytes == 1_500_000
    dst = tmp_path / "out.bin"
    await sb.download("/up/in.bin", dst)
    assert dst.read_bytes() == src.read_bytes()
    assert not (tmp_path / "out.bin.dsec-part").exists()


async def test_upload_download_directory(client: DSecClient, fake: FakeDSec,
                                         tmp_path: Path) -> None:
    sb = await client.run_container(listing_args())
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "top.txt").write_text("top")
    (src / "a" / "mid.bin").write_bytes(os.urandom(700_000))
    (src / "a" / "b" / "deep.txt").write_text("deep")
    (src / "empty").mkdir()
    await sb.upload(src, "/proj")
    put = [r for r in fake.requests if r[0] == "PUT"][-1]
    assert put[1].startswith(f"/v1/sandboxes/{sb.id}/archive?path=")
    assert put[1].endswith(("path=%2Fproj", "path=/proj"))
    assert put[2] == "application/x-tar"
    files = fake.sandboxes[sb.id].files
    assert files["/proj/top.txt"] == b"top"
    assert files["/proj/a/b/deep.txt"] == b"deep"
    assert "/proj/empty" in fake.sandboxes[sb.id].dirs

    dst = tmp_path / "dst"
    await sb.download("/proj", dst)
    for rel in ("top.txt", "a/mid.bin", "a/b/deep.txt"):
        assert (dst / rel).read_bytes() == (src / rel).read_bytes(), rel
    assert (dst / "empty").is_dir()


async def test_upload_missing_local_path(client: DSecClient, tmp_path: Path) -> None:
    sb = await client.run_container(listing_args())
    with pytest.raises(FileNotFoundError):
        await sb.upload(tmp_path / "nope", "/x")


# --- platform ----------------------------------------------------------------------


async def test_images_and_tenants(client: DSecClient) -> None:
    images = await client.images()
    assert images[0].name == "python:latest"
    t = await client.create_tenant("team-a")
    assert t.name == "team-a" and t.token == "t-123"


async def test_closing_the_client_closes_the_chunked_upload_session_too(fake: FakeDSec) -> None:
    client = DSecClient(fake.url, TOKEN)
    await client.open()
    pooled = client._transport.session
    streamed = await client._transport.streamed_session()
    # Chunked uploads never share the pool (see Transport.streamed_session).
    assert streamed is not pooled and streamed.connector is not None
    assert streamed.connector.force_close
    await client.close()
    assert pooled.closed and streamed.closed


# --- named volumes -------------------------------------------------------------------


async def test_volumes_are_made_mounted_listed_and_removed(client: DSecClient, fake: FakeDSec) -> None:
    v = await client.create_volume("cache", size_mb=64)
    assert (v.name, v.size_mb, v.sandboxes) == ("cache", 64, [])
    assert fake.requests[-1] == ("POST", "/v1/volumes", {"name": "cache", "size_mb": 64})
    await client.create_volume("ref")
    assert fake.requests[-1] == ("POST", "/v1/volumes", {"name": "ref"})
    with pytest.raises(dsec.AlreadyExists):
        await client.create_volume("cache")
    sb = await client.run(listing_args(volumes={"/data": "cache", "/ref": {"name": "ref", "read_only": True}}))
    assert fake.requests[-1][2]["volumes"] == {"/data": "cache", "/ref": {"name": "ref", "read_only": True}}
    listed = {x.name: x for x in await client.volumes()}
    assert listed["cache"].sandboxes == [sb.id] and listed["ref"].size_mb == 1024
    with pytest.raises(dsec.VolumeInUse):
        await client.delete_volume("cache")
    await sb.delete()
    await client.delete_volume("cache")
    with pytest.raises(dsec.VolumeNotFound):
        await client.delete_volume("cache")
    assert [x.name for x in await client.volumes()] == ["ref"]
