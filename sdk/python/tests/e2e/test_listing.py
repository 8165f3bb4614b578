"""The paper's SDK listing, verbatim, against the real server."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import Server, Tenant

pytestmark = pytest.mark.e2e


async def test_paper_listing_verbatim(server: Server, tenant: Tenant, image: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSEC_ENDPOINT", server.url)
    monkeypatch.setenv("DSEC_TOKEN", tenant.token)
    monkeypatch.delenv("DSEC_TOKEN_FILE", raising=False)

    from dsec import DSecClient, DSecContainerRunArgs
    client = DSecClient()                      # endpoint and token from DSEC_ENDPOINT / DSEC_TOKEN
    await client.open()
    args = DSecContainerRunArgs(container_image="python", memory_limit_mb=1024,
                                cpu_cores_limit=1, ttl_running_stop=300,
                                network_rules={}, init_user="root")
    sandbox = await client.run_container(args, timeout=120)
    result = await sandbox.run_shell("echo hello world")
    assert result.exit_code == 0 and result.stdout == "hello world\n"
    await sandbox.stop()

    # Beyond the listing: the stopped record stays until deleted.
    info = await client.get(sandbox.id)
    assert info.state == "stopped"
    await sandbox.delete()
    await client.close()


async def test_token_from_file(server: Server, tenant: Tenant, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    from dsec import DSecClient

    token_file = tmp_path / "token"
    token_file.write_text(tenant.token + "\n")
    monkeypatch.delenv("DSEC_TOKEN", raising=False)
    monkeypatch.setenv("DSEC_TOKEN_FILE", str(token_file))
    async with DSecClient(server.url) as client:
        assert isinstance(await client.list(), list)
