"""Fault drills on a real cluster on one machine.

A PostgreSQL server of the test's own (``scripts/postgres-test.sh``, so it
can be stopped and started), two ``dsec apiserver --database postgres://``
replicas probing the nodes themselves, and two ``dsec edge --join``
processes, each in a network namespace of its own on a bridge the test
makes (and removes, even on failure).

Drills, in order, on one cluster:

- an apiserver replica SIGKILLed in the middle of a burst: the SDK, given
  both replicas, carries on through the other; every creation returns a
  sandbox and exactly one exists for each (creations carry idempotency
  keys, recorded in the shared store before placement);
- PostgreSQL stopped in the middle of a burst and started again: meanwhile
  both replicas answer ``store_unavailable`` (503 with Retry-After), then
  serve again on their own; every creation that succeeded is there and
  none that failed left a sandbox;
- an edge partitioned (its veth down) and healed: its sandboxes are
  ``unknown`` and placement avoids it, then they are back.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dsec import DSecClient, Sandbox
from dsec.errors import DSecError

from .conftest import REPO, Proc, _free_port, _http, _mounts_under, _stop
from .test_cluster_join import (
    Cluster,
    Net,
    _args,
    _eventually,
    _node_of,
    _psql,
    _run,
    _spawn,
    _states,
    _wait_up,
)

PG_SCRIPT = REPO / "scripts" / "postgres-test.sh"


@dataclass
class Drills:
    cluster: Cluster
    pg_dir: Path
    tenant_token: str

    def api(self, which: str) -> str:
        return self.cluster.api_a if which == "a" else self.cluster.api_b

    def start_api(self, which: str) -> Proc:
        c = self.cluster
        url = self.api(which)
        proc = _spawn(
            c.root,
            f"api-{which}",
            [
                str(c.binary),
                "apiserver",
                "--data-dir",
                str(c.root / f"api-{which}"),
                "--database",
                c.db,
                "--listen",
                url.removeprefix("http://"),
            ],
            c.procs,
        )
        _wait_up(url, proc)
        return proc


def _pg(cmd: str, pg_dir: Path) -> str:
    return _run("bash", str(PG_SCRIPT), cmd, str(pg_dir)).stdout.strip()


@pytest.fixture(scope="module")
def drills() -> Iterator[Drills]:
    binary = Path(os.environ.get("DSEC_BIN") or REPO / "target" / "release" / "dsec")
    images = os.environ.get("DSEC_TEST_IMAGES_DIR")
    if not binary.is_file() or not images or not shutil.which("psql"):
        pytest.fail("needs DSEC_BIN, DSEC_TEST_IMAGES_DIR and PostgreSQL", pytrace=False)
    tag = uuid.uuid4().hex[:6]
    net = Net(tag=tag, subnet=random.randrange(1, 250))
    root = Path(tempfile.mkdtemp(prefix="dsec-drill-"))
    # The postgres user must reach the server's directory.
    pg_dir = Path(tempfile.mkdtemp(prefix="dsec-drill-pg-", dir="/var/tmp"))
    os.chmod(pg_dir, 0o755)
    procs: list[Proc] = []
    try:
        net.make(2)
        pg = _pg("start", pg_dir)
        _psql(pg, "CREATE DATABASE dsec_drill")
        db = pg.rsplit("/", 1)[0] + "/dsec_drill"
        c = Cluster(
            root=root,
            binary=binary,
            images=images,
            net=net,
            db=db,
            api_a=f"http://{net.host_ip}:{_free_port()}",
            api_b=f"http://{net.host_ip}:{_free_port()}",
            admin="",
            join_token="",
            edges={},
            procs=procs,
        )
        d = Drills(cluster=c, pg_dir=pg_dir, tenant_token="")
        d.start_api("a")
        d.start_api("b")
        c.admin = (root / "api-a" / "admin-token").read_text().strip()
        status, raw = _http("POST", c.api_a + "/v1/cluster/join-tokens", c.admin, {})
        assert status == 201, raw
        c.join_token = json.loads(raw)["token"]
        c.start_edge(1, c.join_token, {"zone": "a"})
        c.start_edge(2, c.join_token, {"zone": "b"})
        status, raw = _http("POST", c.api_a + "/v1/tenants", c.admin, {"name": f"drill-{tag}"})
        assert status == 201, raw
        d.tenant_token = json.loads(raw)["token"]
        yield d
    finally:
        for pr in reversed(procs):
            _stop(pr.proc.pid, pr.proc)
        for pr in procs:
            print(f"--- {pr.log.name}\n{pr.tail()}")
        net.remove()
        _run("bash", str(PG_SCRIPT), "destroy", str(pg_dir), check=False)
        shutil.rmtree(pg_dir, ignore_errors=True)
        if not _mounts_under(root):
            shutil.rmtree(root, ignore_errors=True)


async def _ready(d: Drills) -> None:
    c = d.cluster
    want = {c.node(1): "ready", c.node(2): "ready"}
    async with DSecClient(c.api_a, c.admin) as a, DSecClient(c.api_b, c.admin) as b:
        await _eventually("both edges ready on A", lambda: _states(a, want), 120)
        await _eventually("both edges ready on B", lambda: _states(b, want), 60)


async def _until(what: str, cond: Callable[[], bool], timeout: float = 60) -> None:
    async def probe() -> bool:
        return cond()

    await _eventually(what, probe, timeout)


async def _delete_all(client: DSecClient, sandboxes: list[Sandbox]) -> None:
    await asyncio.gather(*(client.sandbox(s.id).delete() for s in sandboxes))


async def test_a_replica_killed_in_a_burst(drills: Drills) -> None:
    d, c = drills, drills.cluster
    await _ready(d)
    label = {"suite": "join", "drill": "replica"}
    async with DSecClient([c.api_a, c.api_b], d.tenant_token) as both:
        tasks = [
            asyncio.create_task(both.run_container(_args(labels=label), timeout=120))
            for _ in range(24)
        ]
        # SIGKILL A once the burst is under way: some creations are done,
        # the others in flight at A or not sent yet.
        deadline = time.monotonic() + 60
        while not any(t.done() for t in tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        a = next(p for p in c.procs if p.log.name == "api-a.log" and p.proc.poll() is None)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(timeout=10)
        try:
            in_flight = sum(not t.done() for t in tasks)
            # On a fast host the burst may be over by the time the signal
            # lands; creations sent after A died go through B whatever the
            # timing.
            tasks += [
                asyncio.create_task(both.run_container(_args(labels=label), timeout=120))
                for _ in range(8)
            ]
            created = await asyncio.gather(*tasks)
            assert both.endpoint == c.api_b, "the SDK moved to the live replica"
            ids = [s.id for s in created]
            assert len(set(ids)) == len(ids) == 32
            async with DSecClient(c.api_b, d.tenant_token) as b:
                listed = [s.id for s in await b.list(labels={"drill": "replica"})]
            assert sorted(listed) == sorted(ids), (
                f"exactly one sandbox per creation ({in_flight} were in flight when A died)"
            )
        finally:
            # A comes back on the same store (the drills after this one
            # need it, whatever happened here).
            d.start_api("a")
        async with DSecClient(c.api_a, d.tenant_token) as a2:
            assert (await a2.get(ids[0])).state == "running"
        await _delete_all(both, created)


async def test_postgres_restarted_in_a_burst(drills: Drills) -> None:
    d, c = drills, drills.cluster
    await _ready(d)
    label = {"suite": "join", "drill": "postgres"}
    made: list[Sandbox] = []
    refusals: list[DSecError] = []
    stop = asyncio.Event()
    ok_after: dict[str, int] = {"a": 0, "b": 0}
    restarted = asyncio.Event()

    async def burst(which: str) -> None:
        async with DSecClient(d.api(which), d.tenant_token) as client:
            while not stop.is_set():
                try:
                    made.append(await client.run_container(_args(labels=label), timeout=60))
                    if restarted.is_set():
                        ok_after[which] += 1
                except DSecError as e:
                    refusals.append(e)
                    await asyncio.sleep(min(e.retry_after or 0.2, 0.2))

    loops = [asyncio.create_task(burst(w)) for w in ("a", "b")]
    try:
        await _until("creations under way", lambda: len(made) >= 4)
        await asyncio.to_thread(_pg, "stop", d.pg_dir)
        await _until("503s from the replicas", lambda: len(refusals) >= 4, 30)
        await asyncio.sleep(1)
        await asyncio.to_thread(_pg, "start", d.pg_dir)
        restarted.set()
        await _until("both replicas create again", lambda: min(ok_after.values()) >= 2, 60)
    finally:
        stop.set()
        await asyncio.gather(*loops)
    assert refusals, "the outage was seen"
    for e in refusals:
        assert (e.status, e.code) == (503, "store_unavailable"), f"{e.status} {e.code}: {e}"
        assert e.retry_after is not None and e.retry_after > 0, e
    async with DSecClient(c.api_b, d.tenant_token) as b:
        listed = sorted(s.id for s in await b.list(labels={"drill": "postgres"}))
        assert listed == sorted(s.id for s in made), "each acknowledged creation is there, no other"
        await _delete_all(b, made)


async def test_an_edge_partitioned_and_healed(drills: Drills) -> None:
    d, c = drills, drills.cluster
    await _ready(d)
    n1, n2 = c.node(1), c.node(2)
    label = {"suite": "join", "drill": "partition"}
    link = f"dsj{c.net.tag}h2"
    async with (
        DSecClient(c.api_a, d.tenant_token) as ua,
        DSecClient(c.api_b, d.tenant_token) as ub,
        DSecClient(c.api_a, c.admin) as admin_a,
        DSecClient(c.api_b, c.admin) as admin_b,
    ):
        on_n2 = await asyncio.gather(
            *(ua.run_container(_args(labels=label, node_selector={"zone": "b"})) for _ in range(3))
        )
        ids = {s.id for s in on_n2}
        assert {_node_of(i) for i in ids} == {n2}
        for client in (ua, ub):
            assert ids <= {s.id for s in await client.list(labels={"drill": "partition"})}
        _run("ip", "link", "set", link, "down")
        try:
            for admin in (admin_a, admin_b):
                await _eventually(
                    "n2 unreachable", lambda a=admin: _states(a, {n2: "unreachable"}), 30
                )

            async def unknown() -> bool:
                got = {s.id: s.state for s in await ub.list(labels={"drill": "partition"})}
                return all(got.get(i) == "unknown" for i in ids)

            await _eventually("n2's sandboxes unknown", unknown, 30)
            elsewhere = await asyncio.gather(
                *(ub.run_container(_args(labels=label)) for _ in range(3))
            )
            assert {_node_of(s.id) for s in elsewhere} == {n1}, "placement avoids the cut node"
        finally:
            _run("ip", "link", "set", link, "up")
        for admin in (admin_a, admin_b):
            await _eventually("n2 back", lambda a=admin: _states(a, {n2: "ready"}), 60)

        async def running() -> bool:
            states = [(await ua.get(i)).state for i in ids]
            return all(st == "running" for st in states)

        await _eventually("n2's sandboxes running again", running, 60)
        r = await on_n2[0].run_shell("echo healed")
        assert r.exit_code == 0 and r.stdout == "healed\n"
        await _delete_all(ua, [*on_n2, *elsewhere])
