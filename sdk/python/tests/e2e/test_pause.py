"""Pause and resume against a real ``dsec up`` with a node swap file: memory
leaves RAM and comes back intact, requests resume transparently, jobs pause
and resume in one call, bad requests get clear errors, and state changes
stream as events."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from dsec import (
    JobAlreadyPaused,
    DSecClient,
    InvalidLimits,
    InvalidRequest,
    JobNotFound,
    SandboxEnded,
    SandboxNotFound,
)

from .conftest import Server, Tenant, run_args

MIB = 1 << 20

#: A process that holds 256 MiB of random bytes and, when /tmp/check
#: appears, hashes them again: the memory must survive pause and resume.
HOLDER = r"""
import hashlib, os, time
b = bytearray(os.urandom(1 << 20)) * 256
open("/tmp/before", "w").write(hashlib.sha256(b).hexdigest())
while not os.path.exists("/tmp/check"):
    time.sleep(0.02)
open("/tmp/after", "w").write(hashlib.sha256(b).hexdigest())
time.sleep(3600)
"""


def busybox(job: str, **kw: object):  # noqa: ANN201 - run args
    return run_args("busybox", memory_limit_mb=32, cpu_cores_limit=0.1, job=job, **kw)


async def test_a_paused_256mb_sandbox_leaves_ram_and_comes_back_intact(client: DSecClient) -> None:
    sb = await client.run_container(run_args("python", memory_limit_mb=512), timeout=120)
    try:
        await sb.write_file("/tmp/holder.py", HOLDER)
        await sb.run_shell("nohup python3 /tmp/holder.py >/dev/null 2>&1 &")
        for _ in range(300):
            if await sb.exists("/tmp/before"):
                break
            await asyncio.sleep(0.1)
        before = await sb.read_text("/tmp/before")

        p = await sb.pause()
        assert p.changed and p.sandbox.state == "paused"
        assert p.memory_before_bytes >= 256 * MIB, p
        # The target: at least 90% of the RAM freed.
        assert p.memory_freed_bytes >= 0.9 * p.memory_before_bytes, p
        info = await sb.refresh()
        assert info.state == "paused" and info.paused_at and info.memory_freed_bytes == p.memory_freed_bytes
        assert sb.id in {s.id for s in await client.list(state="paused")}

        # Any request resumes it first; the 256 MiB hash the same.
        await sb.write_file("/tmp/check", "")
        for _ in range(300):
            if await sb.exists("/tmp/after"):
                break
            await asyncio.sleep(0.1)
        assert await sb.read_text("/tmp/after") == before
        assert (await sb.refresh()).state == "running"
        r = await sb.resume()
        assert not r.changed, "resuming a running sandbox changes nothing"
    finally:
        await sb.delete()


async def test_bad_pause_and_resume_requests_get_clear_errors(client: DSecClient) -> None:
    sb = await client.run_container(busybox(job=f"j-{uuid.uuid4().hex[:6]}"))
    assert (await sb.pause()).changed
    assert not (await sb.pause()).changed, "pausing a paused sandbox is idempotent"
    await sb.stop()
    with pytest.raises(SandboxEnded) as e:
        await sb.resume()
    assert e.value.status == 409 and "stopped" in e.value.message
    with pytest.raises(SandboxEnded):
        await sb.pause()
    with pytest.raises(SandboxEnded):
        await sb.extend(60)
    ghost = client.sandbox(sb.id.split(".")[0] + ".doesnotexist")
    for call in (ghost.pause, ghost.resume):
        with pytest.raises(SandboxNotFound):
            await call()
    with pytest.raises(JobNotFound):
        await client.pause_job(f"no-such-job-{uuid.uuid4().hex}")
    with pytest.raises(JobNotFound):
        await client.resume_job(f"no-such-job-{uuid.uuid4().hex}")
    await sb.delete()


async def test_job_pause_and_resume_act_on_every_sandbox(client: DSecClient, admin: DSecClient) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    sandboxes = await asyncio.gather(*(client.run_container(busybox(job=job)) for _ in range(4)))
    try:
        for i, sb in enumerate(sandboxes):
            await sb.run_shell(f"echo {i} > /root/n")
        assert {s.id for s in await client.list(job=job)} == {sb.id for sb in sandboxes}
        slots_before = (await admin.health()).nodes[0].sandboxes

        r = await client.pause_job(job)
        assert (r.matched, r.changed, r.unchanged, r.ended, r.failed) == (4, 4, 0, 0, [])
        assert len(await client.list(job=job, state="paused")) == 4
        # Paused sandboxes do not count against the running quota.
        assert (await admin.health()).nodes[0].sandboxes == slots_before - 4
        # Pausing it again does nothing, and says so clearly.
        with pytest.raises(JobAlreadyPaused, match="already paused"):
            await client.pause_job(job)
        again = await client.pause_job(job, idempotent=True)
        assert (again.changed, again.unchanged) == (0, 4)
        assert len(await client.list(job=job, state="paused")) == 4

        # A request to one resumes that one only.
        assert (await sandboxes[0].run_shell("cat /root/n")).stdout == "0\n"
        # A stopped one is skipped by the job calls.
        await sandboxes[1].stop()
        r = await client.resume_job(job)
        assert (r.matched, r.changed, r.unchanged, r.ended, r.failed) == (4, 2, 1, 1, [])
        outs = await asyncio.gather(*(sandboxes[i].run_shell("cat /root/n") for i in (0, 2, 3)))
        assert [o.stdout for o in outs] == ["0\n", "2\n", "3\n"]
    finally:
        await asyncio.gather(*(sb.delete() for sb in sandboxes))


async def test_files_and_sessions_resume_a_paused_sandbox(client: DSecClient) -> None:
    sb = await client.run_container(busybox(job="files"))
    try:
        session = await sb.create_session()
        await session.run("cd /tmp && export X=kept")
        await sb.pause()
        await sb.write_file("/tmp/f", b"data")
        assert (await sb.refresh()).state == "running"
        await sb.pause()
        r = await session.run("echo $X $(pwd) $(cat f)")
        assert r.stdout == "kept /tmp data\n"
        await sb.pause()
        assert await sb.read_file("/tmp/f") == b"data"
    finally:
        await sb.delete()


async def test_state_events_follow_a_sandbox_and_a_job(client: DSecClient) -> None:
    job = f"ev-{uuid.uuid4().hex[:8]}"
    sb = await client.run_container(busybox(job=job))
    seen: list[str] = []
    job_seen: list[tuple[str, str]] = []

    async def follow() -> None:
        async for e in sb.events():
            seen.append(e.state)

    async def follow_job() -> None:
        async for e in client.job_events(job):
            job_seen.append((e.id, e.state))
            if e.state == "stopped":
                return

    tasks = [asyncio.create_task(follow()), asyncio.create_task(follow_job())]
    await asyncio.sleep(0.3)
    await sb.pause()
    await sb.resume()
    await sb.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=20)
    assert seen[0] == "running"
    for want in ("pausing", "paused", "resuming", "running", "stopping", "stopped"):
        assert want in seen, (want, seen)
    assert seen[-1] == "stopped"
    assert (sb.id, "paused") in job_seen and job_seen[-1] == (sb.id, "stopped")
    await sb.delete()


async def test_the_lease_can_be_extended(client: DSecClient) -> None:
    sb = await client.run_container(busybox(job="lease", max_lifetime_s=60))
    try:
        info = await sb.extend(600)
        assert info.max_lifetime_s >= 600
        info = await sb.set_timeout(ttl_running_stop=0)
        assert info.ttl_running_stop == 0
        with pytest.raises(InvalidLimits):
            await sb.set_timeout(lifetime_s=10**9)
        with pytest.raises(InvalidLimits):
            await sb.set_timeout(lifetime_s=0)
        await sb.set_timeout(lifetime_s=1)
        for _ in range(100):
            info = await sb.refresh()
            if info.state == "stopped":
                break
            await asyncio.sleep(0.1)
        assert info.state == "stopped" and "maximum lifetime" in (info.state_reason or ""), info
    finally:
        await sb.delete()


async def test_unknown_lease_fields_are_refused(server: Server, tenant: Tenant) -> None:
    async with DSecClient(server.url, tenant.token) as client:
        sb = await client.run_container(busybox(job="lease-bad"))
        try:
            with pytest.raises(InvalidRequest):
                await client._transport.request(
                    "POST", client._transport.url(f"/v1/sandboxes/{sb.id}/timeout"),
                    json_body={"forever": True})
        finally:
            await sb.delete()


async def test_a_burst_of_2000_creations_queues_and_completes(server: Server, tenant: Tenant) -> None:
    """The server bounds creations in flight (64 by default) and queues the
    rest, fair across jobs; one client's burst of 2,000 completes without an
    error, and while it runs, waiting sandboxes are listed as `queued` with a
    position."""
    n = 2000
    job = f"burst-{uuid.uuid4().hex[:6]}"
    args = run_args("busybox", memory_limit_mb=16, cpu_cores_limit=0.01, disk_limit_mb=8,
                    job=job, labels={"suite": "burst"})
    queued_seen: list[int] = []
    async with DSecClient(server.url, tenant.token, max_connections=2048) as client:
        async def watch() -> None:
            while True:
                for s in await client.list(job=job, state="queued"):
                    if s.queue_position is not None:
                        queued_seen.append(s.queue_position)
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        try:
            results = await asyncio.gather(*(client.run_container(args, timeout=600) for _ in range(n)),
                                           return_exceptions=True)
        finally:
            watcher.cancel()
        errors = [r for r in results if isinstance(r, BaseException)]
        created = [r for r in results if not isinstance(r, BaseException)]
        try:
            assert not errors, f"{len(errors)} of {n} creations failed, e.g. {errors[:3]}"
            assert len({sb.id for sb in created}) == n
            assert queued_seen, "no creation was ever seen waiting in the queue"
        finally:
            await asyncio.gather(*(sb.delete() for sb in created), return_exceptions=True)
        assert await client.list(job=job) == []
