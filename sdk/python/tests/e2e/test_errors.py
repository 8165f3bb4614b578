"""Failures surface as the exception class of their error code."""

from __future__ import annotations

import socket

import pytest

import dsec
from dsec import DSecClient, DSecContainerRunArgs

from .conftest import Server, Tenant, run_args

pytestmark = pytest.mark.e2e


async def test_unknown_image(client: DSecClient) -> None:
    with pytest.raises(dsec.ImageNotFound) as ei:
        await client.run_container(DSecContainerRunArgs(container_image="no-such-image-e2e"))
    assert ei.value.status == 404


@pytest.mark.parametrize("limits", [
    {"memory_limit_mb": 0},
    {"cpu_cores_limit": 0},
    {"cpu_cores_limit": -1},
    {"memory_limit_mb": 1 << 40},
    {"cpu_cores_limit": 100000},
    {"pids_limit": 0},
])
async def test_impossible_limits(client: DSecClient, image: str, limits: dict[str, int]) -> None:
    with pytest.raises(dsec.InvalidLimits) as ei:
        await client.run_container(run_args(image, **limits))
    assert ei.value.status == 400


async def test_exec_after_stop(client: DSecClient, image: str) -> None:
    sb = await client.run_container(run_args(image))
    try:
        info = await sb.stop()
        assert info.state == "stopped"
        with pytest.raises(dsec.SandboxNotRunning) as ei:
            await sb.run_shell("true")
        assert ei.value.status == 409
        with pytest.raises(dsec.SandboxNotRunning):
            await sb.read_file("/etc/hostname")
        with pytest.raises(dsec.SandboxNotRunning):
            # Refused at the upgrade or in the first frame: either way, raised.
            stream = await sb.stream_shell("true")
            await stream.wait()
    finally:
        await sb.delete()
    with pytest.raises(dsec.SandboxNotFound):
        await client.get(sb.id)


async def test_wrong_token(server: Server) -> None:
    async with DSecClient(server.url, "not-a-token") as c:
        with pytest.raises(dsec.Unauthorized) as ei:
            await c.list()
    assert ei.value.status == 401
    async with DSecClient(server.url, None) as c:
        with pytest.raises(dsec.Unauthorized):
            await c.list()
        assert (await c.health()).status  # /healthz needs no token


async def test_other_tenants_sandbox_is_invisible(server: Server, client: DSecClient,
                                                  other_tenant: Tenant, image: str) -> None:
    sb = await client.run_container(run_args(image))
    try:
        async with DSecClient(server.url, other_tenant.token) as other:
            with pytest.raises(dsec.SandboxNotFound):
                await other.get(sb.id)
            with pytest.raises(dsec.SandboxNotFound):
                await other.connect(sb.id)
            handle = other.sandbox(sb.id)
            with pytest.raises(dsec.SandboxNotFound):
                await handle.run_shell("true")
            with pytest.raises(dsec.SandboxNotFound):
                await handle.read_file("/etc/hostname")
            with pytest.raises(dsec.SandboxNotFound):
                stream = await handle.stream_shell("true")
                await stream.wait()
            with pytest.raises(dsec.SandboxNotFound):
                await handle.delete()
            assert sb.id not in {s.id for s in await other.list()}
        assert (await sb.run_shell("echo still here")).stdout == "still here\n"
    finally:
        await sb.delete()


async def test_admin_sees_every_sandbox(admin: DSecClient, client: DSecClient,
                                        image: str) -> None:
    async with await client.run_container(run_args(image)) as sb:
        assert (await admin.get(sb.id)).id == sb.id
        assert sb.id in {s.id for s in await admin.list()}


async def test_tenant_is_not_admin(client: DSecClient) -> None:
    with pytest.raises(dsec.Forbidden):
        await client.create_tenant("should-not-exist")


async def test_unknown_field(client: DSecClient, image: str) -> None:
    t = client._transport
    with pytest.raises(dsec.InvalidRequest):
        await t.request("POST", t.url("/v1/sandboxes"),
                        json_body={"image": image, "no_such_field": 1})


async def test_exec_needs_cmd_or_argv(client: DSecClient, image: str) -> None:
    async with await client.run_container(run_args(image)) as sb:
        t = client._transport
        with pytest.raises(dsec.InvalidRequest):
            await t.request("POST", t.url(f"/v1/sandboxes/{sb.id}/exec"), json_body={})
        with pytest.raises(dsec.InvalidRequest):
            await t.request("POST", t.url(f"/v1/sandboxes/{sb.id}/exec"),
                            json_body={"cmd": "true", "argv": ["true"]})


async def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with DSecClient(f"http://127.0.0.1:{port}", "t") as c:
        with pytest.raises(dsec.DSecConnectionError):
            await c.list()
