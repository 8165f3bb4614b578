"""The Harbor environment's contract, checked against a real dsec server.

Run by ``test_harbor.py`` with the Python of a Harbor venv (Harbor needs
Python 3.12+, the test suite's own Python is older):
``python harbor_checks.py ENDPOINT TOKEN TASK_DIR [--network]``. Exits 0
when every check holds; an assertion error names the one that did not.
With ``--network`` the server has a network configuration and the checks
are those of the task's network modes.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
from pathlib import Path

from harbor.environments.base import HealthcheckError
from harbor.models.task.config import (
    EnvironmentConfig,
    HealthcheckConfig,
    NetworkMode,
    NetworkPolicy,
)
from harbor.models.trial.paths import TrialPaths

from dsec import DSecClient, SandboxNotFound
from dsec.integrations.harbor import DsecEnvironment, network_rules_for


def _paths(trial: Path) -> TrialPaths:
    paths = TrialPaths(trial)
    paths.mkdir()
    return paths


def environment(endpoint: str, token: str, task: Path, trial: Path, **config: object) -> DsecEnvironment:
    policy = config.pop("network_policy", None)
    phases = config.pop("phase_network_policies", None)
    return DsecEnvironment(
        environment_dir=task / "environment",
        environment_name="answer",
        session_id=f"answer__{trial.name}__env",
        trial_paths=_paths(trial),
        task_env_config=EnvironmentConfig(**config),
        logger=logging.getLogger("harbor-checks"),
        network_policy=policy,
        phase_network_policies=phases,
        endpoint=endpoint,
        token=token,
    )


async def interfaces(env: DsecEnvironment) -> list[str]:
    """The sandbox's network interfaces (its own network namespace's)."""
    r = await env.exec("tail -n +3 /proc/net/dev | cut -d: -f1")
    assert r.return_code == 0, r
    return sorted(line.strip() for line in (r.stdout or "").splitlines() if line.strip())


async def gone(endpoint: str, token: str, sandbox_id: str) -> bool:
    async with DSecClient(endpoint, token) as c:
        try:
            await c.get(sandbox_id)
        except SandboxNotFound:
            return True
    return False


async def commands_files_and_health(endpoint: str, token: str, task: Path, tmp: Path) -> None:
    env = environment(endpoint, token, task, tmp / "t1", docker_image="python", workdir="/app",
                      env={"TASK_VAR": "from-the-task"},
                      network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
                      healthcheck=HealthcheckConfig(command="test -f /app/README", interval_sec=0.2,
                                                    retries=2))
    await env.start(force_build=False)
    sb = env.sandbox.id
    try:
        # The task's workdir and environment; the environment dir uploaded.
        r = await env.exec("pwd; echo $TASK_VAR; cat README | head -1")
        assert r.return_code == 0, r
        lines = (r.stdout or "").splitlines()
        assert lines[:2] == ["/app", "from-the-task"], lines
        assert lines[2].startswith("The task's environment directory"), lines
        # cwd, env, exit codes, stderr.
        r = await env.exec("pwd; echo $X; echo oops >&2; exit 3", cwd="/tmp", env={"X": "per-exec"})
        assert (r.return_code, r.stdout, r.stderr) == (3, "/tmp\nper-exec\n", "oops\n"), r
        # Users: the image's default (root), a named user, a uid, and the
        # default user Harbor sets for a phase.
        assert (await env.exec("id -un")).stdout == "root\n"
        assert (await env.exec("id -un", user="nobody")).stdout == "nobody\n"
        assert (await env.exec("id -u", user=65534)).stdout == "65534\n"
        env.default_user = "nobody"
        assert (await env.exec("id -un")).stdout == "nobody\n"
        assert (await env.exec("id -un", user="root")).stdout == "root\n"
        env.default_user = None
        # A command past its time is an error, as on Docker.
        try:
            await env.exec("sleep 30", timeout_sec=1)
        except RuntimeError as e:
            assert "timed out" in str(e), e
        else:
            raise AssertionError("a command past its timeout returned")
        # Directories and files both ways; Harbor's own dirs exist.
        src = tmp / "tree"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "b.txt").write_text("nested\n")
        (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
        (src / "run.sh").chmod(0o755)
        await env.upload_dir(src, "/srv/in")
        assert (await env.exec("/srv/in/run.sh && cat /srv/in/sub/b.txt")).stdout == "ran\nnested\n"
        await env.upload_file(src / "sub" / "b.txt", "/srv/one/deep/b.txt")
        assert await env.is_dir("/srv/one/deep") and await env.is_file("/srv/one/deep/b.txt")
        assert not await env.is_dir("/srv/none") and not await env.is_file("/srv/in")
        await env.exec("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt")
        back = tmp / "back"
        await env.download_dir("/srv/in", back)
        assert (back / "sub" / "b.txt").read_text() == "nested\n"
        assert (back / "run.sh").stat().st_mode & 0o111
        await env.download_file("/logs/verifier/reward.txt", tmp / "x" / "y" / "reward.txt")
        assert (tmp / "x" / "y" / "reward.txt").read_text() == "1\n"
        # The task's healthcheck, passing and failing.
        await env.run_healthcheck()
        try:
            await env.run_healthcheck(HealthcheckConfig(command="false", interval_sec=0.1, retries=2))
        except HealthcheckError:
            pass
        else:
            raise AssertionError("a failing healthcheck passed")
        # No network: loopback only.
        assert await interfaces(env) == ["lo"]
    finally:
        await env.stop(delete=True)
    assert await gone(endpoint, token, sb), "stop(delete=True) left the sandbox"

    # Kept: paused, found by its labels, removable.
    env = environment(endpoint, token, task, tmp / "t2", docker_image="python",
                      network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    await env.start(force_build=False)
    sb = env.sandbox.id
    await env.stop(delete=False)
    async with DSecClient(endpoint, token) as c:
        kept = await c.get(sb)
        assert kept.state == "paused", kept
        assert kept.labels["harbor-task"] == "answer", kept.labels
        await c.sandbox(sb).delete()

    # A task without an image: a clear error before anything starts.
    try:
        environment(endpoint, token, task, tmp / "t3")
    except ValueError as e:
        assert "docker_image" in str(e), e
    else:
        raise AssertionError("a task without an image was accepted")
    # An image dsec does not have: the server's error, and nothing left.
    env = environment(endpoint, token, task, tmp / "t4", docker_image="no-such-image",
                      network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    try:
        await env.start(force_build=False)
    except Exception as e:  # noqa: BLE001 - the SDK's ImageNotFound
        assert "no-such-image" in str(e), e
    else:
        raise AssertionError("an unknown image started")


async def network_modes(endpoint: str, token: str, task: Path, tmp: Path) -> None:
    allow = NetworkPolicy(network_mode=NetworkMode.ALLOWLIST,
                          allowed_hosts=["files.example.org", "*.example.com", "198.18.0.7", "198.18.1.0/24"])
    assert network_rules_for(allow) == {"files.example.org": True, "*.example.com": True,
                                        "198.18.0.7": True, "198.18.1.0/24": True}
    # The agent's phase restricted, the verifier's public: one sandbox, its
    # rules changed between phases.
    env = environment(endpoint, token, task, tmp / "n1", docker_image="python", network_policy=allow,
                      phase_network_policies=[allow, NetworkPolicy(network_mode=NetworkMode.PUBLIC)])
    assert env._run_args().network_rules == network_rules_for(allow)
    await env.start(force_build=False)
    try:
        assert len(await interfaces(env)) > 1, "an allowlisted sandbox has a network"
        # Each change is the server's to accept (the public one with the
        # lone `*`, any name); the sandbox keeps running commands.
        await env.set_network_policy(NetworkPolicy(network_mode=NetworkMode.PUBLIC))
        await env.set_network_policy(NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
        assert (await env.exec("echo still")).stdout == "still\n"
    finally:
        await env.stop(delete=True)
    # IPv6 destinations cannot be allowed: refused before start.
    try:
        environment(endpoint, token, task, tmp / "n2", docker_image="python",
                    network_policy=NetworkPolicy(network_mode=NetworkMode.ALLOWLIST,
                                                 allowed_hosts=["2001:db8::1"]))
    except ValueError as e:
        assert "IPv4" in str(e) or "not supported" in str(e), e
    else:
        raise AssertionError("an IPv6 allowlist was accepted")


async def main() -> None:
    endpoint, token, task = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    with tempfile.TemporaryDirectory(prefix="harbor-checks-") as tmp:
        if "--network" in sys.argv[4:]:
            await network_modes(endpoint, token, task, Path(tmp))
        else:
            await commands_files_and_health(endpoint, token, task, Path(tmp))
    print("harbor checks passed")


if __name__ == "__main__":
    asyncio.run(main())
