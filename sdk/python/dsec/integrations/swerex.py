"""A SWE-ReX deployment on dsec (``pip install 'dsec[swerex]'``).

``DsecDeployment`` is SWE-ReX's ``AbstractDeployment``: ``start()`` creates
a container sandbox, installs ``swe-rex`` inside from a local wheelhouse
when given one (sandboxes have no outside network by default), starts
``swerex-remote`` on a port of the sandbox's loopback and exposes that port
through the API as a signed base URL (``Sandbox.expose(port, base=True)``),
which SWE-ReX's unchanged ``RemoteRuntime`` talks to. ``stop()`` closes the
runtime and deletes the sandbox. docs/integrations.md has an example.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shlex
import time
from pathlib import Path
from typing import Any

from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import DeploymentNotStartedError
from swerex.runtime.abstract import IsAliveResponse
from swerex.runtime.remote import RemoteRuntime

from ..args import DSecContainerRunArgs
from ..client import DSecClient
from ..sandbox import Sandbox

__all__ = ["DsecDeployment"]

#: Where the wheelhouse goes and where swe-rex is installed inside.
WHEELS_DIR = "/tmp/dsec-swerex-wheels"
VENV_DIR = "/opt/dsec-swerex"
LOG_FILE = "/tmp/dsec-swerex.log"


class DsecDeployment(AbstractDeployment):
    """SWE-ReX's ``RemoteRuntime`` on a dsec sandbox.

    Args:
        endpoint, token: the dsec API (default ``DSEC_ENDPOINT`` /
            ``DSEC_TOKEN``, as :class:`dsec.DSecClient`).
        image: the sandbox's image (with python3), unless ``run_args`` says.
        run_args: the sandbox's full creation arguments.
        wheelhouse: a local directory of wheels holding ``swe-rex`` and its
            dependencies (``pip download swe-rex -d DIR``), uploaded and
            installed offline into a venv inside; without it the image must
            already have ``swerex-remote`` on its ``PATH``.
        port: the sandbox port ``swerex-remote`` listens on.
        startup_timeout: seconds for install and start until it answers.
        runtime_timeout: the ``RemoteRuntime``'s per-request timeout.
        url_ttl_s: how long the exposed URL stays valid (at most a week).
    """

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        token: str | None = None,
        image: str = "python",
        run_args: DSecContainerRunArgs | None = None,
        wheelhouse: str | Path | None = None,
        port: int = 8000,
        startup_timeout: float = 180.0,
        runtime_timeout: float = 60.0,
        url_ttl_s: int = 24 * 3600,
        logger: logging.Logger | None = None,
    ) -> None:
        self.logger = logger or logging.getLogger("dsec.integrations.swerex")
        self._endpoint, self._token = endpoint, token
        self._run_args = run_args or DSecContainerRunArgs(container_image=image, init_user="root")
        self._wheelhouse = Path(wheelhouse) if wheelhouse is not None else None
        self._port = int(port)
        self._startup_timeout = startup_timeout
        self._runtime_timeout = runtime_timeout
        self._url_ttl_s = url_ttl_s
        self._hooks = CombinedDeploymentHook()
        self._client: DSecClient | None = None
        self._sandbox: Sandbox | None = None
        self._runtime: RemoteRuntime | None = None

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    @property
    def sandbox(self) -> Sandbox:
        """The dsec sandbox the runtime runs in."""
        if self._sandbox is None:
            raise DeploymentNotStartedError()
        return self._sandbox

    @property
    def runtime(self) -> RemoteRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        if self._runtime is None or self._sandbox is None:
            raise DeploymentNotStartedError()
        return await self._runtime.is_alive(timeout=timeout)

    async def start(self, *args: Any, **kwargs: Any) -> None:
        if self._runtime is not None:
            self.logger.warning("Deployment is already started. Ignoring duplicate start() call.")
            return
        deadline = time.monotonic() + self._startup_timeout
        self._hooks.on_custom_step("Starting dsec sandbox")
        self._client = DSecClient(self._endpoint, self._token)
        try:
            self._sandbox = await self._client.run_container(self._run_args, timeout=self._startup_timeout)
            executable = await self._install(self._sandbox)
            self._hooks.on_custom_step("Starting runtime")
            auth = secrets.token_hex(16)
            cmd = (f"{shlex.quote(executable)} --host 127.0.0.1 --port {self._port} "
                   f"--auth-token {auth}")
            r = await self._sandbox.run_shell(f"(setsid {cmd} >{LOG_FILE} 2>&1 &)")
            if r.exit_code != 0:
                raise RuntimeError(f"starting swerex-remote failed: {r.stderr or r.stdout}")
            url = await self._sandbox.expose(self._port, ttl_s=self._url_ttl_s, base=True)
            self._runtime = RemoteRuntime(host=url, auth_token=auth, timeout=self._runtime_timeout,
                                          logger=self.logger)
            await self._wait_until_alive(deadline)
        except BaseException:
            await self.stop()
            raise

    async def _install(self, sb: Sandbox) -> str:
        """Installs swe-rex from the wheelhouse; the executable to run."""
        if self._wheelhouse is None:
            return "swerex-remote"
        wheels = sorted(self._wheelhouse.glob("*.whl"))
        if not any(w.name.startswith("swe_rex-") for w in wheels):
            raise ValueError(f"{self._wheelhouse} holds no swe_rex wheel (pip download swe-rex -d DIR)")
        self._hooks.on_custom_step("Installing swe-rex offline")
        for w in wheels:
            await sb.write_file(f"{WHEELS_DIR}/{w.name}", w.read_bytes())
        r = await sb.run_shell(
            f"python3 -m venv {VENV_DIR} && {VENV_DIR}/bin/pip install --quiet --no-index "
            f"--find-links {WHEELS_DIR} swe-rex", timeout=self._startup_timeout)
        if r.exit_code != 0:
            raise RuntimeError(f"installing swe-rex in the sandbox failed: {r.stderr or r.stdout}")
        return f"{VENV_DIR}/bin/swerex-remote"

    async def _wait_until_alive(self, deadline: float) -> None:
        assert self._runtime is not None and self._sandbox is not None
        last = ""
        while time.monotonic() < deadline:
            try:
                alive = await self._runtime.is_alive(timeout=10)
                if alive:
                    return
                last = alive.message
            except Exception as e:  # the port is not open yet: port_closed
                last = str(e)
            await asyncio.sleep(0.5)
        log = (await self._sandbox.run_shell(f"tail -n 30 {LOG_FILE}")).stdout
        raise TimeoutError(f"swerex-remote did not answer within {self._startup_timeout} s: {last}; "
                           f"its log:\n{log}")

    async def stop(self, *args: Any, **kwargs: Any) -> None:
        runtime, sandbox, client = self._runtime, self._sandbox, self._client
        self._runtime = self._sandbox = self._client = None
        try:
            if runtime is not None:
                await runtime.close()
        finally:
            try:
                if sandbox is not None:
                    await sandbox.delete()
            finally:
                if client is not None:
                    await client.close()
