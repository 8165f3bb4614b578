"""SWE-ReX on dsec: ``dsec.integrations.swerex.DsecDeployment`` with the
real ``swe-rex`` package (pinned in the SDK's ``test`` extra), its
``RemoteRuntime`` unchanged, talking to ``swerex-remote`` inside a sandbox
through the port proxy. The sandbox has no outside network: swe-rex is
installed inside from the wheelhouse ``DSEC_TEST_SWEREX_WHEELS`` names (made
ahead by ``scripts/swerex-wheels.sh``, which scripts/test.sh runs)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from swerex.runtime.abstract import (
    BashAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)

from dsec import DSecClient, SandboxNotFound
from dsec.integrations.swerex import DsecDeployment

from .conftest import Server, Tenant, run_args

SWEREX = "swe-rex==1.4.0"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """swe-rex and its dependencies as wheels for the sandbox's Python
    (3.11 on x86-64 Debian), fetched ahead on the host."""
    given = os.environ.get("DSEC_TEST_SWEREX_WHEELS")
    if not given:
        # Tests reach only loopback: the wheels are fetched ahead, with the
        # other test dependencies (scripts/test.sh does it).
        pytest.fail("set DSEC_TEST_SWEREX_WHEELS to a wheelhouse made by "
                    "scripts/swerex-wheels.sh DIR", pytrace=False)
    if not any(Path(given).glob("swe_rex-*.whl")):
        pytest.fail(f"DSEC_TEST_SWEREX_WHEELS={given} holds no swe_rex wheel", pytrace=False)
    return Path(given)


@pytest.fixture
async def deployment(server: Server, tenant: Tenant, image: str,
                     wheelhouse: Path) -> AsyncIterator[DsecDeployment]:
    d = DsecDeployment(endpoint=server.url, token=tenant.token, wheelhouse=wheelhouse,
                       run_args=run_args(image, memory_limit_mb=1024), startup_timeout=300)
    await d.start()
    try:
        yield d
    finally:
        await d.stop()


async def test_remote_runtime_works_unchanged(deployment: DsecDeployment, tmp_path: Path,
                                              server: Server, tenant: Tenant) -> None:
    assert await deployment.is_alive()
    rt = deployment.runtime
    await rt.create_session(CreateBashSessionRequest())
    out = await rt.run_in_session(BashAction(command="cd /tmp && export GREETING=hi", check="raise"))
    assert out.exit_code == 0
    out = await rt.run_in_session(BashAction(command="echo $GREETING from $(pwd)"))
    assert out.output.strip() == "hi from /tmp"
    r = await rt.execute(Command(command=["python3", "-c", "print(6 * 7)"], timeout=60))
    assert (r.exit_code, r.stdout.strip()) == (0, "42")
    await rt.write_file(WriteFileRequest(path="/tmp/notes/a.txt", content="written\n"))
    assert (await rt.read_file(ReadFileRequest(path="/tmp/notes/a.txt"))).content == "written\n"
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "b.txt").write_text("uploaded\n")
    await rt.upload(UploadRequest(source_path=str(src), target_path="/tmp/up"))
    assert (await rt.read_file(ReadFileRequest(path="/tmp/up/sub/b.txt"))).content == "uploaded\n"
    await rt.close_session(CloseBashSessionRequest())
    sb_id = deployment.sandbox.id
    await deployment.stop()
    # The sandbox is gone with the deployment.
    async with DSecClient(server.url, tenant.token) as c:
        try:
            info = await c.get(sb_id)
        except SandboxNotFound:
            return
        assert info.state in ("stopped", "stopping"), info
