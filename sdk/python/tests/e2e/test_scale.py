"""One Python process drives a thousand sandboxes at once (issue requirement):
create them concurrently, run a command in each, delete them, all from one
asyncio client over its pooled connections."""

from __future__ import annotations

import asyncio
import time

from dsec import DSecClient, DSecContainerRunArgs

from .conftest import Server, Tenant

N = 1000


async def test_one_process_drives_a_thousand_sandboxes(server: Server, tenant: Tenant) -> None:
    args = DSecContainerRunArgs(container_image="busybox", memory_limit_mb=16,
                                cpu_cores_limit=0.01, disk_limit_mb=8,
                                labels={"suite": "scale"})
    started = time.monotonic()
    async with DSecClient(server.url, tenant.token) as client:
        sandboxes = await asyncio.gather(*(client.run_container(args) for _ in range(N)))
        assert len({sb.id for sb in sandboxes}) == N
        results = await asyncio.gather(*(sb.run_shell(f"echo {i}") for i, sb in enumerate(sandboxes)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(N)]
        running = await client.list(state="running", labels={"suite": "scale"})
        assert len(running) == N
        await asyncio.gather(*(sb.delete() for sb in sandboxes))
        assert await client.list(labels={"suite": "scale"}) == []
    print(f"{N} sandboxes created, used and deleted in {time.monotonic() - started:.1f} s")
