"""The blocking wrapper against the fake server."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import dsec
from dsec import DSecContainerRunArgs, ExecResult, OutputChunk
from dsec.sync import DSecClient

from .fake_server import TOKEN, FakeDSec


def args() -> DSecContainerRunArgs:
    return DSecContainerRunArgs(container_image="python", memory_limit_mb=1024,
                                cpu_cores_limit=1, ttl_running_stop=300,
                                network_rules={}, init_user="root")


def test_listing_blocking(fake: FakeDSec) -> None:
    with DSecClient(fake.url, TOKEN) as client:
        sandbox = client.run_container(args(), timeout=120)
        result = sandbox.run_shell("echo hello world")
        assert result.exit_code == 0 and result.stdout == "hello world\n"
        assert sandbox.stop().state == "stopped"
        assert [s.id for s in client.list(state="stopped")] == [sandbox.id]
        assert client.get(sandbox.id).state == "stopped"
        assert client.connect(sandbox.id).id == sandbox.id
        sandbox.delete()
        with pytest.raises(dsec.SandboxNotFound):
            client.get(sandbox.id)


def test_context_manager_deletes(fake: FakeDSec) -> None:
    with DSecClient(fake.url, TOKEN) as client:
        with client.run_container(args()) as sb:
            assert sb.refresh().is_running
        assert not fake.sandboxes


def test_errors_cross_the_thread(fake: FakeDSec) -> None:
    with DSecClient(fake.url, "wrong") as client:
        with pytest.raises(dsec.Unauthorized):
            client.list()


def test_stream_session_pty_files(fake: FakeDSec, tmp_path: Path) -> None:
    with DSecClient(fake.url, TOKEN) as client:
        sb = client.run(dsec.DSecRunArgs(image="python"))
        with sb.stream_shell("make") as stream:
            items = list(stream)
        assert isinstance(items[0], OutputChunk) and isinstance(items[-1], ExecResult)
        assert stream.result is not None and stream.result.exit_code == 3

        with sb.stream_exec(["cat"]) as stream:
            stream.write("abc")
            stream.close_stdin()
            assert stream.wait().stdout == "abc"

        with sb.create_session(cwd="/tmp") as session:
            assert session.run("echo hi").stdout == "hi\n"

        with sb.pty() as term:
            assert term.read() == b"$ "
            term.send("exit\n")
            assert term.wait() is not None

        data = os.urandom(100_000)
        sb.write_file("/f.bin", data)
        assert sb.read_file("/f.bin") == data
        assert sb.stat("/f.bin").size == len(data)
        assert [e.name for e in sb.list_dir("/")] == ["f.bin", "tmp"]
        src = tmp_path / "d"
        src.mkdir()
        (src / "x.txt").write_text("x")
        sb.upload(src, "/d")
        sb.download("/d", tmp_path / "back")
        assert (tmp_path / "back" / "x.txt").read_text() == "x"


def test_usable_inside_a_running_loop(fake: FakeDSec) -> None:
    # As in Jupyter: the caller's thread already runs an event loop.
    async def notebook_cell() -> str:
        with DSecClient(fake.url, TOKEN) as client:
            return client.run_container(args()).run_shell("echo nb").stdout

    assert asyncio.run(notebook_cell()) == "nb\n"


def test_many_threads_share_one_client(fake: FakeDSec) -> None:
    with DSecClient(fake.url, TOKEN) as client:
        sb = client.run_container(args())
        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda i: sb.run_shell(f"echo {i}").stdout, range(40)))
        assert outs == [f"{i}\n" for i in range(40)]


def test_close_stops_the_thread(fake: FakeDSec) -> None:
    before = {t.ident for t in threading.enumerate()}
    client = DSecClient(fake.url, TOKEN)
    client.health()
    client.close()
    client.close()  # idempotent
    after = {t.ident for t in threading.enumerate() if t.name == "dsec-sync-loop"}
    assert not (after - before)
    with pytest.raises(RuntimeError):
        client.health()


def test_calls_that_mirror_the_asyncio_api(fake: FakeDSec) -> None:
    # Members test_sync_signatures found missing from the wrapper at first.
    with DSecClient(fake.url, TOKEN) as client:
        assert client.is_open
        sb = client.run(dsec.DSecRunArgs(image="python"))
        assert sb.client is client
        with sb.stream_shell("make", step_id="build") as stream:
            assert not stream.closed
            assert stream.wait().exit_code == 3
        assert stream.closed
        assert fake.headers[-1]["x-dsec-step-id"] == "build"
        with sb.stream_exec(["make"], step_id="build-2") as stream:
            assert stream.wait().exit_code == 3
        assert fake.headers[-1]["x-dsec-step-id"] == "build-2"

        with sb.create_session() as session:
            with session.stream("make", timeout=5) as stream:
                assert [i for i in stream if isinstance(i, OutputChunk)][0].data == b"line 1\n"
            assert fake.requests[-1] == ("WS", f"/v1/sandboxes/{sb.id}/exec/stream",
                                         {"cmd": "make", "timeout": 5, "session": session.id})

        with sb.pty() as term:
            assert iter(term) is term and next(term) == b"$ "
            term.send("hi")
            assert next(term) == b"hi"
            term.send("exit\n")
            assert list(term) == []
            assert term.result is not None and term.result.exit_code == 0
        assert term.closed
    assert not client.is_open
