"""Harbor on dsec: ``dsec.integrations.harbor.DsecEnvironment`` with the real
``harbor`` package (pinned in the SDK's ``harbor`` extra), driven by Harbor's
own ``harbor run`` command: the oracle earns reward 1 on a Harbor-format
task, an agent that does nothing earns 0, and no sandbox is left.

Harbor needs Python 3.12+, so it runs from a venv of its own that
``DSEC_TEST_HARBOR_VENV`` names (made ahead by ``scripts/harbor-venv.sh``,
which scripts/test.sh runs). ``harbor_checks.py`` runs in that venv and
checks the environment's contract piece by piece."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsec import DSecClient

from .conftest import Server, Tenant, _create_tenant, drop_build_cache, serve_dsec

HERE = Path(__file__).parent
TASK = HERE / "harbor_tasks" / "answer"
ENVIRONMENT = "dsec.integrations.harbor:DsecEnvironment"


@pytest.fixture(scope="module")
def venv() -> Path:
    given = os.environ.get("DSEC_TEST_HARBOR_VENV")
    if not given:
        # Tests reach only loopback: the venv is made ahead, with the other
        # test dependencies (scripts/test.sh does it).
        pytest.fail("set DSEC_TEST_HARBOR_VENV to a venv made by scripts/harbor-venv.sh DIR",
                    pytrace=False)
    if not (Path(given) / "bin" / "harbor").exists():
        pytest.fail(f"DSEC_TEST_HARBOR_VENV={given} has no harbor command", pytrace=False)
    return Path(given)


def _checks(venv: Path, server: Server, token: str, *extra: str) -> None:
    r = subprocess.run([str(venv / "bin" / "python"), str(HERE / "harbor_checks.py"), server.url,
                        token, str(TASK), *extra],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    assert "harbor checks passed" in r.stdout


def _harbor_run(venv: Path, server: Server, token: str, agent: str, jobs: Path,
                task: Path = TASK) -> dict:
    """``harbor run`` of ``task`` with ``agent``; its one trial's result."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSEC_")}
    env["HOME"] = str(jobs)  # Harbor's caches and settings stay in the test's dir
    r = subprocess.run(
        [str(venv / "bin" / "harbor"), "run", "-p", str(task), "-a", agent, "-e", ENVIRONMENT,
         "--ek", f"endpoint={server.url}", "--ek", f"token={token}", "-o", str(jobs),
         "--job-name", agent, "-n", "1", "-y", "-q"],
        capture_output=True, text=True, timeout=900, env=env, cwd=jobs)
    results = [json.loads(p.read_text()) for p in (jobs / agent).glob("*/result.json")]
    assert r.returncode == 0 and len(results) == 1, (
        f"harbor run -a {agent}: exit {r.returncode}, {len(results)} trial results\n"
        f"{r.stdout[-3000:]}\n{r.stderr[-6000:]}")
    return results[0]


def _reward(trial: dict) -> float | None:
    verifier = trial.get("verifier_result") or {}
    return (verifier.get("rewards") or {}).get("reward")


async def test_harbor_run_scores_the_oracle_and_an_idle_agent(venv: Path, server: Server,
                                                              tenant: Tenant,
                                                              tmp_path: Path) -> None:
    oracle = _harbor_run(venv, server, tenant.token, "oracle", tmp_path)
    assert oracle.get("exception_info") is None, oracle.get("exception_info")
    assert _reward(oracle) == 1, json.dumps(oracle, indent=1)[:4000]
    nop = _harbor_run(venv, server, tenant.token, "nop", tmp_path)
    assert nop.get("exception_info") is None, nop.get("exception_info")
    assert _reward(nop) == 0, json.dumps(nop, indent=1)[:4000]
    # Harbor deletes its environments: nothing of either trial is left.
    async with DSecClient(server.url, tenant.token) as c:
        left = [s for s in await c.list() if "harbor-task" in s.labels]
    assert left == [], left


def test_the_environment_contract(venv: Path, server: Server, tenant: Tenant) -> None:
    _checks(venv, server, tenant.token)


@pytest.fixture(scope="module")
def net_server() -> Iterator[Server]:
    """A `dsec up` with a network configuration (no services: the checks
    change rules, they reach nothing)."""
    cfg_dir = Path(tempfile.mkdtemp(prefix="dsec-harbor-net-"))
    cfg = cfg_dir / "network.json"
    cfg.write_text(json.dumps({"subnet": f"10.{random.randrange(150, 199)}.0.0/16",
                               "forward": False, "services": {}}))
    gen = serve_dsec(["--no-fncall", "--network-config", str(cfg)],
                     node=f"harbor-{uuid.uuid4().hex[:8]}")
    try:
        yield next(gen)
    finally:
        gen.close()
        shutil.rmtree(cfg_dir, ignore_errors=True)


def test_the_network_modes(venv: Path, net_server: Server) -> None:
    tenant = _create_tenant(net_server, "harbor-net")
    _checks(venv, net_server, tenant.token, "--network")


async def test_a_task_with_a_dockerfile_is_built_then_scored(venv: Path, server: Server,
                                                             tenant: Tenant, tmp_path: Path) -> None:
    """A task that names no image but ships environment/Dockerfile: dsec
    builds it (Harbor's Docker environment would too), then the trial runs
    in a sandbox of the built image."""
    task = tmp_path / "answer-built"
    shutil.copytree(TASK, task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('docker_image = "python"\n', ""))
    (task / "environment" / "Dockerfile").write_text(
        f"FROM python\nWORKDIR /app\nCOPY README /app/README\nRUN echo {uuid.uuid4().hex} > /app/built.txt\n")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    oracle = _harbor_run(venv, server, tenant.token, "oracle", jobs, task)
    assert oracle.get("exception_info") is None, oracle.get("exception_info")
    assert _reward(oracle) == 1, json.dumps(oracle, indent=1)[:4000]
    async with DSecClient(server.url, server.admin_token) as admin:
        built = [i.name for i in await admin.images() if i.name.startswith("harbor/") and "answer-built" in i.name]
        assert len(built) == 1, built
        await admin.delete_image(built[0])
    drop_build_cache(server)
