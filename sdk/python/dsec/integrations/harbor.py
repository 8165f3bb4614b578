"""A Harbor environment on dsec (``pip install 'dsec[harbor]'``, Python 3.12+).

``DsecEnvironment`` is Harbor's ``BaseEnvironment``: each trial's
environment is one dsec sandbox, created from the task's image, with the
task's CPU, memory and disk limits, its environment variables and its
network mode. Harbor's own agents, oracle and verifier then run in it
through ``exec`` and the file transfers, exactly as on Docker::

    harbor run -p ./my-task -a oracle \\
        -e dsec.integrations.harbor:DsecEnvironment \\
        --ek endpoint=http://127.0.0.1:8080 --ek token=$DSEC_TOKEN

``endpoint`` and ``token`` default to ``DSEC_ENDPOINT`` / ``DSEC_TOKEN``.
The task names its image with ``docker_image`` in ``task.toml`` (a dsec
image: ``python``, or one imported with ``dsec image pull``), or ``--ek
image=NAME`` names it for every task; a task with neither is built from its
``environment/Dockerfile`` by dsec (once: unchanged steps come from the
step cache). docs/integrations.md has the rest.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode, NetworkPolicy
from pydantic import Field

from ..args import DSecRunArgs
from ..client import DSecClient
from ..errors import FileNotFound, SandboxNotFound
from ..sandbox import Sandbox

__all__ = ["DsecEnvironment", "DsecEnvironmentOptions", "network_rules_for"]

#: The rule a sandbox with a network but no allowed destination carries:
#: it states "no internet" and keeps the network that a later phase's
#: policy (``set_network_policy``) changes.
NOTHING = {"0.0.0.0/0": False}
#: Every IPv4 destination and every name the node's resolver is asked.
EVERYTHING = {"0.0.0.0/0": True, "*": True}


class DsecEnvironmentOptions(EnvironmentOptions):
    """``--ek KEY=VALUE`` options of the dsec environment."""

    endpoint: str | None = Field(
        default=None, description="The dsec API (default: DSEC_ENDPOINT)."
    )
    token: str | None = Field(
        default=None, description="A dsec token (default: DSEC_TOKEN)."
    )
    image: str | None = Field(
        default=None,
        description="The dsec image for every task, in place of the task's docker_image.",
    )
    backend: str = Field(
        default="container",
        description="The dsec backend: container, microvm or vm.",
    )
    lifetime_sec: int = Field(
        default=24 * 3600,
        ge=1,
        description="The sandbox's hard lifetime: a trial whose harbor process "
        "dies leaves nothing behind past it.",
    )
    create_timeout_sec: float = Field(
        default=300.0, gt=0, description="Seconds to wait for the sandbox."
    )
    max_output_bytes: int = Field(
        default=16 << 20,
        ge=1,
        description="Output kept per stream of one command.",
    )


def network_rules_for(policy: NetworkPolicy) -> dict[str, bool]:
    """The dsec network rules that enforce Harbor's ``policy``.

    ``no-network`` allows nothing, ``allowlist`` exactly its hosts
    (hostnames, ``*.`` wildcards, IPv4 addresses and prefixes: dsec's own
    rule keys), ``public`` every destination.
    """
    if policy.network_mode == NetworkMode.NO_NETWORK:
        return dict(NOTHING)
    if policy.network_mode == NetworkMode.PUBLIC:
        return dict(EVERYTHING)
    rules = {host: True for host in policy.allowed_hosts}
    return rules or dict(NOTHING)


class DsecEnvironment(BaseEnvironment):
    """One Harbor trial environment as one dsec sandbox."""

    options_model = DsecEnvironmentOptions
    options: DsecEnvironmentOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._client: DSecClient | None = None
        # The image built from the task's Dockerfile, once built.
        self._built: str | None = None
        self._sandbox: Sandbox | None = None
        self._with_network = False
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "dsec"

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        # Limits, never reservations: a sandbox is capped at what it asks.
        return EnvironmentResourceCapabilities(
            cpu_limit=True, memory_limit=True, fractional_cpus=True
        )

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            dynamic_network_policy=True,
        )

    @property
    def sandbox(self) -> Sandbox:
        """The trial's sandbox (after :meth:`start`)."""
        if self._sandbox is None:
            raise RuntimeError("the dsec environment is not started")
        return self._sandbox

    # -- definition -----------------------------------------------------

    def _image(self) -> str | None:
        return self.options.image or self.task_env_config.docker_image or self._built

    def _dockerfile(self) -> Path | None:
        p = Path(self.environment_dir) / "Dockerfile"
        return p if p.is_file() else None

    def _validate_definition(self) -> None:
        if self._image() is None and self._dockerfile() is None:
            raise ValueError(
                f"task {self.environment_name}: the dsec environment starts from an "
                "image: give the task a docker_image in task.toml naming a dsec image "
                "(dsec image ls), an environment/Dockerfile, or --ek image=NAME"
            )
        if self.options.backend not in ("container", "microvm", "vm"):
            raise ValueError(
                f"backend {self.options.backend!r}: the dsec environment takes "
                "container, microvm or vm"
            )

    def _needs_network(self) -> bool:
        """Whether any phase may reach anything: only then does the sandbox
        get a network (rules), which needs a node with a network
        configuration; a task that is ``no-network`` throughout runs on any
        node, with loopback only."""
        return any(
            p.network_mode != NetworkMode.NO_NETWORK
            for p in (self._network_policy, *self._phase_network_policies)
        )

    def _run_args(self) -> DSecRunArgs:
        image = self._image()
        assert image is not None  # _validate_definition
        cpus = self._effective_cpus
        storage = self._effective_storage_mb
        return DSecRunArgs(
            backend=self.options.backend,
            image=image,
            cpu_cores_limit=float(cpus) if cpus is not None else None,
            memory_limit_mb=self._effective_memory_mb,
            disk_limit_mb=storage,
            max_lifetime_s=self.options.lifetime_sec,
            # Harbor bounds each step itself; an agent thinking for a long
            # time between commands must not find its sandbox gone.
            ttl_running_stop=0,
            network_rules=(
                network_rules_for(self._network_policy) if self._needs_network() else {}
            ),
            env=self._startup_env(),
            workdir=self.task_env_config.workdir,
            labels={
                "harbor-session": _label(self.session_id),
                "harbor-task": _label(self.environment_name),
            },
        )

    # -- lifecycle ------------------------------------------------------

    async def _build(self, client: DSecClient, force_build: bool) -> None:
        """Builds the task's environment/Dockerfile (when it names no image)
        into an image named for the task and its environment's content."""
        if self.options.image or self.task_env_config.docker_image or self._dockerfile() is None:
            if force_build:
                self.logger.debug("dsec runs the task's image as it is: nothing to build")
            return
        digest = hashlib.sha256()
        root = Path(self.environment_dir)
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
        task = re.sub(r"[^a-z0-9._-]+", "-", self.environment_name.lower()).strip("-._")[:64] or "task"
        name = f"harbor/{task}:{digest.hexdigest()[:16]}"
        result = await client.build_image(
            name, root, no_cache=force_build,
            on_progress=lambda e: self.logger.debug(f"dsec build: {e}") if e.get("type") == "step" else None,
        )
        self.logger.debug(f"dsec built {result.image} ({result.cached_steps} of {result.steps} steps cached)")
        self._built = result.image

    async def start(self, force_build: bool) -> None:
        client = DSecClient(self.options.endpoint, self.options.token)
        await client.open()
        self._client = client
        try:
            await self._build(client, force_build)
            args = self._run_args()
            self._with_network = bool(args.network_rules)
            self._sandbox = await client.run(args, timeout=self.options.create_timeout_sec)
            self.logger.debug(f"dsec sandbox {self._sandbox.id} started")
            if args.workdir:
                # As Docker does for a WORKDIR the image lacks.
                await self._sandbox.mkdir(args.workdir, parents=True)
            await self.ensure_dirs(self._mount_targets(writable_only=True))
            await self._upload_environment_dir_after_start()
        except BaseException:
            await self._teardown(delete=True)
            raise

    async def stop(self, delete: bool) -> None:
        await self._teardown(delete)

    async def _teardown(self, delete: bool) -> None:
        sandbox, self._sandbox = self._sandbox, None
        client, self._client = self._client, None
        try:
            if sandbox is not None:
                if delete:
                    try:
                        await sandbox.delete()
                    except SandboxNotFound:
                        pass
                else:
                    # Kept for inspection: paused (its memory swapped out),
                    # found again by its labels, gone at its lifetime.
                    await sandbox.pause()
                    self.logger.info(f"dsec sandbox {sandbox.id} kept (paused)")
        finally:
            if client is not None:
                await client.close()

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        if not self._with_network:
            if network_policy.network_mode == NetworkMode.NO_NETWORK:
                return
            raise ValueError(
                "the sandbox was started without a network (every phase Harbor "
                "announced was no-network): it cannot be given one now"
            )
        await self.sandbox.set_network_rules(network_rules_for(network_policy))

    # -- commands -------------------------------------------------------

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        user = self._resolve_user(user)
        result = await self.sandbox.run_shell(
            command,
            timeout=timeout_sec,
            env=self._merge_env(env),
            cwd=cwd or self.task_env_config.workdir,
            user=None if user is None else str(user),
            max_output_bytes=self.options.max_output_bytes,
        )
        if result.timed_out:
            # As Harbor's Docker environment reports a step past its time.
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(
            stdout=result.stdout, stderr=result.stderr, return_code=result.exit_code
        )

    # -- files ----------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self.sandbox.upload(source_path, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self.sandbox.upload(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        await self.sandbox.download(source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self.sandbox.download(source_dir, target_dir)

    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        if user is not None or self.default_user is not None:
            return await super().is_dir(path, user)
        try:
            return (await self.sandbox.stat(path)).is_dir
        except FileNotFound:
            return False

    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        if user is not None or self.default_user is not None:
            return await super().is_file(path, user)
        try:
            info = await self.sandbox.stat(path)
        except FileNotFound:
            return False
        return not info.is_dir

    async def attach(self) -> None:
        """A shell in the sandbox through the ``dsec`` command."""
        env = {**os.environ}
        if self.options.endpoint:
            env["DSEC_ENDPOINT"] = self.options.endpoint
        if self.options.token:
            env["DSEC_TOKEN"] = self.options.token
        os.execvpe("dsec", ["dsec", "shell", self.sandbox.id], env)


def _label(value: str) -> str:
    """A Harbor name as a label value (at most 255 characters)."""
    return value[:255]

