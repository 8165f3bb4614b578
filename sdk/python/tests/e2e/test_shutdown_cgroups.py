"""A shutdown that stops sandboxes leaves none of their cgroups, in any
hierarchy, whatever their history: never paused, paused and then stopped,
or paused across SIGKILLed restarts of ``dsec up`` (resumed and paused
again in between)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import uuid
from pathlib import Path

from dsec import DSecClient

from .conftest import Server, _create_tenant, run_args, serve_dsec


def _cgroup_roots() -> list[Path]:
    """The mount point of every cgroup hierarchy (v1 ones and cgroup2)."""
    roots = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype in ("cgroup", "cgroup2"):
                roots.append(Path(fields[4]))
    return sorted(set(roots))


def _cgroups_of(node: str) -> list[str]:
    """Every directory left under the node's cgroup parent, in every
    hierarchy (the parent itself included: a clean shutdown removes it)."""
    left = []
    for root in _cgroup_roots():
        parent = root / "dsec" / node
        if parent.exists():
            left.append(str(parent))
            left.extend(str(p) for p in parent.rglob("*") if p.is_dir())
    return left


#: Processes each sandbox runs besides its agent.
PROCESSES = 40
#: Sandboxes of the restart test: enough that their processes take the
#: kernel a while to kill all at once (at 120, a tenth of a second of
#: waiting per cgroup left about one in seven behind).
SANDBOXES = 120


def _busybox(job: str):  # noqa: ANN202 - run args
    return run_args("busybox", memory_limit_mb=32, cpu_cores_limit=0.1, job=job)


async def _start_with_a_process(c: DSecClient, job: str, n: int) -> list[str]:
    sbs = await asyncio.gather(*(c.run_container(_busybox(job), timeout=120) for _ in range(n)))
    # Processes besides the agent, so that a kill has work to do.
    await asyncio.gather(*(s.run_shell(f"for i in $(seq {PROCESSES}); do nohup sleep 3600 >/dev/null 2>&1 & done")
                           for s in sbs))
    return [s.id for s in sbs]


def _serve(data_dir: Path, node: str, stop: bool):  # noqa: ANN202 - generator
    return serve_dsec(["--no-fncall"], data_dir=data_dir, node=node, stop_sandboxes_on_exit=stop)


def _crash(gen, srv: Server) -> None:  # noqa: ANN001
    os.kill(srv.pid, signal.SIGKILL)
    gen.close()


async def test_a_stopping_shutdown_leaves_no_cgroup_of_sandboxes_paused_across_crashes() -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="dsec-e2e-cg-"))
    node = f"e2e-cg-{uuid.uuid4().hex[:6]}"
    job = f"cg-{uuid.uuid4().hex[:6]}"
    lives = []
    done = False

    def life(stop: bool) -> Server:
        lives.append(_serve(data_dir, node, stop))
        return next(lives[-1])

    try:
        srv = life(stop=False)
        token = _create_tenant(srv, "cg").token
        async with DSecClient(srv.url, token) as c:
            ids = await _start_with_a_process(c, job, SANDBOXES)
            never_paused = ids[:2]
            for i in ids[2:]:
                await (await c.connect(i)).pause()
        _crash(lives[-1], srv)

        # Second life: one paused sandbox is resumed and paused again, one
        # is resumed and left running; then another crash.
        srv = life(stop=False)
        async with DSecClient(srv.url, token) as c:
            await (await c.connect(ids[2])).resume()
            await (await c.connect(ids[2])).pause()
            await (await c.connect(ids[3])).resume()
        _crash(lives[-1], srv)

        srv = life(stop=True)
        async with DSecClient(srv.url, token) as c:
            states = {i: (await (await c.connect(i)).refresh()).state for i in ids}
            assert [states[i] for i in never_paused] == ["running", "running"], states
            assert states[ids[3]] == "running" and states[ids[2]] == "paused", states
            assert all(states[i] == "paused" for i in ids[4:]), states
            # A sandbox stopped while paused (paused in an earlier life).
            await (await c.connect(ids[4])).stop()
        assert _cgroups_of(node), "the running platform has cgroups to lose"
        lives[-1].close()
        done = True
        assert _cgroups_of(node) == []
    finally:
        for gen in lives:
            gen.close()
        if not done:
            # A failure before the last life: its sandboxes are still running.
            cleanup = _serve(data_dir, node, stop=True)
            next(cleanup)
            cleanup.close()
        shutil.rmtree(data_dir, ignore_errors=True)


async def test_a_stopping_shutdown_leaves_no_cgroup_of_sandboxes_never_or_just_paused() -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="dsec-e2e-cg-"))
    node = f"e2e-cg-{uuid.uuid4().hex[:6]}"
    job = f"cg-{uuid.uuid4().hex[:6]}"
    try:
        gen = _serve(data_dir, node, stop=True)
        srv = next(gen)
        token = _create_tenant(srv, "cg").token
        async with DSecClient(srv.url, token) as c:
            ids = await _start_with_a_process(c, job, 5)
            for i in ids[:3]:
                await (await c.connect(i)).pause()
            # Stopped while paused in this life.
            await (await c.connect(ids[0])).stop()
            assert not [p for p in _cgroups_of(node) if p.endswith("/" + ids[0])]
        gen.close()
        assert _cgroups_of(node) == []
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
