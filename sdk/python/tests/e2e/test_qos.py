"""CPU QoS classes against a real ``dsec up``: a best-effort container's
cgroup has the documented weight and (cgroup v1) every task of it runs
under SCHED_IDLE, forks included; switching the class while it runs
changes both; a latency-sensitive one keeps SCHED_OTHER and the default
weight; a bad class is a clear 400 and a stopped sandbox's class cannot
change. Read from the host, as the kernel sees the sandbox."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

import dsec
from dsec import DSecClient
from dsec.sandbox import Sandbox

from .conftest import Server, Tenant, run_args

#: The documented mapping (docs/design.md, "CPU QoS classes").
V1_SHARES = {"latency_sensitive": "1024", "best_effort": "2"}


def _cpu_hierarchy() -> tuple[Path, int]:
    """The mount point of the cpu controller and its cgroup version."""
    v2 = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, extra = left.split(), right.split()
        if extra[0] == "cgroup" and "cpu" in extra[-1].split(","):
            return Path(fields[4]), 1
        if extra[0] == "cgroup2" and v2 is None:
            v2 = Path(fields[4])
    assert v2 is not None, "no cgroup hierarchy carries the cpu controller"
    return v2, 2


def _cgroup(sb: Sandbox) -> tuple[Path, int]:
    root, version = _cpu_hierarchy()
    d = root / "dsec" / sb.info.node / sb.id
    assert d.is_dir(), f"no cgroup {d}"
    return d, version


def _policies(cg: Path, version: int) -> dict[int, int]:
    """Scheduling policy of every thread in the cgroup (threads that ended
    since the listing are left out)."""
    tasks = cg / ("tasks" if version == 1 else "cgroup.threads")
    out = {}
    for line in tasks.read_text().split():
        try:
            out[int(line)] = os.sched_getscheduler(int(line))
        except ProcessLookupError:
            pass
    assert out, f"no task in {cg}"
    return out


async def _start_sleeper(sb: Sandbox) -> int:
    """A process forked after creation; its host pid, found in the cgroup
    by its command line."""
    await sb.run_shell("nohup sleep 600 >/dev/null 2>&1 &")
    cg, version = _cgroup(sb)
    procs = cg / "cgroup.procs"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for pid in procs.read_text().split():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"600"]:
                    return int(pid)
            except OSError:
                pass
        await asyncio.sleep(0.2)
    pytest.fail(f"the sleeper never appeared in {procs}")


def _assert_class(sb: Sandbox, cls: str) -> None:
    assert sb.info.qos_class == cls, sb.info
    cg, version = _cgroup(sb)
    policies = _policies(cg, version)
    if version == 1:
        shares = (cg / "cpu.shares").read_text().strip()
        if (cg / "cpu.idle").exists():
            # 5.15+: a best-effort group is idle too, and the kernel then
            # reports the idle weight as its shares.
            assert (cg / "cpu.idle").read_text().strip() == ("1" if cls == "best_effort" else "0")
            assert shares == ("3" if cls == "best_effort" else "1024")
        else:
            assert shares == V1_SHARES[cls]
        want = os.SCHED_IDLE if cls == "best_effort" else os.SCHED_OTHER
        assert set(policies.values()) == {want}, policies
    else:
        idle = cg / "cpu.idle"
        if idle.exists():
            assert idle.read_text().strip() == ("1" if cls == "best_effort" else "0")
        else:
            assert (cg / "cpu.weight").read_text().strip() == ("1" if cls == "best_effort" else "100")


async def test_best_effort_tasks_are_idle_and_the_class_changes_while_running(client: DSecClient) -> None:
    sb = await client.run_container(run_args("python", qos_class="best_effort"), timeout=120)
    try:
        _assert_class(sb, "best_effort")
        # A process forked after creation inherits SCHED_IDLE.
        sleeper = await _start_sleeper(sb)
        _assert_class(sb, "best_effort")

        await sb.set_qos_class("latency_sensitive")
        _assert_class(sb, "latency_sensitive")
        assert os.sched_getscheduler(sleeper) == os.SCHED_OTHER
        assert (await sb.refresh()).qos_class == "latency_sensitive"

        await sb.set_qos_class("best_effort")
        _assert_class(sb, "best_effort")
        # Setting the class it has changes nothing and is no error.
        await sb.set_qos_class("best_effort")
        _assert_class(sb, "best_effort")
        _, version = _cgroup(sb)
        if version == 1:
            assert os.sched_getscheduler(sleeper) == os.SCHED_IDLE
        # Commands still run, under the class, and cannot leave it: that
        # needs CAP_SYS_NICE, outside the sandbox's bounding set.
        r = await sb.run_shell("echo ok")
        assert r.stdout == "ok\n"
        if version == 1:
            r = await sb.run_shell("python3 -c 'import os; os.sched_setscheduler(0, os.SCHED_OTHER, "
                                   "os.sched_param(0))' 2>&1 | tail -1")
            assert "PermissionError" in r.stdout, r
    finally:
        await sb.delete()


async def test_latency_sensitive_is_the_container_default(client: DSecClient) -> None:
    sb = await client.run_container(run_args("python"), timeout=120)
    try:
        _assert_class(sb, "latency_sensitive")
        await _start_sleeper(sb)
        _assert_class(sb, "latency_sensitive")
    finally:
        await sb.delete()


async def test_a_bad_class_is_a_clear_400_and_an_ended_sandbox_keeps_its_class(client: DSecClient) -> None:
    with pytest.raises(dsec.InvalidRequest) as e:
        await client.run_container(run_args("python", qos_class="realtime"), timeout=120)
    assert e.value.status == 400 and "best_effort" in e.value.message, e.value
    sb = await client.run_container(run_args("python"), timeout=120)
    try:
        with pytest.raises(dsec.InvalidRequest) as e:
            await sb.set_qos_class("realtime")
        assert "latency_sensitive" in e.value.message, e.value
        assert (await sb.refresh()).qos_class == "latency_sensitive"
        await sb.stop()
        with pytest.raises(dsec.SandboxEnded):
            await sb.set_qos_class("best_effort")
    finally:
        await sb.delete()


def _qemu_threads(cg: Path) -> dict[int, int]:
    """Policies of every thread of the QEMU processes in the cgroup: its
    vCPU threads among them (named only with QEMU's debug-threads)."""
    out = {}
    for pid in (cg / "cgroup.procs").read_text().split():
        try:
            if not Path(f"/proc/{pid}/comm").read_text().startswith("qemu"):
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                out[int(tid)] = os.sched_getscheduler(int(tid))
        except (OSError, ProcessLookupError):
            pass
    return out


async def test_a_best_effort_microvm_runs_its_vcpu_threads_idle_also_after_a_restore(client: DSecClient) -> None:
    """A VM's QEMU is its sandbox's process: its vCPU threads are in the
    class, and so are those of the new QEMU a restore from suspend starts."""
    args = dsec.DSecRunArgs(backend="microvm", image="busybox", memory_limit_mb=256, cpu_cores_limit=1,
                            disk_limit_mb=64, ttl_running_stop=600, init_user="root",
                            qos_class="best_effort", labels={"suite": "sdk-e2e-qos"})
    sb = await client.run(args, timeout=300)
    try:
        cg, version = _cgroup(sb)
        if version != 1:
            pytest.skip("per-task policies are cgroup v1's mapping")
        _assert_class(sb, "best_effort")
        # The main loop, the vCPU thread(s) and QEMU's workers.
        threads = _qemu_threads(cg)
        assert len(threads) >= 2 and set(threads.values()) == {os.SCHED_IDLE}, threads
        assert (await sb.suspend()).suspended
        assert (await sb.resume()).changed
        _assert_class(sb, "best_effort")
        await sb.set_qos_class("latency_sensitive")
        _assert_class(sb, "latency_sensitive")
        threads = _qemu_threads(cg)
        assert len(threads) >= 2 and set(threads.values()) == {os.SCHED_OTHER}, threads
    finally:
        await sb.delete()


async def test_the_cli_changes_the_class(server: Server, tenant: Tenant, client: DSecClient) -> None:
    sb = await client.run_container(run_args("python"), timeout=120)
    try:
        binary = os.environ.get("DSEC_BIN") or str(Path(__file__).resolve().parents[4] / "target/release/dsec")
        env = {**os.environ, "DSEC_ENDPOINT": server.url, "DSEC_TOKEN": tenant.token}
        proc = await asyncio.create_subprocess_exec(binary, "qos", "best_effort", sb.id, env=env,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0 and out.decode() == f"{sb.id} best_effort\n", (out, err)
        await sb.refresh()
        _assert_class(sb, "best_effort")
        proc = await asyncio.create_subprocess_exec(binary, "qos", "realtime", sb.id, env=env,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode != 0 and b"latency_sensitive or best_effort" in err, (out, err)
    finally:
        await sb.delete()
