"""The blocking wrapper (dsec.sync) against the real server."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

import dsec
from dsec import DSecContainerRunArgs, ExecResult, OutputChunk
from dsec.sync import DSecClient

from .conftest import Server, Tenant, run_args

pytestmark = pytest.mark.e2e


def test_listing_blocking(server: Server, tenant: Tenant, image: str) -> None:
    with DSecClient(server.url, tenant.token) as client:
        args = DSecContainerRunArgs(container_image=image, memory_limit_mb=1024,
                                    cpu_cores_limit=1, ttl_running_stop=300,
                                    network_rules={}, init_user="root")
        sandbox = client.run_container(args, timeout=120)
        result = sandbox.run_shell("echo hello world")
        assert result.exit_code == 0 and result.stdout == "hello world\n"
        assert sandbox.stop().state == "stopped"
        with pytest.raises(dsec.SandboxNotRunning):
            sandbox.run_shell("true")
        sandbox.delete()
        with pytest.raises(dsec.SandboxNotFound):
            client.get(sandbox.id)


def test_sync_everything(server: Server, tenant: Tenant, image: str, tmp_path: Path) -> None:
    with DSecClient(server.url, tenant.token) as client:
        with client.run_container(run_args(image)) as sb:
            assert sb.exec(["echo", "argv"]).stdout == "argv\n"
            assert sb.run_shell("cat", stdin="in").stdout == "in"

            with sb.stream_shell("echo a; sleep 1; echo b") as stream:
                items = list(stream)
            assert isinstance(items[0], OutputChunk) and items[0].data == b"a\n"
            assert isinstance(items[-1], ExecResult) and items[-1].exit_code == 0

            with sb.create_session() as session:
                session.run("cd /tmp")
                assert session.run("pwd").stdout == "/tmp\n"

            with sb.pty(cmd="/bin/sh") as term:
                term.send("echo sync-$((2+3))\n")
                assert b"sync-5" in term.read_until("sync-5", timeout=15)
                term.send("exit\n")
                term.wait()

            blob = os.urandom(2 << 20)
            sb.write_file("/tmp/s.bin", blob)
            assert sb.read_file("/tmp/s.bin") == blob
            assert sb.stat("/tmp/s.bin").size == len(blob)
            sb.mkdir("/tmp/d/e")
            assert [e.name for e in sb.list_dir("/tmp/d")] == ["e"]
            sb.remove("/tmp/d", recursive=True)
            assert not sb.exists("/tmp/d")

            src = tmp_path / "src"
            (src / "x").mkdir(parents=True)
            (src / "x" / "y.txt").write_text("y")
            sb.upload(src, "/tmp/up")
            sb.download("/tmp/up", tmp_path / "down")
            assert (tmp_path / "down" / "x" / "y.txt").read_text() == "y"
            sb_id = sb.id
        with pytest.raises(dsec.SandboxNotFound):
            client.get(sb_id)


def test_sync_inside_a_running_loop(server: Server, tenant: Tenant, image: str) -> None:
    # As in a Jupyter cell: the calling thread already runs an event loop.
    async def cell() -> str:
        with DSecClient(server.url, tenant.token) as client:
            with client.run_container(run_args(image)) as sb:
                return sb.run_shell("echo from-a-loop").stdout

    assert asyncio.run(cell()) == "from-a-loop\n"


def test_sync_errors(server: Server, image: str) -> None:
    with DSecClient(server.url, "wrong-token") as client:
        with pytest.raises(dsec.Unauthorized):
            client.run_container(run_args(image))
