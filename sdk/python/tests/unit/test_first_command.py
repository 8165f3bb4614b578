"""A first command carried in the creation request: the wire format, the
result, and what is refused before anything is sent."""

from __future__ import annotations

import pytest

import dsec
from dsec import DSecClient, DSecContainerRunArgs
from dsec import sync as dsync

from .fake_server import TOKEN, FakeDSec


def args() -> DSecContainerRunArgs:
    return DSecContainerRunArgs(container_image="python", memory_limit_mb=1024)


def creations(fake: FakeDSec) -> list[dict]:
    return [body for method, path, body in fake.requests
            if method == "POST" and path == "/v1/sandboxes"]


async def test_command_line_and_argv(fake: FakeDSec, client: DSecClient) -> None:
    sb = await client.run_container(args(), first_command="echo hi")
    assert sb.first_result is not None
    assert sb.first_result.stdout == "hi\n" and sb.first_result.ok
    sb2 = await client.run(args(), first_command=["exit", "3"])
    assert sb2.first_result is not None and sb2.first_result.exit_code == 3
    sb3 = await client.run_container(args())
    assert sb3.first_result is None
    bodies = creations(fake)
    assert bodies[0]["first_exec"] == {"cmd": "echo hi"}
    assert bodies[1]["first_exec"] == {"argv": ["exit", "3"]}
    assert "first_exec" not in bodies[2]
    # One request per creation, and none for the command.
    assert not [r for r in fake.requests if r[1].endswith("/exec")]


async def test_command_that_cannot_run_raises_and_leaves_nothing(
        fake: FakeDSec, client: DSecClient) -> None:
    with pytest.raises(dsec.AgentUnavailable):
        await client.run_container(args(), first_command="explode")
    assert fake.sandboxes == {}


async def test_refused_before_sending(fake: FakeDSec, client: DSecClient) -> None:
    with pytest.raises(ValueError, match="idempotency_key"):
        await client.run_container(args(), first_command="true", idempotency_key="k1")
    with pytest.raises(ValueError, match="empty"):
        await client.run_container(args(), first_command=[])
    with pytest.raises(TypeError):
        await client.run_container(args(), first_command=b"true")  # type: ignore[arg-type]
    assert creations(fake) == []


def test_sync_wrapper(fake: FakeDSec) -> None:
    with dsync.DSecClient(fake.url, TOKEN) as client:
        sb = client.run_container(args(), first_command="echo sync")
        assert sb.first_result is not None and sb.first_result.stdout == "sync\n"
        assert client.run(args()).first_result is None
