"""A container's writable layer on the node's disk (the default,
``--writable-layer disk``): a btrfs subvolume per sandbox, bounded by
``disk_limit_mb`` through its quota group, not held in the sandbox's memory,
and gone with the sandbox; and the tmpfs layer a node may choose instead.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

import dsec
from dsec import DSecClient

from .conftest import Server, run_args, serve_dsec

MIB = 1 << 20
GIB = 1 << 30


def _node_disk(server: Server) -> Path:
    """The session node's writable-layer filesystem (DATA/edge/NODE/writable)."""
    found = list((server.data_dir / "edge").glob("*/writable/sandboxes"))
    assert len(found) == 1, found
    return found[0].parent


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _loops_backed_by(image: Path) -> list[str]:
    """Loop devices whose backing file is ``image``."""
    out = []
    for dev in Path("/sys/block").glob("loop*"):
        try:
            backing = (dev / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if backing == str(image.resolve()):
            out.append(dev.name)
    return out


def _mounts_under(path: Path) -> list[str]:
    root = str(path.resolve())
    with open("/proc/self/mounts") as f:
        return [p for p in (line.split()[1] for line in f) if p == root or p.startswith(root + "/")]


async def test_a_256_mib_sandbox_holds_a_4_gib_layer_and_leaves_nothing(
        client: DSecClient, image: str, server: Server) -> None:
    disk = _node_disk(server)
    sb = await client.run_container(run_args(image, memory_limit_mb=256, disk_limit_mb=5 * 1024), timeout=120)
    try:
        assert (disk / "sandboxes" / sb.id).is_dir()
        r = await sb.run_shell("dd if=/dev/zero of=/root/big bs=1M count=4096 2>&1 | tail -1; "
                               "sync; stat -c %s /root/big", timeout=900)
        assert r.exit_code == 0 and r.stdout.split()[-1] == str(4 * GIB), r
        # The sandbox is alive, its memory within its limit, and the layer's
        # use (its quota group's count) is the 4 GiB it wrote. The memory
        # count includes the page cache dd's writes went through, which the
        # kernel reclaims at the limit: right after the write it may stand
        # at the limit exactly.
        assert (await sb.run_shell("echo alive")).stdout == "alive\n"
        m = await sb.metrics(seconds=5)
        assert m.latest is not None and m.latest.memory_bytes <= 256 * MIB, m.latest
        # btrfs updates a quota group's count as its transactions commit,
        # which a busy host may put off for a while after the sync.
        seen = [s.disk_bytes or 0 for s in m.samples]
        deadline = time.monotonic() + 60
        while max(seen) < 4 * GIB and time.monotonic() < deadline:
            await asyncio.sleep(1)
            latest = (await sb.metrics(seconds=1)).latest
            seen.append((latest.disk_bytes or 0) if latest else 0)
        assert max(seen) >= 4 * GIB, seen
    finally:
        await sb.delete()
    # Nothing of it stays: its subvolume (and with it its quota group) is gone.
    assert not (disk / "sandboxes" / sb.id).exists()


async def test_fncall_runners_keep_their_writable_layer_in_memory(admin: DSecClient, server: Server) -> None:
    """A FnCall call's scratch files come and go in its runner's writable
    layer: runners keep it in a tmpfs even where sandboxes' layers are on
    the node's disk (cheaper per call), so none has a subvolume there."""
    r = await admin.fncall("python", "print(6 * 7)")
    assert r.stdout == "42\n", r
    runners = await admin.list(labels={"dsec.fncall": "python"})
    assert runners, "a call ran, so a python runner is up"
    disk = _node_disk(server)
    for sb in runners:
        assert not (disk / "sandboxes" / sb.id).exists(), f"runner {sb.id} has its layer on the node's disk"


async def test_a_write_past_the_limit_fails_inside_and_the_host_does_not_fill(
        client: DSecClient, image: str, server: Server) -> None:
    disk = _node_disk(server)
    backing = disk.parent / "writable.img"
    sb = await client.run_container(run_args(image, memory_limit_mb=256, disk_limit_mb=64), timeout=120)
    try:
        before = _allocated(backing)
        r = await sb.run_shell("dd if=/dev/urandom of=/root/fill bs=1M count=200; echo rc=$?; sync; "
                               "du -sm /root/fill", timeout=300)
        assert "Disk quota exceeded" in r.stderr or "No space left on device" in r.stderr, r
        assert "rc=0" not in r.stdout, r
        assert int(r.stdout.split()[-2]) <= 64, r
        # On the host, the node's image grew by at most the limit (and some
        # metadata), not by what the sandbox tried to write.
        assert _allocated(backing) - before <= 96 * MIB, (before, _allocated(backing))
        # An upload past the limit is the SDK's NoSpace, and the sandbox lives.
        await sb.run_shell("rm /root/fill && sync")
        sb2 = await client.run_container(run_args(image, memory_limit_mb=256, disk_limit_mb=16), timeout=120)
        try:
            with pytest.raises(dsec.NoSpace):
                await sb2.write_file("/root/upload", b"\1" * (40 * MIB))
            assert (await sb2.run_shell("echo alive")).stdout == "alive\n"
        finally:
            await sb2.delete()
        # The space is back once the file is gone.
        r = await sb.run_shell("dd if=/dev/zero of=/root/again bs=1M count=32 2>&1 && echo wrote", timeout=120)
        assert r.stdout.endswith("wrote\n"), r
    finally:
        await sb.delete()


async def test_a_tmpfs_node_keeps_layers_in_memory_and_has_no_volumes(image: str) -> None:
    gen = serve_dsec(["--writable-layer", "tmpfs", "--fncall-pools", "python=0:1"])
    srv = next(gen)
    try:
        assert not list((srv.data_dir / "edge").glob("*/writable.img"))
        async with DSecClient(srv.url, srv.admin_token) as c:
            sb = await c.run_container(run_args(image, memory_limit_mb=256, disk_limit_mb=64), timeout=120)
            try:
                r = await sb.run_shell("df -k / | tail -1; dd if=/dev/zero of=/root/f bs=1M count=100 2>&1")
                # The layer is the sandbox's own tmpfs of its disk limit.
                assert int(r.stdout.splitlines()[0].split()[1]) <= 64 * 1024, r
                assert "No space left on device" in r.stdout, r
            finally:
                await sb.delete()
            # Asked for more disk than memory, the tmpfs layer is held below
            # the memory limit: a fill, by a command or by an upload the
            # agent writes, is ENOSPC, and the agent lives.
            sb = await c.run_container(run_args("busybox", memory_limit_mb=64, disk_limit_mb=1024), timeout=120)
            try:
                r = await sb.run_shell("dd if=/dev/zero of=/root/fill bs=1M count=300 2>&1; df -k / | tail -1",
                                       timeout=60)
                assert "No space left on device" in r.stdout, r
                assert int(r.stdout.splitlines()[-1].split()[1]) <= 48 * 1024, r
                await sb.run_shell("rm /root/fill")
                with pytest.raises(dsec.NoSpace):
                    await sb.write_file("/root/upload", b"\0" * (60 << 20))
                assert (await sb.run_shell("echo alive")).stdout == "alive\n"
            finally:
                await sb.delete()
            with pytest.raises(dsec.VolumesUnavailable):
                await c.create_volume("nodisk")
    finally:
        gen.close()


async def test_the_edge_s_shutdown_leaves_no_loop_device_or_mount(image: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    gen = serve_dsec(["--fncall-pools", "python=0:1"], data_dir=data)
    srv = next(gen)
    try:
        image_file = next((data / "edge").glob("*/writable.img"))
        assert _loops_backed_by(image_file), "the node's disk is loop-mounted while the edge runs"
        async with DSecClient(srv.url, srv.admin_token) as c:
            sb = await c.run_container(run_args(image, disk_limit_mb=64), timeout=120)
            await sb.run_shell("echo x > /root/x")
    finally:
        gen.close()
    assert _mounts_under(data) == []
    assert _loops_backed_by(image_file) == []


async def test_layers_on_disk_survive_restarts_and_are_re_adopted(image: str, tmp_path: Path) -> None:
    """Sandboxes left running by a clean shutdown and then by a crash keep
    their layers (the node's disk stays mounted for them); each next edge
    re-adopts them on the same mount; the last, stopping shutdown removes
    the layers, the mount and the loop device."""
    data = tmp_path / "data"
    node = f"e2e-ld-{uuid.uuid4().hex[:6]}"
    lives = []
    done = False

    def life(stop: bool) -> Server:
        lives.append(serve_dsec(["--no-fncall"], data_dir=data, node=node, stop_sandboxes_on_exit=stop))
        return next(lives[-1])

    try:
        srv = life(stop=False)
        async with DSecClient(srv.url, srv.admin_token) as c:
            sb = await c.run_container(run_args(image, disk_limit_mb=128), timeout=120)
            await sb.run_shell("echo first-life > /root/note")
        lives[-1].close()  # SIGTERM: a clean shutdown that keeps sandboxes
        image_file = data / "edge" / node / "writable.img"
        layer = data / "edge" / node / "writable" / "sandboxes" / sb.id
        assert layer.is_dir() and _loops_backed_by(image_file), "kept for the running sandbox"

        srv = life(stop=False)
        async with DSecClient(srv.url, srv.admin_token) as c:
            again = await c.connect(sb.id)
            assert (await again.refresh()).state == "running"
            r = await again.run_shell("cat /root/note && echo second-life >> /root/note")
            assert r.stdout == "first-life\n", r
        os.kill(srv.pid, signal.SIGKILL)
        lives[-1].close()
        assert len(_loops_backed_by(image_file)) == 1, "one loop device, whatever the restarts"

        srv = life(stop=True)
        async with DSecClient(srv.url, srv.admin_token) as c:
            again = await c.connect(sb.id)
            assert (await again.run_shell("cat /root/note")).stdout == "first-life\nsecond-life\n"
            # Still bounded by its quota after two re-adoptions.
            r = await again.run_shell("dd if=/dev/zero of=/root/fill bs=1M count=200; echo rc=$?", timeout=120)
            assert "Disk quota exceeded" in r.stderr and "rc=0" not in r.stdout, r
        lives[-1].close()
        done = True
        assert not layer.exists()
        assert _mounts_under(data) == [] and _loops_backed_by(image_file) == []
    finally:
        for gen in lives:
            gen.close()
        if not done:
            # A failure before the last life: its sandboxes still run.
            cleanup = serve_dsec(["--no-fncall"], data_dir=data, node=node)
            next(cleanup)
            cleanup.close()
