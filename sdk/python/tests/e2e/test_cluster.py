"""The cluster shape: two `dsec edge` processes behind one `dsec apiserver`.

The same SDK calls must work when the apiserver is a separate, stateless
process that routes each sandbox request to the edge named in the sandbox id:
creation spreads over both nodes, exec/streams/PTYs/files pass through the
proxy, tenants stay apart, and a node that goes away answers
`edge_unavailable` for its sandboxes while creation moves to the other one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

import dsec
from dsec import DSecClient, DSecContainerRunArgs, JobAlreadyPaused, Sandbox

from . import test_ports as ports
from .conftest import SANDBOX_DOMAIN, REPO, Proc, drop_build_cache, dsec_image, _create_tenant, _free_port, _http, _mounts_under, _stop, Server


@dataclass
class Cluster:
    api: Server
    edges: dict[str, Proc]


def _wait_healthy(url: str, proc: Proc, token: str | None = None, nodes: int = 0) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            pytest.fail(f"process exited early:\n{proc.tail()}", pytrace=False)
        try:
            status, raw = _http("GET", url + "/healthz", token, timeout=2)
            if status == 200:
                import json

                h = json.loads(raw)
                if sum(1 for n in h.get("nodes", []) if n.get("healthy")) >= nodes:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{url} did not become healthy:\n{proc.tail()}", pytrace=False)


#: Small enough that an upload over it is cheap.
CLUSTER_UPLOAD_MB = 8


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    binary = Path(os.environ.get("DSEC_BIN") or REPO / "target" / "release" / "dsec")
    images = os.environ.get("DSEC_TEST_IMAGES_DIR")
    if not binary.is_file() or not images:
        pytest.fail("needs DSEC_BIN and DSEC_TEST_IMAGES_DIR (see scripts/test.sh)", pytrace=False)
    root = Path(tempfile.mkdtemp(prefix="dsec-cluster-"))
    secret = root / "cluster-secret"
    tag = uuid.uuid4().hex[:6]
    procs: list[Proc] = []
    edges: dict[str, Proc] = {}
    try:
        edge_urls = []
        for i in (1, 2):
            name = f"c{tag}-n{i}"
            port = _free_port()
            log = root / f"{name}.log"
            with open(log, "wb") as f:
                p = subprocess.Popen(
                    [str(binary), "edge", "--data-dir", str(root / name), "--images-dir", images,
                     "--node", name, "--listen", f"127.0.0.1:{port}",
                     "--cluster-secret-file", str(secret), "--stop-sandboxes-on-exit",
                     "--max-upload-mb", str(CLUSTER_UPLOAD_MB),
                     # Idle runners go quickly: the job test below wants the
                     # nodes equally loaded again after the FnCall test.
                     "--fncall-pools", "python=1:2", "--fncall-idle-s", "1"],
                    stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                    start_new_session=True)
            proc = Proc(p, log)
            procs.append(proc)
            edges[name] = proc
            # The first edge creates the secret; wait for it before the second.
            deadline = time.monotonic() + 30
            while not secret.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            edge_urls.append(f"{name}=http://127.0.0.1:{port}")
        port = _free_port()
        log = root / "apiserver.log"
        args = [str(binary), "apiserver", "--data-dir", str(root / "api"),
                "--listen", f"127.0.0.1:{port}", "--cluster-secret-file", str(secret),
                "--sandbox-domain", SANDBOX_DOMAIN]
        for e in edge_urls:
            args += ["--edge", e]
        with open(log, "wb") as f:
            p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=f,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        api_proc = Proc(p, log)
        procs.append(api_proc)
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, api_proc, nodes=2)
        token = (root / "api" / "admin-token").read_text().strip()
        yield Cluster(api=Server(url=url, admin_token=token, data_dir=root / "api", log=log,
                                 pid=p.pid), edges=edges)
    finally:
        for pr in reversed(procs):
            _stop(pr.proc.pid, pr.proc)
        if not _mounts_under(root):
            shutil.rmtree(root, ignore_errors=True)


def _args(**kw: object) -> DSecContainerRunArgs:
    base: dict[str, object] = dict(container_image="busybox", memory_limit_mb=64,
                                   cpu_cores_limit=0.1, labels={"suite": "cluster"})
    base.update(kw)
    return DSecContainerRunArgs(**base)  # type: ignore[arg-type]


async def test_requests_route_to_the_owning_edge(cluster: Cluster) -> None:
    tenant = _create_tenant(cluster.api, "cl")
    async with DSecClient(cluster.api.url, tenant.token) as c:
        # Placement spreads a burst over equally loaded nodes (the unit
        # tests of dsec-placement check that); the nodes' FnCall runners
        # are still starting here, so the burst is topped up until both
        # nodes hold a sandbox.
        await _settled(c)
        sandboxes = await _on_every_node(c, cluster, 8)
        for sb in sandboxes:
            r = await sb.run_shell("hostname")
            assert r.exit_code == 0 and r.stdout.strip() == sb.id.split(".")[1]
        sb = sandboxes[0]
        payload = os.urandom(3 << 20)
        await sb.write_file("/tmp/blob", payload)
        assert await sb.read_file("/tmp/blob") == payload
        chunks = []
        stream = await sb.stream_shell("for i in 1 2 3; do echo $i; sleep 0.05; done")
        async for item in stream:
            chunks.append(item)
        assert isinstance(chunks[-1], dsec.ExecResult) and chunks[-1].stdout == "1\n2\n3\n"
        assert len(chunks) >= 3, "output arrived in pieces, through the proxy"
        pty = await sb.pty()
        await pty.send(b"echo through-the-proxy\n")
        assert b"through-the-proxy" in await pty.read_until(b"through-the-proxy\r\n", timeout=10)
        await pty.close()
        # Audit events come from the owning edge's sandbox, through the proxy.
        await sb.run_shell("mount -t tmpfs x /mnt")
        audit = await sb.audit_events()
        assert audit.total == 1 and audit.events[0].detail.startswith("mount refused"), audit
        listed = await c.list(labels={"suite": "cluster"})
        assert {s.id for s in listed} >= {s.id for s in sandboxes}
        # Another tenant sees none of them, on either node.
        other = _create_tenant(cluster.api, "cl-other")
        async with DSecClient(cluster.api.url, other.token) as o:
            assert await o.list(labels={"suite": "cluster"}) == []
            with pytest.raises(dsec.SandboxNotFound):
                await o.get(sb.id)
        await asyncio.gather(*(s.delete() for s in sandboxes))
        assert await c.list(labels={"suite": "cluster"}) == []


async def test_ports_through_the_apiserver(cluster: Cluster) -> None:
    """The apiserver checks the token or its own signature, the owning edge
    connects: by path, by host, by signed URL, HTTP and WebSocket."""
    tenant = _create_tenant(cluster.api, "cl-ports")
    async with DSecClient(cluster.api.url, tenant.token) as c, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        sb = await c.run_container(_args(container_image="python", memory_limit_mb=256,
                                         cpu_cores_limit=0.5), timeout=120)
        try:
            base = f"{cluster.api.url}/v1/sandboxes/{sb.id}/ports/{ports.PORT}"
            await ports.start_server(sb, http, base, tenant.token)
            async with http.post(f"{base}/sha256", data=ports.pattern(8 << 20),
                                 headers=ports.bearer(tenant.token)) as resp:
                assert resp.status == 200 and (await resp.json())["length"] == 8 << 20
            url = await sb.expose(ports.PORT)
            async with http.get(url.replace("/?", "/signed?", 1)) as resp:
                assert resp.status == 200, await resp.text()
                seen = await resp.json()
            assert seen["path"] == "/signed" and "authorization" not in seen["headers"]
            async with http.ws_connect(url.replace("/?", "/ws?", 1)) as ws:
                await ws.send_str("across nodes")
                assert (await ws.receive(timeout=60)).data == "across nodes"
            host = f"{ports.PORT}-{sb.id}.{SANDBOX_DOMAIN}"
            async with http.get(f"{cluster.api.url}/by-host",
                                headers={**ports.bearer(tenant.token), "Host": host}) as resp:
                assert resp.status == 200 and (await resp.json())["path"] == "/by-host"
            async with http.get(url.replace("dsec_sig=", "dsec_sig=0")) as resp:
                assert resp.status == 401
            base_url = await sb.expose(ports.PORT, base=True)
            async with http.get(f"{base_url}/by-path?k=v") as resp:
                assert resp.status == 200 and (await resp.json())["path"] == "/by-path?k=v"
        finally:
            await sb.delete()


async def test_metrics_come_from_the_owning_edge(cluster: Cluster) -> None:
    """A sandbox's series and a node's, through the apiserver's proxy."""
    tenant = _create_tenant(cluster.api, "cl-metrics")
    async with DSecClient(cluster.api.url, tenant.token) as c:
        sb = await c.run_container(_args(), timeout=120)
        try:
            deadline = time.monotonic() + 15
            while not (m := await sb.metrics()).samples:
                assert time.monotonic() < deadline, "no sample within 15 s"
                await asyncio.sleep(0.5)
            assert m.sandbox_id == sb.id and m.latest is not None and m.latest.memory_bytes > 0
        finally:
            await sb.delete()
    async with DSecClient(cluster.api.url, cluster.api.admin_token) as admin:
        for node in cluster.edges:
            deadline = time.monotonic() + 15
            while not (n := await admin.node_metrics(node)).samples:
                assert time.monotonic() < deadline, f"no sample of {node} within 15 s"
                await asyncio.sleep(0.5)
            assert n.node == node and n.cpus >= 1
        with pytest.raises(dsec.NotFound):
            await admin.node_metrics("no-such-node")


async def test_an_upload_over_the_limit_through_the_apiserver(cluster: Cluster, tmp_path: Path) -> None:
    """Refused by the edge behind the apiserver (its limit): at once for a
    known length, midway for a tar stream the apiserver forwards as it comes.
    PayloadTooLarge either way, the next call works, and nothing is left in
    the sandbox."""
    big = os.urandom((CLUSTER_UPLOAD_MB + 2) << 20)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "big").write_bytes(big)
    async with DSecClient(cluster.api.url, cluster.api.admin_token) as c:
        sb = await c.run_container(_args(), timeout=120)
        try:
            for upload in [lambda: sb.write_file("/tmp/w", big),
                           lambda: sb.upload(tmp_path / "dir", "/tmp/d")]:
                for _ in range(2):
                    with pytest.raises(dsec.PayloadTooLarge):
                        await upload()
                    assert (await sb.run_shell("echo next")).stdout == "next\n"
            assert (await sb.run_shell("ls -a /tmp")).stdout.split() == [".", ".."]
        finally:
            await sb.delete()


async def test_fncall_through_the_apiserver(cluster: Cluster) -> None:
    tenant = _create_tenant(cluster.api, "cl-fn")
    async with DSecClient(cluster.api.url, tenant.token) as c:
        results = [await c.fncall("python", "print(6 * 7)") for _ in range(6)]
        assert all(r.ok and r.stdout == "42\n" for r in results), results
        assert {r.runner.split(".")[0] for r in results} == set(cluster.edges), "calls go to every edge in turn"
        batch = await c.fncall_batch([dict(language="python", code=f"print({i})") for i in range(5)])
        assert [r.stdout for r in batch] == [f"{i}\n" for i in range(5)]  # type: ignore[union-attr]
        pools = await c.fncall_pools()
        assert len([p for p in pools if p["language"] == "python"]) == 2, pools


async def _settled(c: DSecClient, timeout: float = 60) -> None:
    """Waits until the FnCall pools of every node are back at their minimum
    with nothing starting, and the watcher has seen the same CPU reserved on
    every node for a few polls in a row (a runner that is still starting or
    retiring would change a node's load in the middle of the next burst)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    steady = 0
    while True:
        pools = await c.fncall_pools()
        nodes = (await c.health()).nodes
        quiet = all(p["runners"] == p["min_runners"] and p["starting"] == 0 and p["idle"] == p["runners"]
                    for p in pools)
        reserved = {round(n.cpu_reserved, 3) for n in nodes}
        steady = steady + 1 if quiet and len(reserved) == 1 else 0
        if steady >= 4:
            return
        if loop.time() > deadline:
            pytest.fail(f"nodes did not settle: pools {pools}, nodes {nodes}")
        await asyncio.sleep(0.3)


async def _on_every_node(c: DSecClient, cluster: Cluster, at_least: int, **kw: object) -> list[Sandbox]:
    """Creates `at_least` sandboxes (with `kw` as their arguments) at once, then more one by one
    until every node holds one. Placement spreads a burst over equally
    loaded nodes, but a node's load can still move under the burst (a
    runner the node retires on its own), and this test is about jobs, not
    about placement."""
    sandboxes = list(await asyncio.gather(*(c.run_container(_args(**kw)) for _ in range(at_least))))
    while {sb.id.split(".")[0] for sb in sandboxes} != set(cluster.edges):
        assert len(sandboxes) < 40, f"placement never chose some node: {[s.id for s in sandboxes]}"
        sandboxes.append(await c.run_container(_args(**kw)))
    return sandboxes


async def test_first_command_runs_on_the_owning_node(cluster: Cluster) -> None:
    tenant = _create_tenant(cluster.api, "cl-first")
    async with DSecClient(cluster.api.url, tenant.token) as c:
        await _settled(c)
        sandboxes = list(await asyncio.gather(
            *(c.run_container(_args(), first_command="hostname") for _ in range(6))))
        while {sb.id.split(".")[0] for sb in sandboxes} != set(cluster.edges):
            assert len(sandboxes) < 40, f"placement never chose some node: {[s.id for s in sandboxes]}"
            sandboxes.append(await c.run_container(_args(), first_command="hostname"))
        for sb in sandboxes:
            r = sb.first_result
            assert r is not None and r.exit_code == 0, r
            assert r.stdout.strip() == sb.id.split(".")[1]
        await asyncio.gather(*(s.delete() for s in sandboxes))


async def test_a_job_pauses_and_resumes_on_every_node(cluster: Cluster) -> None:
    tenant = _create_tenant(cluster.api, "cl-job")
    job = f"cl-job-{uuid.uuid4().hex[:6]}"
    async with DSecClient(cluster.api.url, tenant.token) as c:
        await _settled(c)
        sandboxes = await _on_every_node(c, cluster, 6, job=job)
        n = len(sandboxes)
        events: list[tuple[str, str]] = []

        async def follow() -> None:
            async for e in c.job_events(job):
                events.append((e.id, e.state))

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0.3)
        r = await c.pause_job(job)
        assert (r.matched, r.changed, r.failed) == (n, n, []), r
        assert len(await c.list(job=job, state="paused")) == n
        with pytest.raises(JobAlreadyPaused):
            await c.pause_job(job)
        # A request through the proxy resumes a paused sandbox on its node.
        assert (await sandboxes[0].run_shell("echo back")).stdout == "back\n"
        r = await c.resume_job(job)
        assert (r.changed, r.unchanged) == (n - 1, 1), r
        await asyncio.sleep(0.3)
        follower.cancel()
        paused_on = {i.split(".")[0] for i, st in events if st == "paused"}
        assert paused_on == set(cluster.edges), f"merged job events missed a node: {events}"
        with pytest.raises(dsec.JobNotFound):
            await c.pause_job(f"nothing-{uuid.uuid4().hex}")
        await asyncio.gather(*(s.delete() for s in sandboxes))


async def test_a_build_through_the_apiserver_runs_on_a_node(cluster: Cluster, tmp_path: Path) -> None:
    """The apiserver has no builder of its own: it sends the build to a
    node; the image is then in that node's store (here shared by both)."""
    tenant = _create_tenant(cluster.api, "clb")
    marker = uuid.uuid4().hex
    (tmp_path / "Dockerfile").write_text(f"FROM busybox\nRUN echo {marker} > /built.txt\n")
    name = f"cluster-build-{marker[:8]}:1"
    async with DSecClient(cluster.api.url, tenant.token) as c:
        result = await c.build_image(name, tmp_path)
        assert result.image == name and result.steps == 2
        sb = await c.run_container(_args(container_image=name), timeout=60)
        try:
            assert (await sb.run_shell("cat /built.txt")).stdout.strip() == marker
        finally:
            await sb.stop()
    assert dsec_image(cluster.api, "rm", name).returncode == 0
    drop_build_cache(cluster.api)


async def test_a_node_that_goes_away_is_unavailable_and_skipped(cluster: Cluster) -> None:
    tenant = _create_tenant(cluster.api, "cl-down")
    async with DSecClient(cluster.api.url, tenant.token) as c:
        await _settled(c)
        sandboxes = await _on_every_node(c, cluster, 6)
        victim_name = sorted(cluster.edges)[1]
        victim = cluster.edges[victim_name]
        on_victim = [s for s in sandboxes if s.id.startswith(victim_name + ".")]
        _stop(victim.proc.pid, victim.proc)
        with pytest.raises(dsec.DSecError) as err:
            await on_victim[0].run_shell("true")
        assert err.value.code == "edge_unavailable"
        # Its record answers with what is known: state unknown.
        info = await c.get(on_victim[0].id)
        assert (info.id, info.state) == (on_victim[0].id, "unknown")
        assert "cannot be reached" in (info.state_reason or "")
        # New sandboxes land on the node that is left.
        survivor = await c.run_container(_args())
        assert not survivor.id.startswith(victim_name + ".")
        assert (await survivor.run_shell("echo ok")).stdout == "ok\n"
        for s in [survivor, *sandboxes]:
            if not s.id.startswith(victim_name + "."):
                await s.delete()

