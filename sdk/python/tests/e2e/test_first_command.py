"""A first command carried in the creation request, against the real server."""

from __future__ import annotations

import secrets

import pytest

import dsec
from dsec import DSecClient

from .conftest import run_args

pytestmark = pytest.mark.e2e


async def test_first_command_shell_and_argv(client: DSecClient, image: str) -> None:
    async with await client.run_container(run_args(image),
                                          first_command="echo hi; id -u") as sb:
        assert sb.state == "running"
        r = sb.first_result
        assert r is not None and r.exit_code == 0, r
        assert r.stdout == "hi\n0\n"
        # The sandbox is an ordinary one afterwards.
        assert (await sb.run_shell("echo again")).stdout == "again\n"
    async with await client.run_container(run_args(image),
                                          first_command=["sh", "-c", "exit 3"]) as sb:
        assert sb.first_result is not None
        assert sb.first_result.exit_code == 3
    async with await client.run_container(run_args(image)) as sb:
        assert sb.first_result is None


async def test_first_command_that_cannot_run_leaves_no_sandbox(client: DSecClient,
                                                              image: str) -> None:
    tag = secrets.token_hex(4)
    t = client._transport
    body = run_args(image, labels={"suite": "sdk-e2e", "first": tag}).to_json()
    body["first_exec"] = {"cmd": "true", "user": "no-such-user-here"}
    with pytest.raises(dsec.UserNotFound):
        await t.request("POST", t.url("/v1/sandboxes"), json_body=body, timeout=t.timeout_for(120))
    assert await client.list(labels={"first": tag}) == []


async def test_first_command_bad_input_creates_nothing(client: DSecClient, image: str) -> None:
    tag = secrets.token_hex(4)
    t = client._transport
    body = run_args(image, labels={"suite": "sdk-e2e", "first": tag}).to_json()
    body["first_exec"] = {"argv": []}
    with pytest.raises(dsec.InvalidRequest, match="argv"):
        await t.request("POST", t.url("/v1/sandboxes"), json_body=body, timeout=t.timeout_for(120))
    body["first_exec"] = {"cmd": "true"}
    with pytest.raises(dsec.InvalidRequest, match="Idempotency-Key"):
        await t.request("POST", t.url("/v1/sandboxes"), json_body=body,
                        headers={"idempotency-key": f"k-{tag}"}, timeout=t.timeout_for(120))
    assert await client.list(labels={"first": tag}) == []
    with pytest.raises(ValueError, match="idempotency_key"):
        await client.run_container(run_args(image), first_command="true",
                                   idempotency_key=f"k-{tag}")
    with pytest.raises(ValueError, match="empty"):
        await client.run_container(run_args(image), first_command=[])
