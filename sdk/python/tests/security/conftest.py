"""The red-team suite's fixtures: one ``dsec up`` of its own for the whole
suite (started as the end-to-end tests start theirs), a sandbox per test
and a long-lived neighbour that every test checks is unaffected."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from dsec import DSecClient
from dsec.sandbox import Sandbox

# `tenant` and `client` are the end-to-end suite's, bound here to this
# suite's `server`.
from ..e2e.conftest import IMAGE, Server, client, run_args, serve_dsec, tenant

__all__ = ["IMAGE", "client", "run_args", "tenant"]


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """The suite's own server, with one small FnCall pool."""
    yield from serve_dsec(["--fncall-pools", "python=1:1"])


@pytest.fixture
async def sandbox(client: DSecClient) -> AsyncIterator[Sandbox]:
    """The attacker: a fresh sandbox per test (256 MiB, 64 pids, 64 MiB disk)."""
    sb = await client.run_container(run_args(IMAGE, memory_limit_mb=256, disk_limit_mb=64,
                                             pids_limit=64), timeout=120)
    try:
        yield sb
    finally:
        try:
            await sb.delete()
        except Exception:
            pass


@pytest.fixture
async def neighbour(client: DSecClient) -> AsyncIterator[tuple[Sandbox, str]]:
    """A bystander with a secret file; after the test it must still run,
    its file unchanged and its shell the image's."""
    sb = await client.run_container(run_args(IMAGE, memory_limit_mb=128), timeout=120)
    secret = uuid.uuid4().hex
    await sb.write_file("/root/secret", secret)
    before = (await sb.run_shell("sha256sum /bin/bash /usr/bin/python3")).stdout
    try:
        yield sb, secret
        r = await sb.run_shell("cat /root/secret; sha256sum /bin/bash /usr/bin/python3", timeout=30)
        assert r.exit_code == 0, r
        assert r.stdout == secret + before, "the neighbour was affected"
    finally:
        try:
            await sb.delete()
        except Exception:
            pass
