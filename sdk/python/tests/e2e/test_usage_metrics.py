"""A sandbox's resource use second by second (``sandbox.metrics()``, ``GET
/v1/sandboxes/{id}/metrics``) and the node's (``node_metrics``), against a
real ``dsec up``: CPU rises under a burner, memory when a process holds
some, the writable layer when a file is written; bad windows are refused,
and only the admin reads a node's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

import dsec
from dsec import DSecClient, MetricsSample, SandboxMetrics
from dsec.sandbox import Sandbox

from .conftest import Server, Tenant, run_args

MIB = 1 << 20


async def _until(sb: Sandbox, what: str, ok: Callable[[MetricsSample], bool],
                 within: float = 30) -> SandboxMetrics:
    """Polls the sandbox's metrics until its newest sample satisfies ``ok``."""
    deadline = time.monotonic() + within
    while True:
        m = await sb.metrics()
        if m.latest is not None and ok(m.latest):
            return m
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not seen within {within}s; last samples: {m.samples[-5:]}")
        await asyncio.sleep(0.5)


async def test_cpu_memory_disk_and_pids_show_in_the_series(client: DSecClient) -> None:
    sb = await client.run_container(run_args("python", memory_limit_mb=512, cpu_cores_limit=1),
                                    timeout=120)
    try:
        idle = await _until(sb, "a first sample", lambda s: True)
        assert idle.sandbox_id == sb.id and idle.state == "running" and idle.interval_ms == 1000
        assert idle.limits.memory_limit_mb == 512 and idle.limits.cpu_cores_limit == 1
        base = idle.latest
        assert base is not None and base.cpu_cores < 0.3, idle.samples
        # A container has a network namespace of its own: its counters are
        # known.
        assert base.net_rx_bytes_per_s is not None and idle.net_rx_bytes is not None, idle
        assert base.disk_bytes is not None

        await sb.run_shell("nohup python3 -c 'while True: pass' >/dev/null 2>&1 &")
        # A whole core on an idle host; on a loaded one (the tests share
        # it) the burner gets what the scheduler gives it.
        await _until(sb, "a core busier", lambda s: s.cpu_cores > base.cpu_cores + 0.15)

        await sb.run_shell("nohup python3 -c 'import time; b = b\"x\" * (200 << 20); time.sleep(3600)' "
                           ">/dev/null 2>&1 &")
        hot = await _until(sb, "200 MiB held", lambda s: s.memory_bytes > base.memory_bytes + 150 * MIB)
        assert hot.latest is not None and hot.latest.pids >= base.pids + 2, hot.samples[-3:]

        await sb.run_shell("head -c 30000000 /dev/urandom > /big")
        await _until(sb, "30 MB written", lambda s: (s.disk_bytes or 0) > base.disk_bytes + 25 * MIB)

        # One sample a second, oldest first, and as many as asked for.
        m = await sb.metrics()
        times = [s.time_ms for s in m.samples]
        assert times == sorted(times) and len(set(times)) == len(times)
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert gaps and max(gaps) < 3000, gaps
        assert len((await sb.metrics(seconds=2)).samples) == 2
    finally:
        await sb.delete()


async def test_bad_windows_and_ended_sandboxes_are_refused(client: DSecClient) -> None:
    sb = await client.run_container(run_args("busybox", memory_limit_mb=32), timeout=120)
    try:
        for bad in (0, 10**9):
            with pytest.raises(dsec.InvalidRequest, match="seconds"):
                await sb.metrics(seconds=bad)
        # Reading a paused sandbox's metrics does not resume it.
        await sb.pause()
        assert (await sb.metrics()).state == "paused"
        assert (await sb.refresh()).state == "paused"
        await sb.stop()
        with pytest.raises(dsec.SandboxEnded):
            await sb.metrics()
    finally:
        await sb.delete()


async def test_node_metrics_are_for_the_admin(server: Server, admin: DSecClient,
                                              client: DSecClient) -> None:
    node = (await admin.health()).nodes[0].name
    deadline = time.monotonic() + 10
    while not (m := await admin.node_metrics(node)).samples:
        assert time.monotonic() < deadline, "no node sample within 10 s"
        await asyncio.sleep(0.5)
    s = m.samples[-1]
    assert m.node == node and m.cpus >= 1 and m.memory_total_bytes > 0
    assert 0 <= s.cpu_cores <= m.cpus + 0.5 and 0 < s.memory_bytes <= m.memory_total_bytes
    assert len((await admin.node_metrics(node, seconds=1)).samples) == 1
    with pytest.raises(dsec.Forbidden):
        await client.node_metrics(node)
    with pytest.raises(dsec.NotFound):
        await admin.node_metrics("no-such-node")


def test_the_blocking_client_reads_metrics(server: Server, tenant: Tenant) -> None:
    from dsec.sync import DSecClient as SyncClient

    with SyncClient(server.url, tenant.token) as c:
        with c.run_container(run_args("busybox", memory_limit_mb=32)) as sb:
            deadline = time.monotonic() + 10
            while not (m := sb.metrics()).samples:
                assert time.monotonic() < deadline, "no sample within 10 s"
                time.sleep(0.5)
            assert isinstance(m, SandboxMetrics) and m.latest is not None and m.latest.memory_bytes > 0
