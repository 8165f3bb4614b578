"""``scripts/cluster-local.sh``: the one-machine cluster the README names.

``up`` starts PostgreSQL, two apiserver replicas, a watcher and two edges,
each edge in a network namespace of its own, every link TLS under a CA the
script makes; it prints the lines to export. The test uses those lines as a
user would (the SDK and the CLI, trusting the printed CA; containers and a
microVM, through either replica), then ``down``
must leave nothing: no process it started, no namespace, no bridge, no
directory.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from dsec import DSecClient, DSecContainerRunArgs, DSecRunArgs

from .conftest import REPO, _mounts_under

SCRIPT = REPO / "scripts" / "cluster-local.sh"


def _script(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )


def _exports(out: str) -> dict[str, str]:
    got = {}
    for line in out.splitlines():
        if line.startswith("export "):
            k, v = line.removeprefix("export ").split("=", 1)
            got[k] = v
    return got


def _recorded(state: Path, key: str) -> list[str]:
    return [ln.split()[1] for ln in state.read_text().splitlines() if ln.split()[0] == key]


async def test_the_local_cluster_comes_up_serves_and_goes_away_without_a_trace() -> None:
    binary = os.environ.get("DSEC_BIN") or str(REPO / "target" / "release" / "dsec")
    images = os.environ.get("DSEC_TEST_IMAGES_DIR")
    if not images:
        pytest.fail("needs DSEC_TEST_IMAGES_DIR (see scripts/test.sh)", pytrace=False)
    parent = Path(tempfile.mkdtemp(prefix="dsec-local-"))
    # PostgreSQL's own user must reach the cluster's directory.
    parent.chmod(0o755)
    where = parent / "cluster"
    env = {**os.environ, "DSEC_BIN": binary, "DSEC_IMAGES_DIR": images}
    for k in ("DSEC_ENDPOINT", "DSEC_TOKEN", "DSEC_CA_CERT"):
        env.pop(k, None)
    up = _script("up", "--edges", "2", "--dir", str(where), env=env)
    state = where / "state"
    recorded: dict[str, list[str]] = {}
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        exports = _exports(up.stdout)
        assert set(exports) == {"DSEC_ENDPOINT", "DSEC_TOKEN", "DSEC_CA_CERT"}, up.stdout
        endpoints = exports["DSEC_ENDPOINT"].split(",")
        assert len(endpoints) == 2 and all(e.startswith("https://") for e in endpoints)
        recorded = {k: _recorded(state, k) for k in ("pid", "edge-pid", "netns", "bridge")}
        assert len(recorded["pid"]) == 3 and len(recorded["edge-pid"]) == 2
        assert len(recorded["netns"]) == 2

        # A second `up` on the same directory is refused, and harms nothing.
        again = _script("up", "--dir", str(where), env=env)
        assert again.returncode != 0 and "already" in again.stderr

        # The SDK, given what was printed (DSEC_CA_CERT included).
        user_env = {**env, **exports}
        async with DSecClient(
            endpoints, exports["DSEC_TOKEN"], ca_cert=exports["DSEC_CA_CERT"]
        ) as client:
            nodes = await client.nodes()
            assert sorted(n.name for n in nodes) == ["edge-1", "edge-2"]
            assert all(n.state == "ready" for n in nodes)
            args = DSecContainerRunArgs(
                container_image="busybox", memory_limit_mb=32, cpu_cores_limit=0.1
            )
            sandboxes = await asyncio.gather(
                *(client.run_container(args, timeout=120) for _ in range(6))
            )
            assert {s.id.split(".", 1)[0] for s in sandboxes} == {"edge-1", "edge-2"}
            r = await sandboxes[0].run_shell("echo over-tls")
            assert r.exit_code == 0 and r.stdout == "over-tls\n"
            # The CLI, with the same environment.
            ps = subprocess.run(
                [binary, "ps"], env=user_env, capture_output=True, text=True, timeout=30
            )
            assert ps.returncode == 0, ps.stderr
            assert all(s.id in ps.stdout for s in sandboxes)
            await asyncio.gather(*(s.delete() for s in sandboxes))

            # A microVM goes to a node that runs them; reached through the
            # other replica, over TLS too.
            assert all("microvm" in n.backends for n in nodes), [n.backends for n in nodes]
            vm = await client.run(
                DSecRunArgs(
                    backend="microvm", image="busybox", memory_limit_mb=256,
                    cpu_cores_limit=1, disk_limit_mb=64, init_user="root",
                ),
                timeout=300,
            )
            assert vm.id.split(".", 1)[0] in ("edge-1", "edge-2")
            async with DSecClient(
                endpoints[::-1], exports["DSEC_TOKEN"], ca_cert=exports["DSEC_CA_CERT"]
            ) as other:
                r = await other.sandbox(vm.id).run_shell("echo in-a-vm")
                assert r.exit_code == 0 and r.stdout == "in-a-vm\n"
            await vm.delete()
    finally:
        down = _script("down", "--dir", str(where), env=env)
        if up.returncode != 0 or down.returncode != 0:
            print(up.stdout, up.stderr, down.stdout, down.stderr)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not where.exists()
    for pid in recorded.get("pid", []) + recorded.get("edge-pid", []):
        assert not Path(f"/proc/{pid}").exists() or "dsec" not in Path(
            f"/proc/{pid}/cmdline"
        ).read_bytes().decode(errors="replace"), f"process {pid} outlived down"
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in netns for ns in recorded.get("netns", []))
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any(f" {br}:" in links for br in recorded.get("bridge", []))
    assert not _mounts_under(parent)
    parent.rmdir()
