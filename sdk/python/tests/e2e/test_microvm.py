"""MicroVMs end to end: the same SDK calls as for containers, against a real
QEMU ``microvm`` booting the guest kernel (under TCG where KVM cannot run
it, about 3 s per boot). Boots are slow, so one busybox microVM is shared by
the tests of this file in order (exec, files, sessions, a PTY, the disk
limit, pause and transparent resume, suspend to disk and transparent
resume, a later resume in a standby QEMU, a memory snapshot of the
suspended VM and its deletion), and the last of them stops it and
checks that nothing of it is left on the host; one more restores the node's
template of its shape, two more are forks that continue the snapshot's
memory, one more boots the python image and serves a port of the guest through
the proxy, and one more is suspended
under a platform of its own that is killed and started again."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

import dsec
from dsec import DSecClient, DSecRunArgs

from .conftest import Server, Tenant, _http
from .test_ports import PORT, bearer, pattern, start_server

pytestmark = pytest.mark.e2e

DISK_MB = 64


def vm_args(image: str, **kw: object) -> DSecRunArgs:
    base: dict[str, object] = dict(backend="microvm", image=image, memory_limit_mb=256,
                                   cpu_cores_limit=1, disk_limit_mb=DISK_MB, ttl_running_stop=600,
                                   init_user="root", labels={"suite": "sdk-e2e-microvm"})
    base.update(kw)
    return DSecRunArgs(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def vm_id(server: Server, tenant: Tenant) -> Iterator[str]:
    """One busybox microVM for the whole file (created over plain HTTP so
    that it outlives each test's event loop)."""
    status, raw = _http("POST", server.url + "/v1/sandboxes", tenant.token,
                        vm_args("busybox").to_json(), timeout=120)
    assert status == 201, f"creating a microVM answered {status}: {raw[:500]!r}\n{server.log_tail()}"
    sid = json.loads(raw)["id"]
    try:
        yield sid
    finally:
        _http("DELETE", f"{server.url}/v1/sandboxes/{sid}", tenant.token, timeout=60)


async def test_commands_run_in_the_guest_kernel(client: DSecClient, vm_id: str) -> None:
    sb = client.sandbox(vm_id)
    info = await sb.refresh()
    assert info.state == "running"
    r = await sb.run_shell("uname -r; hostname; grep -c ^processor /proc/cpuinfo; "
                           "awk '/MemTotal/ {print $2}' /proc/meminfo; echo err >&2; exit 3")
    release, hostname, cpus, mem_kb = r.stdout.split()
    # A kernel of its own, not the host's.
    assert release.endswith("-cloud-amd64") and release != os.uname().release
    assert vm_id.endswith(hostname)
    assert int(cpus) == 1
    # The guest sees about the RAM it was given (minus the kernel's share).
    assert 150 * 1024 < int(mem_kb) <= 256 * 1024
    assert r.stderr == "err\n" and r.exit_code == 3
    # Free page reporting in 128 KiB blocks (the agent re-applied the
    # edge's order after the balloon driver reset it to 2 MiB blocks, at
    # which a small guest never reports).
    r = await sb.run_shell("cat /sys/module/page_reporting/parameters/page_reporting_order")
    assert r.stdout.strip() == "5", r


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


async def test_microvms_of_one_shape_restore_the_node_template(client: DSecClient, vm_id: str) -> None:
    """The first microVM of a shape made the node's template (a memory
    image of a freshly booted guest) and was restored from it; a second
    one of the same shape restores it too, as its own sandbox."""
    first = _qemu_of(vm_id)
    assert len(first) == 1 and "share=off" in _cmdline(first[0]), _cmdline(first[0])
    sb = await client.run(vm_args("busybox"), timeout=120)
    try:
        [pid] = _qemu_of(sb.id)
        line = _cmdline(pid)
        assert "mem-path=/proc/self/fd/4,share=off" in line and "-incoming defer" in line, line
        import time
        r = await sb.run_shell("hostname; date +%s; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' '")
        hostname, clock, rand = r.stdout.split()
        assert sb.id.endswith(hostname)
        assert abs(int(clock) - time.time()) < 30
        other = await client.sandbox(vm_id).run_shell("head -c 16 /dev/urandom | od -An -tx1 | tr -d ' '")
        assert other.stdout.strip() != rand
        # Its own writable disk: nothing of the other VM's files.
        assert not await sb.exists("/data/blob.bin")
    finally:
        await sb.delete()


async def test_files_go_in_and_out(client: DSecClient, vm_id: str) -> None:
    sb = client.sandbox(vm_id)
    blob = os.urandom(3 << 20)
    await sb.write_file("/data/blob.bin", blob)
    assert await sb.read_file("/data/blob.bin") == blob
    await sb.write_file("/tmp/hello.txt", "hello from the host\n")
    r = await sb.run_shell("cat /tmp/hello.txt; sha256sum /data/blob.bin | cut -c1-16")
    import hashlib
    assert r.stdout == f"hello from the host\n{hashlib.sha256(blob).hexdigest()[:16]}\n"
    names = {f.name for f in await sb.list_dir("/data")}
    assert names == {"blob.bin"}
    assert not await sb.exists("/data/missing")


async def test_sessions_and_a_pty(client: DSecClient, vm_id: str) -> None:
    sb = client.sandbox(vm_id)
    async with await sb.create_session() as session:
        await session.run("cd /tmp && export X=42")
        r = await session.run('pwd; echo "$X"')
        assert r.stdout == "/tmp\n42\n"
    async with sb.pty(cmd="/bin/sh", rows=24, cols=80) as term:
        await term.send("echo marker-$((6*7))\n")
        out = await term.read_until("marker-42", timeout=30)
        assert b"marker-42" in out
        await term.send("exit 5\n")
        result = await asyncio.wait_for(term.wait(), 30)
    assert result is not None and result.exit_code == 5


async def test_the_writable_disk_is_limited(client: DSecClient, vm_id: str) -> None:
    sb = client.sandbox(vm_id)
    r = await sb.run_shell(f"dd if=/dev/zero of=/fill bs=1M count={DISK_MB + 16} 2>&1; echo rc=$?; rm -f /fill",
                           timeout=120)
    assert "No space left on device" in r.stdout and "rc=1" in r.stdout, r
    # The space comes back once the file is gone.
    r = await sb.run_shell("dd if=/dev/zero of=/again bs=1M count=16 2>&1 && rm /again")
    assert r.exit_code == 0, r


async def test_pause_stops_the_vm_and_a_request_resumes_it(client: DSecClient, vm_id: str) -> None:
    sb = client.sandbox(vm_id)
    await sb.run_shell("date +%s > /tmp/t0")
    p = await sb.pause(mode="freeze")
    assert p.changed and p.sandbox.state == "paused" and not p.suspended
    assert (await sb.refresh()).state == "paused"
    # Any request resumes it transparently; memory and files are intact.
    r = await sb.run_shell("cat /tmp/t0 /tmp/hello.txt")
    assert r.exit_code == 0 and "hello from the host" in r.stdout
    assert (await sb.refresh()).state == "running"
    p = await sb.pause(mode="freeze")
    res = await sb.resume()
    assert res.changed and res.sandbox.state == "running"
    assert (await sb.run_shell("echo back")).stdout == "back\n"


def _qemu_of(sid: str) -> list[int]:
    """QEMU processes of the sandbox (their command line names its files)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"qemu-system-x86_64") and any(sid.encode() in a for a in argv):
                found.append(int(pid))
    return found


async def test_suspend_ends_qemu_and_a_request_restores_it(server: Server, client: DSecClient,
                                                           vm_id: str) -> None:
    sb = client.sandbox(vm_id)
    # A file and a process that must survive: the process's pid is kept.
    await sb.run_shell("echo kept > /root/kept.txt; sleep 100000 >/dev/null 2>&1 & echo $! > /tmp/sleeper")
    before = _qemu_of(vm_id)
    assert len(before) == 1
    p = await sb.pause()  # the default for a microVM: suspend to disk
    assert p.changed and p.suspended and p.sandbox.state == "paused" and p.sandbox.suspended
    # (Its cgroup may still be charged with the node template's shared
    # memory: this first VM of its shape made the template.)
    assert p.disk_bytes > 0 and p.memory_before_bytes > 0
    # No QEMU process is left; the image and the RAM file are on disk.
    assert _qemu_of(vm_id) == []
    assert list(server.data_dir.glob(f"edge/*/vm/suspend/{vm_id}.vmstate"))
    info = await sb.refresh()
    assert info.state == "paused" and info.suspended
    # Pausing again changes nothing; a request resumes it transparently.
    assert not (await sb.pause()).changed
    r = await sb.run_shell("cat /root/kept.txt; kill -0 $(cat /tmp/sleeper) && echo alive")
    assert r.stdout == "kept\nalive\n", r
    after = _qemu_of(vm_id)
    assert len(after) == 1 and after != before, "resume starts a new QEMU"
    info = await sb.refresh()
    assert info.state == "running" and not info.suspended
    assert not list(server.data_dir.glob(f"edge/*/vm/suspend/{vm_id}.vmstate")), "the image is spent"
    # An explicit suspend and resume; an unknown mode is refused.
    assert (await sb.suspend()).suspended
    assert (await sb.resume()).changed
    with pytest.raises(ValueError):
        await sb.pause(mode="hibernate")


def _pids_by_cgroup(matches: Callable[[str], bool]) -> list[int]:
    """Processes whose /proc/PID/cgroup text `matches` (a VM's QEMU is
    found by its sandbox's cgroup: one resumed in a standby QEMU has a
    command line that names no sandbox)."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if matches(Path(f"/proc/{pid}/cgroup").read_text()):
                found.add(int(pid))
        except OSError:
            continue
    return sorted(found)


def _pids_in_cgroup(suffix: str) -> list[int]:
    return _pids_by_cgroup(lambda text: any(line.endswith(suffix) for line in text.splitlines()))


def _standbys(node: str) -> list[int]:
    """The node's standby QEMUs (started ahead for resumes)."""
    return _pids_by_cgroup(lambda text: f"/dsec/{node}/{node}.standby-" in text)


async def test_a_later_resume_continues_in_a_standby_qemu(client: DSecClient, vm_id: str) -> None:
    """After the first resume of a shape the node keeps one QEMU of that
    shape started ahead; the next resume continues the VM in it (its
    processes and files as they were) and a new standby follows."""
    sb = client.sandbox(vm_id)
    node = vm_id.split(".")[0]
    for _ in range(300):
        if _standbys(node):
            break
        await asyncio.sleep(0.1)
    standby = _standbys(node)
    assert len(standby) == 1, standby
    assert (await sb.suspend()).suspended
    r = await sb.run_shell("cat /root/kept.txt; kill -0 $(cat /tmp/sleeper) && echo alive")
    assert r.stdout == "kept\nalive\n", r
    assert _pids_in_cgroup(f"/{vm_id}") == standby, "the standby QEMU runs the VM, in its cgroup"
    for _ in range(300):
        if _standbys(node):
            break
        await asyncio.sleep(0.1)
    assert len(_standbys(node)) == 1 and _standbys(node) != standby, "a new standby follows"


async def test_a_snapshot_of_a_suspended_vm_forks_children(server: Server, tenant: Tenant, client: DSecClient,
                                                           vm_id: str) -> None:
    sb = client.sandbox(vm_id)
    await sb.run_shell("echo from-parent > /root/forked.txt")
    await sb.suspend()
    key = f"snap-{vm_id}"
    # A memory snapshot: its children continue the parent's processes.
    snap = await sb.snapshot(f"e2e-{vm_id.split('.')[1]}", memory=True, idempotency_key=key)
    assert snap.created and snap.source == vm_id and snap.bytes > 0 and snap.parent is None and snap.memory
    # The parent stayed suspended; a retry with the key returns the same one.
    assert (await sb.refresh()).suspended
    again = await sb.snapshot(snap.name, memory=True, idempotency_key=key)
    assert not again.created and again.id == snap.id
    with pytest.raises(dsec.AlreadyExists):
        await sb.snapshot(snap.name)
    kids = await client.fork(snap, 2, vm_args("busybox"))
    try:
        assert len(kids) == 2
        for kid in kids:
            r = await kid.run_shell("cat /root/forked.txt /root/kept.txt; kill -0 $(cat /tmp/sleeper) && echo alive; "
                                    "hostname; echo $$ > /root/mine")
            assert r.stdout == f"from-parent\nkept\nalive\n{kid.id.split('.')[1]}\n", r
            [pid] = _qemu_of(kid.id)
            assert f"{snap.id}" not in _cmdline(pid) and "share=off" in _cmdline(pid)
        # Children are independent: one's write is not the other's.
        assert not await kids[1].exists("/root/nope")
        await kids[0].write_file("/root/only-in-0", "x")
        assert not await kids[1].exists("/root/only-in-0")
        # A snapshot of a child chains onto the parent's.
        child_snap = await kids[0].snapshot(f"{snap.name}-child")
        assert child_snap.parent == snap.id
        assert any(s.id == child_snap.id for s in await client.snapshots())
        # Deletion is refused while anything backs onto the layer: first
        # the chained snapshot, then the live children's disks.
        with pytest.raises(dsec.SnapshotInUse) as e:
            await client.delete_snapshot(snap.name)
        assert e.value.status == 409 and child_snap.name in e.value.message
        # The CLI lists and deletes too (the child's snapshot is a copy:
        # nothing backs onto it).
        listed = _cli(server, tenant, "snapshot", "ls")
        assert snap.name in listed and child_snap.name in listed, listed
        assert _cli(server, tenant, "snapshot", "rm", child_snap.name) == f"removed {child_snap.name}\n"
        with pytest.raises(dsec.SnapshotInUse) as e:
            await client.delete_snapshot(snap.name)
        assert all(kid.id in e.value.message for kid in kids), e.value.message
    finally:
        for kid in kids:
            await kid.delete()
    # Now nothing backs onto it: deleted, files and all; its idempotency
    # key is free again (a retry makes a new snapshot).
    await client.delete_snapshot(snap.name)
    assert not any(s.name in (snap.name, child_snap.name) for s in await client.snapshots())
    with pytest.raises(dsec.SnapshotNotFound):
        await client.delete_snapshot(snap.name)
    left = [p for p in server.data_dir.glob("edge/*/vm/snapshots/*") if snap.id in p.name or child_snap.id in p.name]
    assert left == [], left
    again = await sb.snapshot(snap.name, idempotency_key=key)
    assert again.created and again.id != snap.id
    await client.delete_snapshot(again.name)
    with pytest.raises(dsec.SnapshotNotFound):
        await client.run(vm_args("busybox", snapshot="no-such-snapshot"))


def _cli(server: Server, tenant: Tenant, *args: str) -> str:
    """Runs the dsec CLI as `tenant` against the server; its stdout."""
    import subprocess
    from .conftest import REPO
    binary = os.environ.get("DSEC_BIN") or str(REPO / "target" / "release" / "dsec")
    env = {**os.environ, "DSEC_ENDPOINT": server.url, "DSEC_TOKEN": tenant.token}
    r = subprocess.run([binary, *args], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _host_traces(sid: str) -> list[str]:
    """Whatever of the sandbox is still on this host: processes naming it,
    its run directory, its disk, its cgroups."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if sid.encode() in cmdline:
                found.append(f"process {pid}: {cmdline[:120]!r}")
    if Path(f"/run/dsec/vm/{sid}").exists():
        found.append(f"/run/dsec/vm/{sid}")
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        for ctl in [Path(root), *Path(root).iterdir()] if Path(root).is_dir() else []:
            node = sid.split(".")[0]
            if (ctl / "dsec" / node / sid).exists():
                found.append(str(ctl / "dsec" / node / sid))
    return found


async def test_stop_leaves_nothing_behind(server: Server, client: DSecClient, vm_id: str) -> None:
    sb = client.sandbox(vm_id)
    assert _host_traces(vm_id), "a running microVM must be visible (its QEMU names it)"
    info = await sb.stop()
    assert info.state == "stopped"
    assert _host_traces(vm_id) == []
    for kind in ("disks", "ram", "suspend"):
        left = list(server.data_dir.glob(f"edge/*/vm/{kind}/{vm_id}*"))
        assert left == [], left
    with pytest.raises(dsec.SandboxNotRunning):
        await sb.run_shell("true")


async def test_the_python_image_runs_as_a_microvm_and_serves_a_port(client: DSecClient, server: Server,
                                                                      tenant: Tenant) -> None:
    sb = await client.run(vm_args("python", memory_limit_mb=384), timeout=120)
    try:
        r = await sb.run_shell("python3 -c 'import sys, platform; print(6*7, platform.release())'")
        answer, release = r.stdout.split()
        assert answer == "42" and release.endswith("-cloud-amd64")
        # A port of the guest, reached through the proxy: the guest's agent
        # relays it (the guest kernel's loopback is out of the host's reach).
        base = f"{server.url}/v1/sandboxes/{sb.id}/ports/{PORT}"
        auth = bearer(tenant.token)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            async with http.get(f"{server.url}/v1/sandboxes/{sb.id}/ports/{PORT + 1}/", headers=auth) as resp:
                assert resp.status == 502 and (await resp.json())["error"]["code"] == "port_closed"
            await start_server(sb, http, base, tenant.token)
            n = 4 << 20
            async with http.get(f"{base}/bytes", params={"n": str(n)}, headers=auth) as resp:
                assert resp.status == 200
                assert hashlib.sha256(await resp.read()).hexdigest() == hashlib.sha256(pattern(n)).hexdigest()
            async with http.post(f"{base}/sha256", data=pattern(n), headers=auth) as resp:
                assert resp.status == 200, await resp.text()
                assert await resp.json() == {"sha256": hashlib.sha256(pattern(n)).hexdigest(), "length": n}
            async with http.ws_connect(f"{base}/ws", headers=auth) as ws:
                await ws.send_str("from outside the guest")
                assert (await ws.receive(timeout=60)).data == "from outside the guest"
            url = await sb.expose(PORT)
            async with http.get(url.replace("/?", "/seen?", 1)) as resp:
                assert resp.status == 200 and (await resp.json())["path"] == "/seen"
    finally:
        await sb.delete()


async def test_a_microvm_too_small_for_its_kernel_is_refused(client: DSecClient) -> None:
    with pytest.raises(dsec.DSecError) as e:
        await client.run(vm_args("busybox", memory_limit_mb=32))
    assert e.value.status == 400 and "at least" in e.value.message


async def test_a_suspended_microvm_survives_an_edge_crash() -> None:
    """A platform of its own (the session's must not be killed): a microVM
    is suspended, the edge is SIGKILLed, `dsec up` starts again on the
    same data directory, and the next request restores the VM."""
    import shutil
    import signal
    import tempfile
    import uuid

    from .conftest import _create_tenant, serve_dsec
    data_dir = Path(tempfile.mkdtemp(prefix="dsec-e2e-vmcrash-"))
    node = f"e2e-vmcrash-{uuid.uuid4().hex[:6]}"
    try:
        first = serve_dsec(["--no-fncall"], data_dir=data_dir, node=node, stop_sandboxes_on_exit=False)
        srv = next(first)
        token = _create_tenant(srv, "vmcrash").token
        async with DSecClient(srv.url, token) as c:
            sb = await c.run(vm_args("busybox"), timeout=120)
            await sb.run_shell("echo before-crash > /root/kept; sleep 100000 >/dev/null 2>&1 & echo $! > /tmp/sleeper")
            assert (await sb.suspend()).suspended
        os.kill(srv.pid, signal.SIGKILL)
        first.close()
        assert _qemu_of(sb.id) == [], "a suspended microVM has no QEMU"

        second = serve_dsec(["--no-fncall"], data_dir=data_dir, node=node)
        srv = next(second)
        try:
            async with DSecClient(srv.url, token) as c:
                s = await c.connect(sb.id)
                info = await s.refresh()
                assert info.state == "paused" and info.suspended, info
                r = await s.run_shell("cat /root/kept; kill -0 $(cat /tmp/sleeper) && echo alive")
                assert r.stdout == "before-crash\nalive\n", r
                assert len(_qemu_of(sb.id)) == 1 and (await s.refresh()).state == "running"
                await s.delete()
            assert _host_traces(sb.id) == []
        finally:
            second.close()
        assert _standbys(node) == [], "the edge ends its standby QEMUs when it stops"
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
