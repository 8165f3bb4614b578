"""Projects, quotas and scoped tokens end to end, through the SDK, the CLI
and raw HTTP, against a real ``dsec up``: quotas hold up the tree, a
sub-project's token cannot see its parent's sandboxes, and each bad input
of the issue is a clear 4xx."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import dsec
from dsec import DSecClient

from .conftest import REPO, Server, drop_build_cache, run_args


def http(server: Server, method: str, path: str, token: str, body: object = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def cli(server: Server, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    binary = os.environ.get("DSEC_BIN") or str(REPO / "target" / "release" / "dsec")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSEC_")}
    return subprocess.run([binary, *args, "--endpoint", server.url, "--token", token], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
async def team(admin: DSecClient) -> AsyncIterator[str]:
    """A fresh top-level project (quota: 2 sandboxes); removed afterwards
    with everything below it."""
    name = f"team-{uuid.uuid4().hex[:8]}"
    await admin.projects.create(name, {"sandboxes": 2})
    try:
        yield name
    finally:
        for sb in await admin.list(project=name):
            try:
                await (await admin.connect(sb.id)).delete()
            except dsec.SandboxNotFound:
                pass
        projects = sorted((p["name"] for p in await admin.projects.list()
                           if p["name"] == name or p["name"].startswith(name + "/")),
                          key=lambda n: -n.count("/"))
        for p in projects:
            # The ledger gives back deleted sandboxes at once; give the
            # events a moment on a busy host.
            for _ in range(60):
                try:
                    await admin.projects.delete(p)
                    break
                except dsec.ProjectNotEmpty:
                    await asyncio.sleep(0.5)


async def test_quotas_hold_up_the_tree_and_sub_projects_see_only_their_own(
        server: Server, admin: DSecClient, team: str, image: str) -> None:
    await admin.projects.create(f"{team}/exp", {"sandboxes": 1})
    with pytest.raises(dsec.Forbidden, match="sandboxes"):
        await admin.projects.create(f"{team}/exp-2", {"sandboxes": 2})  # 1 of 2 is free
    parent_token = (await admin.tokens.create(team, role="admin"))["token"]
    child_token = (await admin.tokens.create(f"{team}/exp", role="solver", ttl_s=3600))["token"]
    async with DSecClient(server.url, parent_token) as parent, DSecClient(server.url, child_token) as child:
        mine = await child.run_container(run_args(image), timeout=180)
        assert (await mine.refresh()).project == f"{team}/exp"
        with pytest.raises(dsec.QuotaExceeded) as e:
            await child.run_container(run_args(image), timeout=180)
        assert f"{team}/exp" in str(e.value) and "sandboxes" in str(e.value)

        theirs = await parent.run_container(run_args(image), timeout=180)
        with pytest.raises(dsec.QuotaExceeded) as e:
            await parent.run_container(run_args(image), timeout=180)
        assert f'"{team}"' in str(e.value), "the parent's own limit: 2 held in its tree"
        # The child's token cannot see its parent's sandbox.
        with pytest.raises(dsec.SandboxNotFound):
            await child.get(theirs.id)
        status, body = http(server, "GET", f"/v1/sandboxes/{theirs.id}", child_token)
        assert (status, body["error"]["code"]) == (404, "sandbox_not_found")
        assert [s.id for s in await child.list()] == [mine.id]
        assert {s.id for s in await admin.list(project=team)} == {mine.id, theirs.id}
        assert [s.id for s in await admin.list(project=f"{team}/exp")] == [mine.id]

        show = await admin.projects.show(team)
        used = {u["name"]: u for u in show["usage"]}
        assert used["sandboxes"]["used"] == 2 and used["sandboxes"]["limit"] == 2
        assert used["sandboxes"]["allocated"] == 1

        # A deleted sandbox gives its share back at once.
        await mine.delete()
        again = await child.run_container(run_args(image), timeout=180)
        await again.delete()
        await theirs.delete()


async def test_bad_input_is_a_clear_4xx(server: Server, admin: DSecClient, team: str) -> None:
    with pytest.raises(dsec.NotFound):
        await admin.tokens.create(f"{team}/nope")
    with pytest.raises(dsec.NotFound):
        await admin.projects.create(f"{team}/nope/deeper")
    with pytest.raises(dsec.InvalidRequest):
        await admin.projects.create(f"{team}/../{team}")  # no way to make a cycle
    for quota in ({"sandboxes": 0}, {"sandboxes": -1}, {"cpu": -2}):
        with pytest.raises(dsec.InvalidLimits):
            await admin.projects.create(f"{team}/bad", quota)
    solver = (await admin.tokens.create(team, role="solver", ttl_s=60))["token"]
    async with DSecClient(server.url, solver) as s:
        with pytest.raises(dsec.Forbidden):
            await s.tokens.create(team, role="admin")
        with pytest.raises(dsec.Forbidden):
            await s.tokens.create(team, ttl_s=3600)  # outlives its issuer
        agent = (await s.tokens.create(team))["token"]
    status, body = http(server, "GET", "/v1/projects", agent)
    assert status == 200 and [p["name"] for p in body["projects"]] == [team]
    # A solver sees itself and what it issued; the one no other issued is itself.
    status, body = http(server, "GET", "/v1/tokens", solver)
    seen = body["tokens"]
    assert status == 200 and len(seen) == 2 and all("token" not in t for t in seen)
    issued = {t["id"] for t in seen if t["issuer"] in {u["id"] for u in seen}}
    solver_id = next(t["id"] for t in seen if t["id"] not in issued)
    await admin.tokens.revoke(solver_id)
    for token in (solver, agent):  # revoking a token revokes what it issued
        status, body = http(server, "GET", "/v1/projects", token)
        assert (status, body["error"]["code"]) == (401, "unauthorized")
    short = (await admin.tokens.create(team, ttl_s=1))["token"]
    await asyncio.sleep(1.5)
    status, body = http(server, "GET", "/v1/sandboxes", short)
    assert (status, body["error"]["code"]) == (401, "unauthorized")


def test_the_cli_manages_projects_and_tokens(server: Server) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    admin = server.admin_token
    r = cli(server, admin, "project", "create", name, "--quota", "sandboxes=20,cpu=16,memory=64GiB,disk=1TiB")
    assert r.returncode == 0, r.stderr
    r = cli(server, admin, "project", "create", f"{name}/exp-42", "--quota",
            "sandboxes=10,cpu=8,memory=2GiB,creations_per_s=20,fncall_per_s=50")
    assert r.returncode == 0, r.stderr
    r = cli(server, admin, "project", "create", f"{name}/exp-43", "--quota", "sandboxes=11")
    assert r.returncode != 0 and "not handed out" in r.stderr, r.stderr
    r = cli(server, admin, "project", "show", f"{name}/exp-42")
    assert r.returncode == 0 and "creations_per_s" in r.stdout and "2048" in r.stdout, r.stdout
    r = cli(server, admin, "token", "create", f"{name}/exp-42", "--role", "solver", "--ttl", "24h")
    assert r.returncode == 0, r.stderr
    secret = r.stdout.strip()
    assert secret.startswith("dsec_") and secret not in r.stderr
    r = cli(server, secret, "project", "ls")
    assert r.returncode == 0 and f"{name}/exp-42" in r.stdout, r.stdout + r.stderr
    r = cli(server, admin, "token", "ls")
    assert r.returncode == 0 and secret not in r.stdout
    token_id = next(line.split()[0] for line in r.stdout.splitlines()
                    if f"{name}/exp-42" in line and "solver" in line)
    r = cli(server, admin, "token", "revoke", token_id)
    assert r.returncode == 0, r.stderr
    r = cli(server, secret, "project", "ls")
    assert r.returncode != 0 and "unauthorized" in (r.stderr + r.stdout).lower()
    r = cli(server, admin, "project", "rm", name)
    assert r.returncode != 0 and "sub-projects" in r.stderr
    r = cli(server, admin, "project", "rm", f"{name}/exp-42", name)
    assert r.returncode == 0, r.stderr


async def test_a_build_holds_its_sandbox_against_the_projects_quota(
        server: Server, admin: DSecClient, team: str, image: str, tmp_path: Path) -> None:
    """A build runs its steps in sandboxes of the caller's project: one
    sandbox of its step limits is held for as long as it runs, a build that
    does not fit is refused before it starts, and the hold is given back
    when it ends."""
    await admin.projects.create(f"{team}/build", {"sandboxes": 1, "memory_mb": 600})
    token = (await admin.tokens.create(f"{team}/build", role="builder"))["token"]
    (tmp_path / "Dockerfile").write_text(f"FROM {image}\nRUN sleep 4 && echo {uuid.uuid4().hex} > /built\n")
    name = f"quota-build-{uuid.uuid4().hex[:8]}:1"
    async with DSecClient(server.url, token) as builder:
        with pytest.raises(dsec.QuotaExceeded, match="memory_mb"):
            await builder.build_image(name, tmp_path, memory_mb=1024)
        build = asyncio.create_task(builder.build_image(name, tmp_path, memory_mb=256))
        try:
            # Once its step runs, the project's one sandbox is the build's.
            for _ in range(200):
                if any("dsec.build" in s.labels for s in await admin.list(project=f"{team}/build")):
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the build's step sandbox never showed")
            with pytest.raises(dsec.QuotaExceeded, match="sandboxes"):
                await builder.run_container(run_args(image, memory_limit_mb=128), timeout=60)
            await build
            # The build is over: its hold is given back at once.
            sb = await builder.run_container(run_args(image, memory_limit_mb=128), timeout=120)
            await sb.delete()
        finally:
            build.cancel()
            with contextlib.suppress(asyncio.CancelledError, dsec.DSecError):
                await build
            with contextlib.suppress(dsec.ImageNotFound):
                await admin.delete_image(name)
            drop_build_cache(server)
