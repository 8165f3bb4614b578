"""E2B's control plane through the unmodified SDK: create, get, list,
kill, timeouts, pause, connect; sync and async clients."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException

from ..conftest import Server, Tenant

pytestmark = pytest.mark.e2e


def test_create_get_and_envs(image: str) -> None:
    s = Sandbox.create(
        template=image,
        timeout=90,
        metadata={"who": "create-test"},
        envs={"GREETING": "hello from e2b"},
    )
    try:
        info = s.get_info()
        assert info.sandbox_id == s.sandbox_id
        assert info.template_id == image
        assert info.metadata == {"who": "create-test"}, "the access token label stays hidden"
        assert info.state == SandboxState.RUNNING
        lifetime = (info.end_at - info.started_at).total_seconds()
        assert 89 <= lifetime <= 91, lifetime
        assert s.is_running()
        r = s.commands.run("echo $GREETING")
        assert (r.exit_code, r.stdout) == (0, "hello from e2b\n")
    finally:
        assert s.kill() is True
    assert not s.is_running(), "/health answers 502 once the sandbox is killed"
    assert Sandbox.kill(s.sandbox_id) is False, "killing an unknown id is a 404"
    with pytest.raises(NotFoundException):
        Sandbox.get_info(s.sandbox_id)


def test_v1_create_route(server: Server, tenant: Tenant, image: str) -> None:
    # Older SDKs create with POST /sandboxes and the `secure` flag.
    r = httpx.post(
        f"{server.url}/sandboxes",
        headers={"X-API-Key": tenant.token},
        json={"templateID": image, "timeout": 60, "secure": True},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["envdAccessToken"] and body["templateID"] == image
    s = Sandbox.connect(body["sandboxID"])
    try:
        assert s.commands.run("echo ok").stdout == "ok\n"
    finally:
        s.kill()


def test_control_plane_error_bodies(server: Server, tenant: Tenant) -> None:
    r = httpx.get(
        f"{server.url}/sandboxes/nonode.aaaaaaaaaaaa", headers={"X-API-Key": tenant.token}
    )
    assert r.status_code == 404 and r.json()["code"] == 404 and r.json()["message"]
    r = httpx.get(f"{server.url}/v2/sandboxes", headers={"X-API-Key": "wrong"})
    assert r.status_code == 401 and r.json()["code"] == 401
    r = httpx.post(
        f"{server.url}/v2/sandboxes",
        headers={"X-API-Key": tenant.token},
        json={"templateID": "no-such-image-here"},
    )
    assert r.status_code == 404 and "no-such-image-here" in r.json()["message"]


def test_list_filters_and_pages(image: str) -> None:
    tag = f"list-{time.monotonic_ns()}"
    made = [
        Sandbox.create(template=image, timeout=120, metadata={"batch": tag, "n": str(i)})
        for i in range(3)
    ]
    try:
        made[2].pause()
        query = SandboxQuery(metadata={"batch": tag})
        pager = Sandbox.list(query=query, limit=2, order="asc")
        first = pager.next_items()
        assert len(first) == 2 and pager.has_next
        second = pager.next_items()
        assert len(second) == 1 and not pager.has_next
        ids = [s.sandbox_id for s in first + second]
        assert ids == [m.sandbox_id for m in made], "oldest first, each once"
        desc = Sandbox.list(query=query, order="desc").next_items()
        assert [s.sandbox_id for s in desc] == ids[::-1]
        paused = Sandbox.list(
            query=SandboxQuery(metadata={"batch": tag}, state=[SandboxState.PAUSED])
        )
        assert [s.sandbox_id for s in paused.next_items()] == [made[2].sandbox_id]
        one = Sandbox.list(query=SandboxQuery(metadata={"batch": tag, "n": "1"})).next_items()
        assert [s.sandbox_id for s in one] == [made[1].sandbox_id]
        assert one[0].metadata == {"batch": tag, "n": "1"}
    finally:
        for m in made:
            m.kill()


def test_timeout_pause_connect(sbx: Sandbox) -> None:
    sbx.set_timeout(600)
    end = sbx.get_info().end_at
    left = end.timestamp() - time.time()
    assert 590 <= left <= 601, left
    sbx.commands.run("echo kept > /tmp/state")
    assert sbx.pause() is True
    assert sbx.get_info().state == SandboxState.PAUSED
    assert sbx.pause() is False, "a second pause is a 409"
    # Connecting resumes it, and a shorter timeout does not shorten its life.
    again = Sandbox.connect(sbx.sandbox_id, timeout=30)
    info = again.get_info()
    assert info.state == SandboxState.RUNNING
    assert abs(info.end_at.timestamp() - end.timestamp()) < 2
    assert again.commands.run("cat /tmp/state").stdout == "kept\n"
    # A longer one extends it.
    Sandbox.connect(sbx.sandbox_id, timeout=900)
    assert sbx.get_info().end_at.timestamp() - time.time() > 880


async def test_async_client(image: str) -> None:
    s = await AsyncSandbox.create(template=image, timeout=60, metadata={"client": "async"})
    try:
        r = await s.commands.run("echo async; exit 0")
        assert r.stdout == "async\n"
        h = await s.commands.run("sleep 30", background=True)
        assert h.pid in [p.pid for p in await s.commands.list()]
        assert await h.kill() is True
        info = await s.get_info()
        assert info.metadata == {"client": "async"}
        assert await s.is_running()
    finally:
        await s.kill()
    assert not await s.is_running()
