"""Dockerfile builds on a real node: the shapes task environments ship
(useradd, WORKDIR, COPY of a tests directory, ARG and ENV, USER), the step
cache (an unchanged rebuild runs nothing, a change rebuilds from the step
it touches), multi-stage builds and `FROM scratch`, ADD of a local archive,
a failing and a cancelled build (a clear error, no sandbox left), bad input,
and the CLI."""

from __future__ import annotations

import asyncio
import functools
import http.server
import io
import json
import os
import subprocess
import tarfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsec import BuildFailed, DSecClient, InvalidRequest

from .conftest import DSEC, Server, Tenant, _http, drop_build_cache, dsec_image, run_args

TASK_DOCKERFILE = """\
# A task environment of the usual shape.
FROM python
ARG GREETING=hello
ENV APP_HOME=/app \\
    GREETING=${GREETING}
RUN useradd -m -u 1234 agent
WORKDIR $APP_HOME
COPY --chown=agent:agent src/ ./src/
COPY tests /tests
COPY ["notes.txt", "/etc/notes.txt"]
RUN python3 -c "import pathlib; pathlib.Path('built.txt').write_text('$GREETING')" \\
    && chown agent built.txt
USER agent
RUN echo "ran as $(id -un) in $(pwd)" > /home/agent/whoami
LABEL org.example.task="demo task" version=1
EXPOSE 8000
HEALTHCHECK --interval=5s CMD python3 -c "print(1)"
ENTRYPOINT ["python3"]
CMD ["-m", "http.server"]
"""


@pytest.fixture(scope="module")
def names(server: Server) -> Iterator[list[str]]:
    """Image names the tests build; removed (with the step cache) after."""
    made: list[str] = []
    yield made
    if made:
        dsec_image(server, "rm", *made)
    drop_build_cache(server)


def _name(names: list[str]) -> str:
    n = f"e2e-build-{uuid.uuid4().hex[:8]}:1"
    names.append(n)
    return n


def _context(root: Path, files: dict[str, str]) -> Path:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    return root


def _task_context(root: Path) -> Path:
    return _context(root, {
        "Dockerfile": TASK_DOCKERFILE,
        ".dockerignore": "**/*.pyc\nsecret.txt\n",
        # Unique per run: the step cache outlives a test session.
        "src/main.py": f"print('main')  # {uuid.uuid4().hex}\n",
        "src/cache.pyc": "compiled",
        "tests/test_outputs.py": "def test_ok():\n    assert True\n",
        "notes.txt": "notes\n",
        "secret.txt": "do not ship\n",
    })


async def _build_sandboxes(client: DSecClient) -> list[tuple[str, str, str]]:
    return [(s.id, s.state, s.labels["dsec.build"]) for s in await client.list()
            if "dsec.build" in s.labels and s.state not in ("stopped", "failed")]


async def _sh(sb, cmd: str) -> str:
    r = await sb.run_shell(cmd)
    assert r.exit_code == 0, (cmd, r)
    return r.stdout.strip()


async def test_a_task_dockerfile_builds_and_its_image_runs(client: DSecClient, server: Server,
                                                           names: list[str], tmp_path: Path) -> None:
    ctx = _task_context(tmp_path)
    name = _name(names)
    events: list[dict] = []
    result = await client.build_image(name, ctx, build_args={"GREETING": "bonjour"}, on_progress=events.append)
    print([(e["step"], round(e["ms"])) for e in events if e["type"] == "step_done"])
    assert result.image == name and result.steps == 16 and result.cached_steps <= 16
    steps = [e for e in events if e["type"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 17))
    assert steps[3]["text"].startswith("RUN useradd") and steps[3]["line"] == 6

    # No init_user: the image's USER is the sandbox's default user.
    sb = await client.run_container(run_args(name, memory_limit_mb=256, init_user=None), timeout=60)
    try:
        assert await _sh(sb, "cat /app/built.txt") == "bonjour"
        assert await _sh(sb, "cat /home/agent/whoami") == "ran as agent in /app"
        assert await _sh(sb, "stat -c %U:%G /app/src /app/src/main.py") == "agent:agent\nagent:agent"
        assert await _sh(sb, "stat -c %U /app /etc/notes.txt /tests/test_outputs.py") == "root\nroot\nroot"
        assert await _sh(sb, "cat /etc/notes.txt") == "notes"
        assert await _sh(sb, "ls /app/src") == "main.py"  # .dockerignore left cache.pyc out
        assert await _sh(sb, "find / -xdev -name secret.txt | wc -l") == "0"
        # The image's USER, WORKDIR and ENV are the sandbox's defaults.
        assert await _sh(sb, "id -un; pwd; echo $GREETING $APP_HOME") == "agent\n/app\nbonjour /app"
    finally:
        await sb.stop()

    manifest = json.loads(dsec_image(server, "inspect", name).stdout)["manifest"]
    config = manifest["config"]
    assert config["user"] == "agent" and config["workdir"] == "/app"
    assert "GREETING=bonjour" in config["env"] and not any(e.startswith("ARG") for e in config["env"])
    assert config["entrypoint"] == ["python3"] and config["cmd"] == ["-m", "http.server"]
    assert config["labels"] == {"org.example.task": "demo task", "version": "1"}
    assert config["exposed_ports"] == ["8000/tcp"]
    assert config["healthcheck"]["test"] == ["CMD-SHELL", 'python3 -c "print(1)"']
    assert config["healthcheck"]["interval_ns"] == 5_000_000_000
    assert manifest["provenance"]["base_image"] == "python"
    # The step cache is no image of anyone's.
    assert not any(i.name.startswith("build-cache/") for i in await client.images())
    assert await _build_sandboxes(client) == []


async def test_an_unchanged_rebuild_runs_nothing_and_a_change_rebuilds_from_its_step(
        client: DSecClient, names: list[str], tmp_path: Path) -> None:
    ctx = _task_context(tmp_path)
    first = await client.build_image(_name(names), ctx, build_args={"GREETING": "salut"})
    again = await client.build_image(_name(names), ctx, build_args={"GREETING": "salut"})
    assert again.cached_steps == again.steps, again
    assert again.ms < first.ms
    # A changed source file: everything before its COPY comes from the cache.
    (ctx / "src" / "main.py").write_text(f"print('changed')  # {uuid.uuid4().hex}\n")
    events: list[dict] = []
    changed = await client.build_image(_name(names), ctx, build_args={"GREETING": "salut"}, on_progress=events.append)
    cached = {e["step"]: e["cached"] for e in events if e["type"] == "step_done"}
    assert all(cached[s] for s in range(1, 6)), cached  # up to WORKDIR
    assert not cached[6] and not cached[9], cached  # the COPY of src/ and the RUN after it
    assert changed.cached_steps < changed.steps
    # A different build argument changes the RUN that uses it.
    other = await client.build_image(_name(names), ctx, build_args={"GREETING": "hej"})
    assert other.cached_steps < other.steps


async def test_multi_stage_builds_copy_between_stages_and_skip_unused_ones(
        client: DSecClient, names: list[str], tmp_path: Path) -> None:
    ctx = _context(tmp_path, {
        "Dockerfile": """\
FROM python AS builder
RUN mkdir -p /out && printf '#!/bin/sh\\necho built tool\\n' > /out/tool && chmod 755 /out/tool
FROM python AS unused
RUN exit 1
FROM busybox
COPY --from=builder /out/tool /usr/local/bin/
COPY --from=0 /out /opt/out
""",
    })
    name = _name(names)
    result = await client.build_image(name, ctx)
    assert result.steps == 5  # two FROMs, one RUN, two COPYs: the unused stage never ran
    sb = await client.run_container(run_args(name, memory_limit_mb=64), timeout=60)
    try:
        assert await _sh(sb, "/usr/local/bin/tool") == "built tool"
        assert await _sh(sb, "ls /opt/out") == "tool"
    finally:
        await sb.stop()
    # `--target` builds a stage itself.
    with pytest.raises(BuildFailed, match="exited with status 1"):
        await client.build_image(_name(names), ctx, target="unused")


async def test_from_scratch_and_add_of_a_local_archive(client: DSecClient, names: list[str], tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"from the archive\n"
        info = tarfile.TarInfo("pkg/data.txt")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    (tmp_path / "bundle.tar.gz").write_bytes(buf.getvalue())
    # ADD of a URL: the edge downloads it (here from a server on loopback).
    served = tmp_path / "served"
    served.mkdir()
    (served / "remote.txt").write_text("fetched\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/remote.txt"
    _context(tmp_path, {"Dockerfile": f"FROM scratch\nADD bundle.tar.gz /srv/\nCOPY hello.txt /\nADD {url} /srv/\n",
                        "hello.txt": "hi\n"})
    name = _name(names)
    try:
        await client.build_image(name, tmp_path)
    finally:
        httpd.shutdown()
        httpd.server_close()
    # No shell in the image: the agent reads the files.
    sb = await client.run_container(run_args(name, memory_limit_mb=64), timeout=60)
    try:
        assert await sb.read_file("/srv/pkg/data.txt") == b"from the archive\n"
        assert await sb.read_file("/hello.txt") == b"hi\n"
        assert await sb.read_file("/srv/remote.txt") == b"fetched\n"
        assert (await sb.stat("/srv/remote.txt")).mode & 0o777 == 0o600
    finally:
        await sb.stop()


async def test_a_failing_step_is_a_clear_error_and_leaves_nothing(client: DSecClient, names: list[str],
                                                                    tmp_path: Path) -> None:
    _context(tmp_path, {"Dockerfile": f"FROM python\nRUN echo fine\nRUN echo oops >&2; exit 3 # {uuid.uuid4().hex}\nRUN echo never\n"})
    name = _name(names)
    with pytest.raises(BuildFailed) as e:
        await client.build_image(name, tmp_path)
    msg = str(e.value)
    assert "line 3" in msg and "exited with status 3" in msg and "oops" in msg, msg
    assert name not in [i.name for i in await client.images()]
    for _ in range(50):
        if not await _build_sandboxes(client):
            break
        await asyncio.sleep(0.1)
    assert await _build_sandboxes(client) == []


async def test_a_cancelled_build_deletes_its_sandbox(client: DSecClient, names: list[str], tmp_path: Path) -> None:
    _context(tmp_path, {"Dockerfile": f"FROM python\nRUN sleep 120 # {uuid.uuid4().hex}\n"})
    running = asyncio.Event()

    def progress(e: dict) -> None:
        if e["type"] == "step" and e["text"].startswith("RUN"):
            running.set()

    task = asyncio.create_task(client.build_image(_name(names), tmp_path, on_progress=progress))
    await asyncio.wait_for(running.wait(), 60)
    for _ in range(100):
        if await _build_sandboxes(client):
            break
        await asyncio.sleep(0.1)
    assert await _build_sandboxes(client), "the RUN step's sandbox never showed"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if not await _build_sandboxes(client):
            break
        await asyncio.sleep(0.1)
    assert await _build_sandboxes(client) == []


async def test_bad_input_is_refused_clearly(client: DSecClient, server: Server, tenant: Tenant,
                                            names: list[str], tmp_path: Path) -> None:
    _context(tmp_path, {"Dockerfile": "FROM python\nCOPY missing.txt /x\n"})
    with pytest.raises(InvalidRequest, match="missing.txt"):
        await client.build_image(_name(names), tmp_path)
    (tmp_path / "Dockerfile").write_text("FROM python\nFROBNICATE now\n")
    with pytest.raises(InvalidRequest, match="line 2"):
        await client.build_image(_name(names), tmp_path)
    with pytest.raises(InvalidRequest, match="Dockerfile"):
        await client.build_image(_name(names), tmp_path, dockerfile="nope/Dockerfile")
    (tmp_path / "Dockerfile").write_text("FROM python\n")
    with pytest.raises(InvalidRequest, match="build-cache"):
        await client.build_image("build-cache/mine:1", tmp_path)
    status, raw = _http("POST", server.url + "/v1/images/build?name=x", tenant.token, None)
    assert status == 400, raw


def test_the_cli_builds_with_progress(server: Server, tenant: Tenant, names: list[str], tmp_path: Path) -> None:
    ctx = _context(tmp_path / "ctx", {"app.txt": "app\n"})
    dockerfile = _context(tmp_path / "elsewhere", {"Build.dockerfile": "FROM busybox\nCOPY app.txt /srv/\nRUN cat /srv/app.txt\n"})
    name = _name(names)
    env = {**os.environ, "DSEC_ENDPOINT": server.url, "DSEC_TOKEN": tenant.token}
    r = subprocess.run([str(DSEC), "image", "build", name, "-f", str(dockerfile / "Build.dockerfile"), str(ctx)],
                       capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert f"built {name}" in r.stdout and "3 steps" in r.stdout, r.stdout
