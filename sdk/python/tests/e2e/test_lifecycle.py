"""Sandbox records, listing, lifetimes and concurrency against the real server."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

import dsec
from dsec import DSecClient, DSecRunArgs

from .conftest import run_args

pytestmark = pytest.mark.e2e


async def test_health_and_images(client: DSecClient, image: str) -> None:
    h = await client.health()
    assert h.status and h.version
    assert h.nodes and any(n.healthy for n in h.nodes)
    names = [i.name for i in await client.images()]
    assert any(n == image or n.startswith(image + ":") for n in names)


async def test_record_reflects_the_request(client: DSecClient, image: str) -> None:
    job = f"job-{uuid.uuid4().hex[:6]}"
    args = run_args(image, memory_limit_mb=512, cpu_cores_limit=0.5, ttl_running_stop=120,
                    labels={"suite": "sdk-e2e", "k": "v"}, job=job,
                    env={"FROM_ARGS": "1"}, workdir="/tmp")
    async with await client.run_container(args) as sb:
        info = sb.info
        assert info.state == "running" and info.backend == "container"
        assert info.image == image or info.image.startswith(image + ":")
        assert info.limits.memory_limit_mb == 512
        assert info.limits.cpu_cores_limit == 0.5
        assert info.ttl_running_stop == 120
        assert info.labels == {"suite": "sdk-e2e", "k": "v"}
        assert info.job == job
        assert info.init_user == "root"
        assert info.create_ms is not None and info.create_ms > 0
        assert info.node and info.created_at
        r = await sb.run_shell('echo "$FROM_ARGS"; pwd')
        assert r.stdout == "1\n/tmp\n"
        assert (await sb.refresh()).id == sb.id


async def test_generic_run_args(client: DSecClient, image: str) -> None:
    sb = await client.run(DSecRunArgs(backend="container", image=image,
                                      labels={"suite": "sdk-e2e"}))
    try:
        assert (await sb.run_shell("echo generic")).stdout == "generic\n"
    finally:
        await sb.delete()


async def test_list_filtered_by_labels_job_and_state(client: DSecClient, image: str) -> None:
    run = uuid.uuid4().hex[:8]
    a = await client.run_container(run_args(image, labels={"run": run, "role": "a"}, job=run))
    b = await client.run_container(run_args(image, labels={"run": run, "role": "b"}, job=run))
    c = await client.run_container(run_args(image, labels={"run": run, "role": "b"}))
    try:
        ids = lambda infos: {i.id for i in infos}  # noqa: E731
        assert ids(await client.list(labels={"run": run})) == {a.id, b.id, c.id}
        assert ids(await client.list(labels={"run": run, "role": "b"})) == {b.id, c.id}
        assert ids(await client.list(labels={"run": run, "role": "zzz"})) == set()
        assert ids(await client.list(job=run)) == {a.id, b.id}
        await b.stop()
        assert ids(await client.list(labels={"run": run}, state="running")) == {a.id, c.id}
        assert ids(await client.list(labels={"run": run}, state="stopped")) == {b.id}
    finally:
        for sb in (a, b, c):
            await sb.delete()
    assert await client.list(labels={"run": run}) == []


async def test_idle_ttl_stops_the_sandbox(client: DSecClient, image: str) -> None:
    run = uuid.uuid4().hex[:8]
    sb = await client.run_container(run_args(image, ttl_running_stop=2, labels={"run": run}))
    try:
        # Watch through list(), which is not a request to the sandbox itself.
        deadline = time.monotonic() + 60
        state = "running"
        while time.monotonic() < deadline:
            await asyncio.sleep(1)
            (info,) = await client.list(labels={"run": run})
            state = info.state
            if state in ("stopped", "failed"):
                break
        assert state == "stopped"
        with pytest.raises(dsec.SandboxNotRunning):
            await sb.run_shell("true")
    finally:
        await sb.delete()


async def test_activity_keeps_a_sandbox_alive(client: DSecClient, image: str) -> None:
    async with await client.run_container(run_args(image, ttl_running_stop=3)) as sb:
        for _ in range(6):
            await asyncio.sleep(1)
            assert (await sb.run_shell("true")).ok
        assert (await sb.refresh()).state == "running"


async def test_fifty_concurrent_sandboxes(client: DSecClient, image: str) -> None:
    async def one(i: int) -> str:
        # Small limits, so 50 fit on one small test machine.
        sb = await client.run_container(run_args(image, memory_limit_mb=128,
                                                 cpu_cores_limit=0.03), timeout=300)
        try:
            return (await sb.run_shell(f"echo {i}")).stdout
        finally:
            await sb.delete()

    outs = await asyncio.gather(*(one(i) for i in range(50)))
    assert outs == [f"{i}\n" for i in range(50)]


async def test_many_concurrent_execs_in_one_sandbox(client: DSecClient, image: str) -> None:
    async with await client.run_container(run_args(image)) as sb:
        outs = await asyncio.gather(*(sb.run_shell(f"echo {i}") for i in range(100)))
        assert [r.stdout for r in outs] == [f"{i}\n" for i in range(100)]


async def test_delete_is_final(client: DSecClient, image: str) -> None:
    sb = await client.run_container(run_args(image))
    await sb.delete()
    with pytest.raises(dsec.SandboxNotFound):
        await sb.refresh()
    with pytest.raises(dsec.SandboxNotFound):
        await sb.delete()
