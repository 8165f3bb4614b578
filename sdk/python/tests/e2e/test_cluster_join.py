"""Edges that join: a real cluster on one machine.

PostgreSQL (the suite's throwaway server, ``DSEC_TEST_POSTGRES``), a
``dsec watcher``, two ``dsec apiserver --database postgres://`` replicas (one
reading the watcher's view, one probing the nodes itself) and three
``dsec edge --join`` processes, each in a network namespace of its own with
its own address on a bridge the test makes (and removes, even on failure).
Every link is TLS: ``dsec cluster init`` makes the cluster CA, ``dsec cluster
cert`` each process's certificate, and every client (the SDK, the CLI, the
apiservers, the watcher, the edges joining) trusts that CA alone.

It checks: a client that does not trust the cluster CA is refused; a wrong
join token is refused; an edge whose certificate another CA issued is
refused; joined nodes show their backends,
labels, capacity and state; sandboxes land on more than one node and are
reached through either replica; a node selector keeps to labelled nodes;
drain stops placements; a killed edge's sandboxes are ``unknown`` (never
dropped) and come back when it restarts; a node joins while the cluster
runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from dsec import DSecClient, DSecConnectionError, DSecContainerRunArgs, NodeInfo, SandboxInfo

from .conftest import REPO, Proc, _free_port, _http, _mounts_under, _stop

T = TypeVar("T")


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, timeout=60)


@dataclass
class Net:
    """A bridge with one network namespace per edge, each on its own address."""

    tag: str
    subnet: int
    namespaces: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"dsj{self.tag}"

    @property
    def host_ip(self) -> str:
        return f"10.213.{self.subnet}.1"

    def edge_ip(self, i: int) -> str:
        return f"10.213.{self.subnet}.{10 + i}"

    def make(self, edges: int) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(1, edges + 1):
            ns, host_end, ns_end = f"dsj{self.tag}-e{i}", f"dsj{self.tag}h{i}", f"dsj{self.tag}n{i}"
            _run("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            _run("ip", "link", "set", ns_end, "netns", ns)
            _run("ip", "link", "set", host_end, "master", self.bridge)
            _run("ip", "link", "set", host_end, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.edge_ip(i)}/24", "dev", ns_end)
            _run("ip", "-n", ns, "link", "set", ns_end, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def remove(self) -> None:
        # Deleting a namespace deletes its veth end, and with it the peer.
        for ns in self.namespaces:
            _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", self.bridge, check=False)


@dataclass
class Cluster:
    root: Path
    binary: Path
    images: str
    net: Net
    db: str
    api_a: str
    api_b: str
    admin: str
    join_token: str
    edges: dict[str, Proc]
    procs: list[Proc]
    #: The cluster CA's certificate (what every client trusts); ``None``:
    #: a plain-HTTP cluster (the drills run one).
    ca: str | None = None

    def node(self, i: int) -> str:
        return f"j{self.net.tag}-{i}"

    def start_edge(
        self, i: int, token: str, labels: dict[str, str], ca_dir: Path | None = None
    ) -> Proc:
        """Starts edge i; in a TLS cluster with a certificate for its address
        from the CA in ``ca_dir`` (default: the cluster's)."""
        name = self.node(i)
        log = self.root / f"{name}.log"
        tls: list[str] = []
        if self.ca:
            cert_dir = self.root / f"certs-{name}-{uuid.uuid4().hex[:4]}"
            cert, key = _issue(
                self.binary, ca_dir or self.root / "ca", name, self.net.edge_ip(i), cert_dir
            )
            tls = ["--tls-cert", cert, "--tls-key", key, "--cluster-ca", self.ca]
        # nsenter enters the network namespace only: `ip netns exec` would
        # also remount /sys, hiding the host's cgroup hierarchy.
        cmd = [
            "nsenter",
            f"--net=/run/netns/{self.net.namespaces[i - 1]}",
            str(self.binary),
            "edge",
            "--data-dir",
            str(self.root / name),
            "--images-dir",
            self.images,
            "--node",
            name,
            "--listen",
            f"{self.net.edge_ip(i)}:8081",
            "--cluster-secret-file",
            str(self.root / f"{name}.secret"),
            *tls,
            "--stop-sandboxes-on-exit",
            "--fncall-pools",
            "python=0:1",
            "--join",
            self.api_a,
            "--join-token",
            token,
        ]
        for k, v in labels.items():
            cmd += ["--label", f"{k}={v}"]
        with open(log, "ab") as f:
            p = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(p, log)
        self.procs.append(proc)
        self.edges[name] = proc
        return proc


def _spawn(cluster_root: Path, name: str, cmd: list[str], procs: list[Proc]) -> Proc:
    log = cluster_root / f"{name}.log"
    with open(log, "wb") as f:
        p = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc = Proc(p, log)
    procs.append(proc)
    return proc


def _issue(binary: Path, ca_dir: Path, name: str, host: str, out: Path) -> tuple[str, str]:
    """``dsec cluster cert``: a certificate for ``host`` signed by the CA in
    ``ca_dir``; returns (cert, key) paths."""
    r = _run(
        str(binary), "cluster", "cert", "--ca-dir", str(ca_dir), "--name", name,
        "--host", host, "--out-dir", str(out),
    )
    assert r.stdout.startswith("--tls-cert "), r.stdout
    return str(out / f"{name}.pem"), str(out / f"{name}-key.pem")


def _wait_up(url: str, proc: Proc, ca: str | None = None) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            pytest.fail(f"process exited early:\n{proc.tail()}", pytrace=False)
        try:
            if _http("GET", url + "/healthz", timeout=2, ca=ca)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{url} did not come up:\n{proc.tail()}", pytrace=False)


def _psql(url: str, sql: str) -> None:
    _run("psql", url, "-v", "ON_ERROR_STOP=1", "-qc", sql)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    binary = Path(os.environ.get("DSEC_BIN") or REPO / "target" / "release" / "dsec")
    images = os.environ.get("DSEC_TEST_IMAGES_DIR")
    pg = os.environ.get("DSEC_TEST_POSTGRES")
    if not binary.is_file() or not images or not pg:
        pytest.fail(
            "needs DSEC_BIN, DSEC_TEST_IMAGES_DIR and DSEC_TEST_POSTGRES (see scripts/test.sh)",
            pytrace=False,
        )
    tag = uuid.uuid4().hex[:6]
    net = Net(tag=tag, subnet=random.randrange(1, 250))
    root = Path(tempfile.mkdtemp(prefix="dsec-join-"))
    dbname = f"dsec_join_{tag}"
    base = pg.rsplit("/", 1)[0]
    db = f"{base}/{dbname}"
    procs: list[Proc] = []
    try:
        net.make(3)
        _psql(pg, f"CREATE DATABASE {dbname}")
        init = _run(str(binary), "cluster", "init", "--dir", str(root / "ca"))
        assert "cluster CA:" in init.stdout, init.stdout
        ca = str(root / "ca" / "ca.pem")
        assert (root / "ca" / "ca-key.pem").stat().st_mode & 0o077 == 0
        api_cert, api_key = _issue(binary, root / "ca", "apiserver", net.host_ip, root / "certs")
        w_cert, w_key = _issue(binary, root / "ca", "watcher", "127.0.0.1", root / "certs")
        tls = ["--tls-cert", api_cert, "--tls-key", api_key, "--cluster-ca", ca]
        # Replica A first: it makes the schema and its admin token, which
        # the watcher checks apiservers by.
        port_w = _free_port()
        watcher_url = f"https://127.0.0.1:{port_w}"
        api_a = f"https://{net.host_ip}:{_free_port()}"
        api_b = f"https://{net.host_ip}:{_free_port()}"
        a = _spawn(
            root,
            "api-a",
            [
                str(binary),
                "apiserver",
                "--data-dir",
                str(root / "api-a"),
                "--database",
                db,
                "--listen",
                api_a.removeprefix("https://"),
                "--watcher",
                watcher_url,
                *tls,
            ],
            procs,
        )
        _wait_up(api_a, a, ca)
        w = _spawn(
            root,
            "watcher",
            [
                str(binary),
                "watcher",
                "--database",
                db,
                "--listen",
                f"127.0.0.1:{port_w}",
                "--period-ms",
                "300",
                "--tls-cert",
                w_cert,
                "--tls-key",
                w_key,
                "--cluster-ca",
                ca,
            ],
            procs,
        )
        _wait_up(watcher_url, w, ca)
        # Replica B probes the nodes itself (no watcher).
        b = _spawn(
            root,
            "api-b",
            [
                str(binary),
                "apiserver",
                "--data-dir",
                str(root / "api-b"),
                "--database",
                db,
                "--listen",
                api_b.removeprefix("https://"),
                *tls,
            ],
            procs,
        )
        _wait_up(api_b, b, ca)
        admin = (root / "api-a" / "admin-token").read_text().strip()
        status, raw = _http("POST", api_a + "/v1/cluster/join-tokens", admin, {}, ca=ca)
        assert status == 201, raw
        c = Cluster(
            root=root,
            binary=binary,
            images=images,
            net=net,
            db=db,
            api_a=api_a,
            api_b=api_b,
            admin=admin,
            join_token=json.loads(raw)["token"],
            edges={},
            procs=procs,
            ca=ca,
        )
        c.start_edge(1, c.join_token, {"zone": "a"})
        c.start_edge(2, c.join_token, {"zone": "b"})
        yield c
    finally:
        for pr in reversed(procs):
            _stop(pr.proc.pid, pr.proc)
        # Shown by pytest when the test failed.
        for pr in procs:
            print(f"--- {pr.log.name}\n{pr.tail()}")
        net.remove()
        _psql(pg, f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        if not _mounts_under(root):
            shutil.rmtree(root, ignore_errors=True)


async def _eventually(
    what: str, probe: Callable[[], Awaitable[T | None]], timeout: float = 60
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = await probe()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s", pytrace=False)
        await asyncio.sleep(0.3)


def _by_name(nodes: list[NodeInfo]) -> dict[str, NodeInfo]:
    return {n.name: n for n in nodes}


async def _states(client: DSecClient, want: dict[str, str]) -> dict[str, NodeInfo] | None:
    nodes = _by_name(await client.nodes())
    return nodes if all(n in nodes and nodes[n].state == s for n, s in want.items()) else None


def _args(**kw: object) -> DSecContainerRunArgs:
    base: dict[str, object] = dict(
        container_image="busybox", memory_limit_mb=32, cpu_cores_limit=0.1, labels={"suite": "join"}
    )
    base.update(kw)
    return DSecContainerRunArgs(**base)  # type: ignore[arg-type]


def _node_of(sb_id: str) -> str:
    return sb_id.split(".", 1)[0]


async def test_a_cluster_of_joined_edges(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.node(1), cluster.node(2), cluster.node(3)
    async with (
        DSecClient(cluster.api_a, cluster.admin, ca_cert=cluster.ca) as admin_a,
        DSecClient(cluster.api_b, cluster.admin, ca_cert=cluster.ca) as admin_b,
    ):
        # A client that does not trust the cluster CA gets no answer.
        async with DSecClient(cluster.api_a, cluster.admin) as untrusting:
            with pytest.raises(DSecConnectionError, match="(?i)certificate"):
                await untrusting.nodes()

        # Both replicas see both nodes, ready, with what they declared.
        for admin in (admin_a, admin_b):
            nodes = await _eventually(
                "both edges ready", lambda a=admin: _states(a, {n1: "ready", n2: "ready"}), 120
            )
        assert nodes[n1].labels["zone"] == "a" and nodes[n2].labels["zone"] == "b"
        assert nodes[n1].labels["kvm"] in ("true", "false") and "arch" in nodes[n1].labels
        assert "container" in nodes[n1].backends
        assert (
            nodes[n1].cpu_capacity > 0
            and nodes[n1].memory_capacity_mb > 0
            and nodes[n1].slots_capacity > 0
        )

        # The CLI's view.
        env = {
            **os.environ,
            "DSEC_ENDPOINT": cluster.api_b,
            "DSEC_TOKEN": cluster.admin,
            "DSEC_CA_CERT": cluster.ca,
        }
        ls = subprocess.run(
            [str(cluster.binary), "node", "ls"], env=env, capture_output=True, text=True, timeout=30
        )
        assert ls.returncode == 0, ls.stderr
        assert (
            n1 in ls.stdout and n2 in ls.stdout and "zone=a" in ls.stdout and "ready" in ls.stdout
        )

        # A wrong join token: the edge is refused and exits.
        bad = cluster.start_edge(3, "dsec_" + "0" * 64, {"zone": "c"})
        assert bad.proc.wait(timeout=180) != 0
        assert "join_refused" in bad.log.read_text(errors="replace"), bad.tail()
        assert n3 not in _by_name(await admin_a.nodes())

        # The right token, but a certificate another CA issued: the
        # apiserver's handshake with the edge fails, and the join with it.
        other_ca = cluster.root / "other-ca"
        _run(str(cluster.binary), "cluster", "init", "--dir", str(other_ca))
        forged = cluster.start_edge(3, cluster.join_token, {"zone": "c"}, ca_dir=other_ca)
        assert forged.proc.wait(timeout=180) != 0
        log = forged.log.read_text(errors="replace")
        assert "join_refused" in log and "certificate" in log, forged.tail()
        assert n3 not in _by_name(await admin_a.nodes())

        status, raw = _http(
            "POST",
            cluster.api_a + "/v1/tenants",
            cluster.admin,
            {"name": f"join-{cluster.net.tag}"},
            ca=cluster.ca,
        )
        assert status == 201, raw
        token = json.loads(raw)["token"]
        async with (
            DSecClient(cluster.api_a, token, ca_cert=cluster.ca) as ua,
            DSecClient(cluster.api_b, token, ca_cert=cluster.ca) as ub,
        ):
            # A burst lands on both nodes, through either replica.
            sandboxes = await asyncio.gather(
                *(c.run_container(_args(), timeout=120) for c in (ua, ub) for _ in range(4))
            )
            assert {_node_of(s.id) for s in sandboxes} == {n1, n2}
            for s in sandboxes[:2]:
                assert (await ub.get(s.id)).state == "running"
                assert (await ua.get(s.id)).state == "running"

            # A node selector keeps to the labelled node.
            picked = [
                await ua.run_container(_args(node_selector={"zone": "b"}), timeout=120)
                for _ in range(3)
            ]
            assert {_node_of(s.id) for s in picked} == {n2}
            sandboxes += picked

            # Drain through replica B: replica A stops placing there too.
            drain = subprocess.run(
                [str(cluster.binary), "node", "drain", n1],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert drain.returncode == 0, drain.stderr
            await _eventually(
                "n1 draining on replica A", lambda: _states(admin_a, {n1: "draining"})
            )
            during = await asyncio.gather(
                *(ua.run_container(_args(), timeout=120) for _ in range(4))
            )
            assert {_node_of(s.id) for s in during} == {n2}
            sandboxes += during
            # What runs on the drained node goes on.
            on_n1 = [s for s in sandboxes if _node_of(s.id) == n1]
            assert on_n1 and (await ua.get(on_n1[0].id)).state == "running"
            await admin_b.undrain_node(n1)
            await _eventually("n1 ready again", lambda: _states(admin_a, {n1: "ready"}))

            # Kill n2's edge (SIGKILL, its sandboxes left running): they are
            # `unknown`, in lists and gets, and placement avoids the node.
            on_n2 = {s.id for s in sandboxes if _node_of(s.id) == n2}
            listed = {s.id for s in await ua.list(labels={"suite": "join"})}
            assert on_n2 <= listed
            cluster.edges[n2].proc.kill()
            cluster.edges[n2].proc.wait(timeout=30)
            await _eventually("n2 unreachable", lambda: _states(admin_a, {n2: "unreachable"}))
            await _eventually("n2 unreachable on B", lambda: _states(admin_b, {n2: "unreachable"}))

            async def unknown_in_list() -> list[SandboxInfo] | None:
                got = [s for s in await ua.list(labels={"suite": "join"}) if s.id in on_n2]
                return (
                    got
                    if len(got) == len(on_n2) and all(s.state == "unknown" for s in got)
                    else None
                )

            await _eventually("n2's sandboxes unknown in the list", unknown_in_list)
            assert (await ub.get(next(iter(on_n2)))).state == "unknown"
            while_down = await asyncio.gather(
                *(ub.run_container(_args(), timeout=120) for _ in range(3))
            )
            assert {_node_of(s.id) for s in while_down} == {n1}
            sandboxes += while_down

            # A node joins while the cluster runs, with the right token.
            cluster.start_edge(3, cluster.join_token, {"zone": "c"})
            await _eventually("n3 joined", lambda: _states(admin_b, {n3: "ready"}), 120)
            # Replica A learns of it on its own registry read (within a second).
            await _eventually("n3 ready on A", lambda: _states(admin_a, {n3: "ready"}), 30)
            on_c = await ua.run_container(_args(node_selector={"zone": "c"}), timeout=120)
            assert _node_of(on_c.id) == n3
            sandboxes.append(on_c)

            # n2's edge restarts and rejoins: its sandboxes come back.
            cluster.start_edge(2, cluster.join_token, {"zone": "b"})
            await _eventually("n2 back", lambda: _states(admin_a, {n2: "ready"}), 120)

            async def back() -> bool:
                states = [(await ua.get(i)).state for i in sorted(on_n2)]
                return all(st == "running" for st in states)

            await _eventually("n2's sandboxes running again", back, 60)
            revived = next(s for s in sandboxes if s.id in on_n2)
            r = await revived.run_shell("echo alive")
            assert r.exit_code == 0 and r.stdout == "alive\n"

            await asyncio.gather(*(s.delete() for s in sandboxes))
            assert await ua.list(labels={"suite": "join"}) == []
