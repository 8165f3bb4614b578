"""Named volumes: made once, mounted read-write or read-only into any number
of a tenant's container sandboxes, kept across them, bounded by their size,
listed with the sandboxes using them, removed only on request and never
while mounted; through the SDK, the HTTP API and the CLI."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

import dsec
from dsec import DSecClient

from .conftest import REPO, Server, Tenant, run_args

DSEC = Path(os.environ.get("DSEC_BIN") or REPO / "target" / "release" / "dsec")
MIB = 1 << 20


def _name(prefix: str = "vol") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_a_volume_is_shared_kept_bounded_and_removed_on_request(client: DSecClient, image: str) -> None:
    name = _name()
    made = await client.create_volume(name, size_mb=32)
    assert made.name == name and made.size_mb == 32 and made.sandboxes == []
    try:
        writer = await client.run_container(run_args(image, volumes={"/data": name}), timeout=120)
        reader = await client.run_container(
            run_args(image, volumes={"/mnt/ref": {"name": name, "read_only": True}}), timeout=120)
        try:
            r = await writer.run_shell("echo shared > /data/note && cat /data/note")
            assert r.stdout == "shared\n", r
            # The other sandbox sees the same directory, read-only.
            assert (await reader.run_shell("cat /mnt/ref/note")).stdout == "shared\n"
            r = await reader.run_shell("echo no > /mnt/ref/other; echo rc=$?")
            assert "Read-only file system" in r.stderr and "rc=1" in r.stdout, r
            # Listed with both users; refused removal while they run.
            (listed,) = [v for v in await client.volumes() if v.name == name]
            assert sorted(listed.sandboxes) == sorted([writer.id, reader.id]), listed
            with pytest.raises(dsec.VolumeInUse):
                await client.delete_volume(name)
            # Bounded by its size, inside the sandbox.
            r = await writer.run_shell("dd if=/dev/zero of=/data/fill bs=1M count=64; echo rc=$?; "
                                       "rm -f /data/fill", timeout=120)
            assert "Disk quota exceeded" in r.stderr or "No space left on device" in r.stderr, r
            assert "rc=0" not in r.stdout, r
        finally:
            await writer.delete()
            await reader.delete()
        # Kept across sandboxes.
        later = await client.run_container(run_args(image, volumes={"/data": name}), timeout=120)
        try:
            assert (await later.run_shell("cat /data/note")).stdout == "shared\n"
            (listed,) = [v for v in await client.volumes() if v.name == name]
            assert listed.sandboxes == [later.id] and listed.used_bytes > 0, listed
        finally:
            await later.delete()
        (listed,) = [v for v in await client.volumes() if v.name == name]
        assert listed.sandboxes == []
    finally:
        await client.delete_volume(name)
    assert name not in [v.name for v in await client.volumes()]
    with pytest.raises(dsec.VolumeNotFound):
        await client.delete_volume(name)


async def test_bad_volume_requests_get_clear_errors(client: DSecClient, image: str, server: Server,
                                                    other_tenant: Tenant) -> None:
    for bad in ("", "Upper", "a/b", "-x", "x" * 64):
        with pytest.raises(dsec.InvalidRequest):
            await client.create_volume(bad)
    with pytest.raises(dsec.InvalidLimits):
        await client.create_volume(_name(), size_mb=0)
    name = _name()
    await client.create_volume(name, size_mb=8)
    try:
        with pytest.raises(dsec.AlreadyExists):
            await client.create_volume(name)
        # Unknown volumes and bad mount paths are refused at creation,
        # before anything starts.
        with pytest.raises(dsec.VolumeNotFound):
            await client.run_container(run_args(image, volumes={"/data": _name("missing")}), timeout=60)
        for path in ("relative", "/", "/proc/x", "/dev", "/a/../b"):
            with pytest.raises(dsec.InvalidRequest):
                await client.run_container(run_args(image, volumes={path: name}), timeout=60)
        with pytest.raises(dsec.InvalidRequest):
            await client.run(dsec.DSecRunArgs(backend="microvm", image=image, volumes={"/data": name}), timeout=60)
        # Another tenant neither sees nor mounts it.
        async with DSecClient(server.url, other_tenant.token) as other:
            assert name not in [v.name for v in await other.volumes()]
            with pytest.raises(dsec.VolumeNotFound):
                await other.run_container(run_args(image, volumes={"/data": name}), timeout=60)
            with pytest.raises(dsec.VolumeNotFound):
                await other.delete_volume(name)
        # A failed creation left no user behind.
        (listed,) = [v for v in await client.volumes() if v.name == name]
        assert listed.sandboxes == []
    finally:
        await client.delete_volume(name)


def _cli(server: Server, tenant: Tenant, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DSEC_ENDPOINT": server.url, "DSEC_TOKEN": tenant.token}
    return subprocess.run([str(DSEC), *args], env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


async def test_the_cli_creates_lists_mounts_and_removes_volumes(server: Server, tenant: Tenant, image: str) -> None:
    name = _name("cli")
    r = _cli(server, tenant, "volume", "create", name, "--size", "16")
    assert r.returncode == 0 and name in r.stdout, r
    try:
        r = _cli(server, tenant, "run", image, "--volume", f"/work={name}", "--", "sh", "-c",
                 "echo from-cli > /work/f && cat /work/f")
        assert r.returncode == 0 and r.stdout == "from-cli\n", r
        r = _cli(server, tenant, "run", image, "--volume", f"/work={name}:ro", "--", "sh", "-c",
                 "cat /work/f; touch /work/g")
        assert r.stdout == "from-cli\n" and r.returncode != 0, r
        r = _cli(server, tenant, "volume", "ls")
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(name))
        assert " 16 MiB " in line, r.stdout
    finally:
        r = _cli(server, tenant, "volume", "rm", name)
        assert r.returncode == 0 and f"removed {name}" in r.stdout, r
    r = _cli(server, tenant, "volume", "rm", name)
    assert r.returncode != 0 and "volume" in r.stderr, r
