"""Client overhead of one exec: p50 must stay well under 2 ms on loopback.

The fake server runs in another process so that its own work does not share
this process's interpreter lock.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsec import DSecClient, DSecContainerRunArgs

from .fake_server import TOKEN


@pytest.fixture
def fake_process() -> Iterator[str]:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "tests.unit.fake_server"], cwd=root,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        proc.stdout.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_exec_true_p50(fake_process: str) -> None:
    async with DSecClient(fake_process, TOKEN) as client:
        sb = await client.run_container(DSecContainerRunArgs(container_image="python"))
        for _ in range(50):  # warm the connection pool
            await sb.run_shell("true")
        times = []
        for _ in range(500):
            t0 = time.perf_counter()
            r = await sb.run_shell("true")
            times.append(time.perf_counter() - t0)
            assert r.exit_code == 0
    times.sort()
    p50 = times[len(times) // 2] * 1000
    # Includes the fake server's own time; the SDK's share is a fraction.
    assert p50 < 2.0, f"exec p50 {p50:.3f} ms"
