"""pack_diff and fork on real sandboxes: a sandbox's changes become an image
(incrementally the second time, residue scrubbed, provenance recorded), new
sandboxes start from it, and fork starts many at once without the parent."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from dsec import DSecClient, IdempotencyConflict, InvalidRequest, SandboxEnded, SandboxNotRunning
from dsec.sandbox import Sandbox

from .conftest import Server, dsec_image, run_args

@pytest.fixture(scope="module")
def names(server: Server) -> Iterator[list[str]]:
    """Image names the tests write; removed (and their blobs collected) after."""
    made: list[str] = []
    yield made
    if made:
        dsec_image(server, "rm", *made)
        dsec_image(server, "gc")


def _name(names: list[str], tag: str) -> str:
    n = f"e2e-pack-{uuid.uuid4().hex[:8]}:{tag}"
    names.append(n)
    return n


@pytest.fixture
async def parent(client: DSecClient, image: str) -> AsyncIterator[Sandbox]:
    sb = await client.run_container(run_args(image, memory_limit_mb=128), timeout=60)
    try:
        yield sb
    finally:
        await sb.stop()


async def _sh(sb: Sandbox, cmd: str) -> str:
    r = await sb.run_shell(cmd)
    assert r.exit_code == 0, (cmd, r)
    return r.stdout


async def test_pack_then_pack_again_incrementally(client: DSecClient, parent: Sandbox,
                                                  server: Server, names: list[str]) -> None:
    await _sh(parent, "mkdir -p /root/project && echo one > /root/project/a.txt"
                      " && rm /etc/debian_version && echo junk > /tmp/junk"
                      " && echo 'cat secret' > /root/.bash_history")
    first = await parent.pack_diff(_name(names, "1"))
    assert not first.incremental and first.layers >= 2
    assert first.scrubbed >= 2, first  # /tmp/junk and the history
    assert first.frozen_ms < 5000

    child = await client.run_container(run_args(first.image, memory_limit_mb=64), timeout=60)
    try:
        out = await _sh(child, "cat /root/project/a.txt; test -e /etc/debian_version || echo gone;"
                               " test -e /tmp/junk || echo no-junk;"
                               " test -e /root/.bash_history || echo no-history")
        assert out == "one\ngone\nno-junk\nno-history\n"
    finally:
        await child.stop()

    # The parent kept running; more work, then an incremental pack.
    await _sh(parent, "echo two > /root/project/b.txt && rm /root/project/a.txt")
    second = await parent.pack_diff(_name(names, "2"))
    assert second.incremental and second.layers == first.layers + 1
    assert second.bytes == 4 and second.whiteouts == 1, second  # b.txt; a.txt gone

    # The image says who built it from what.
    inspect = dsec_image(server, "inspect", second.image)
    assert inspect.returncode == 0, inspect.stderr
    prov = json.loads(inspect.stdout)["manifest"]["provenance"]
    assert prov["sandbox"] == parent.id and prov["previous"] == first.image
    assert prov["built_by"]

    # fork from the image, after the parent is gone: three children at once.
    await parent.stop()
    kids = await client.fork(second.image, 3, run_args("unused", memory_limit_mb=64))
    try:
        assert len({k.id for k in kids}) == 3
        for k in kids:
            assert await _sh(k, "ls /root/project; cat /root/project/b.txt") == "b.txt\ntwo\n"
    finally:
        for k in kids:
            await k.stop()


async def test_fork_a_running_sandbox(client: DSecClient, parent: Sandbox,
                                      names: list[str]) -> None:
    await _sh(parent, "echo state > /root/state")
    name = _name(names, "fork")
    kids = await client.fork(parent, 2, name=name)
    try:
        await parent.stop()  # the children do not need it
        for k in kids:
            assert k.info.image == name
            assert await _sh(k, "cat /root/state") == "state\n"
            # Each child is its own sandbox.
            await _sh(k, f"echo {k.id} > /root/state")
        assert {await _sh(k, "cat /root/state") for k in kids} == {f"{k.id}\n" for k in kids}
    finally:
        for k in kids:
            await k.stop()


async def test_a_retried_pack_with_its_key_packs_once(parent: Sandbox, names: list[str]) -> None:
    await _sh(parent, "echo once > /root/once.txt")
    name, key = _name(names, "k"), uuid.uuid4().hex
    first = await parent.pack_diff(name, idempotency_key=key)
    assert first.created and first.bytes == 5, first
    # More changes, then the retry: the first report, nothing packed again.
    await _sh(parent, "echo later > /root/later.txt")
    again = await parent.pack_diff(name, idempotency_key=key)
    assert not again.created
    assert (again.image, again.layer, again.bytes, again.layers) == (first.image, first.layer, first.bytes, first.layers)
    # The same key for another pack is a conflict, not a silent replay.
    with pytest.raises(IdempotencyConflict):
        await parent.pack_diff(_name(names, "other"), idempotency_key=key)
    # Without a key, the next pack is incremental over the first.
    nxt = await parent.pack_diff(_name(names, "n"))
    assert nxt.created and nxt.incremental and nxt.bytes == 6, nxt


async def test_bad_packs_are_refused(client: DSecClient, parent: Sandbox,
                                     names: list[str]) -> None:
    with pytest.raises(InvalidRequest):
        await parent.pack_diff("Not A Name!")
    with pytest.raises(InvalidRequest):
        await parent.pack_diff(_name(names, "x"), scrub=["tmp/*"])
    with pytest.raises(ValueError):
        await client.fork(parent, 0)
    await parent.stop()
    with pytest.raises((SandboxEnded, SandboxNotRunning)):
        await parent.pack_diff(_name(names, "y"))
