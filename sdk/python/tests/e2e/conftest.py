"""End-to-end fixtures: the real ``dsec`` server, started once per session.

Environment:

* ``DSEC_BIN``: the server binary (default ``<repo>/target/release/dsec``).
  A missing binary fails the tests with a message; nothing is skipped.
* ``DSEC_DATA_DIR``: a data directory already prepared with the default
  images (used as is, never deleted). Default: a new temporary directory.
* ``DSEC_TEST_IMAGES_DIR``: an image store prepared by ``dsec image setup``,
  passed as ``--images-dir`` (so a temporary data dir still has images).
* ``DSEC_E2E_IMAGE``: the image most tests run (default ``python``).
* ``DSEC_E2E_START_TIMEOUT``: seconds to wait for ``/healthz`` (default 180).

The server is started as ``dsec up --data-dir DIR --listen 127.0.0.1:PORT
--stop-sandboxes-on-exit`` (so nothing outlives the session); the admin token
is read from ``DIR/admin-token``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dsec import DSecClient, DSecContainerRunArgs
from dsec.sandbox import Sandbox

REPO = Path(__file__).resolve().parents[4]
IMAGE = os.environ.get("DSEC_E2E_IMAGE", "python")
MAX_UPLOAD_MB = 64
#: The session server's sandbox domain: the host `PORT-ID.SANDBOX_DOMAIN`
#: reaches a sandbox's port (tests/e2e/test_ports.py).
SANDBOX_DOMAIN = "sandboxes.test"
DSEC = Path(os.environ.get("DSEC_BIN") or REPO / "target" / "release" / "dsec")


@dataclass
class Server:
    """A running dsec server."""

    url: str
    admin_token: str
    data_dir: Path
    log: Path
    pid: int

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


@dataclass
class Proc:
    """A process a test started, with the file its output goes to."""

    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


@dataclass
class Tenant:
    """A tenant created for the session, with its own token."""

    name: str
    token: str


#: Size of the server's swap file (MiB).
SWAP_FILE_MB = 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(method: str, url: str, token: str | None = None, body: object = None,
          timeout: float = 10, ca: str | None = None) -> tuple[int, bytes]:
    """One request; ``ca``: the CA an https:// server's certificate must chain to."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        context = ssl.create_default_context(cafile=ca) if ca else None
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below path (a leftover mount must never be rm -rf'ed)."""
    root = str(path.resolve())
    try:
        with open("/proc/self/mounts") as f:
            points = [line.split()[1] for line in f]
    except OSError:
        return []
    return [p for p in points if p == root or p.startswith(root + "/")]


def _swapoff_under(path: Path) -> None:
    """Turn off any swap file under ``path``: a server that died without its
    clean shutdown leaves its swap file on, and host swap must never outlive
    the tests."""
    root = str(path.resolve())
    with open("/proc/swaps") as f:
        active = [line.split()[0] for line in f.read().splitlines()[1:] if line.strip()]
    for swap in active:
        if swap.startswith(root + "/"):
            subprocess.run(["swapoff", swap], check=False, timeout=120)
            Path(swap).unlink(missing_ok=True)


def _stop(pid: int, proc: subprocess.Popen[bytes], kill_group: bool = True) -> None:
    """Stop the server by its PID: SIGTERM for a clean shutdown, then SIGKILL
    for the process group it leads (started with a new session, so the group
    holds only the server and its children), unless its sandboxes must
    outlive it (``kill_group=False``: their agents are in that group too)."""
    if proc.poll() is None:
        os.kill(pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    if kill_group:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proc.poll() is None:
        proc.wait(timeout=10)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The caller's own settings must not leak into tests that rely on defaults.
    for name in ("DSEC_ENDPOINT", "DSEC_TOKEN", "DSEC_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """Start ``dsec up`` once for the whole e2e session."""
    # FnCall pools small enough that their runners' CPU reservations leave
    # test_pause's burst of 2,000 room in the node's admission.
    yield from serve_dsec(["--fncall-pools", "python=2:4,bash=1:2,c=0:2,cpp=1:2"])


def serve_dsec(extra_args: list[str], data_dir: Path | None = None, node: str | None = None,
               stop_sandboxes_on_exit: bool = True) -> Iterator[Server]:
    """Run a ``dsec up`` of its own (node, port, data dir) until the
    generator is closed; ``extra_args`` go to its command line.

    A restart is two of these in turn with the same ``data_dir`` (kept:
    the caller removes it) and ``node``, the first one without
    ``stop_sandboxes_on_exit`` so its sandboxes outlive it."""
    binary = Path(os.environ.get("DSEC_BIN") or REPO / "target" / "release" / "dsec")
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.fail(f"the dsec server binary {binary} is missing or not executable: build it "
                    "with `cargo build --release` or point DSEC_BIN at it", pytrace=False)
    given = str(data_dir) if data_dir is not None else os.environ.get("DSEC_DATA_DIR")
    data_dir = Path(given) if given else Path(tempfile.mkdtemp(prefix="dsec-e2e-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="dsec-e2e-log-"))
    log = log_dir / "server.log"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # A node name of its own: a `dsec up` already running on this host (with
    # the default name) keeps its sandboxes and cgroups apart from ours.
    node = node or f"e2e-{uuid.uuid4().hex[:10]}"
    stop_flag = ["--stop-sandboxes-on-exit"] if stop_sandboxes_on_exit else []
    cmd = [str(binary), "up", "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}",
           "--node", node, *stop_flag,
           # Small enough that test_bad_input can exceed it cheaply.
           "--max-upload-mb", str(MAX_UPLOAD_MB),
           # Room for test_scale's thousand small sandboxes.
           "--max-sandboxes", "4096",
           # A node swap file, so test_pause sees memory leave RAM.
           "--swap-file-mb", str(SWAP_FILE_MB),
           "--sandbox-domain", SANDBOX_DOMAIN, *extra_args]
    images_dir = os.environ.get("DSEC_TEST_IMAGES_DIR")
    if images_dir:
        cmd += ["--images-dir", images_dir]
    vm_images_dir = os.environ.get("DSEC_TEST_VM_IMAGES_DIR")
    if vm_images_dir:
        cmd += ["--vm-images-dir", vm_images_dir]
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    srv = Server(url=url, admin_token="", data_dir=data_dir, log=log, pid=proc.pid)
    try:
        deadline = time.monotonic() + float(os.environ.get("DSEC_E2E_START_TIMEOUT", "180"))
        while True:
            if proc.poll() is not None:
                pytest.fail(f"dsec up exited with status {proc.returncode} before it was "
                            f"healthy; log:\n{srv.log_tail()}", pytrace=False)
            try:
                status, raw = _http("GET", url + "/healthz", timeout=2)
                if status == 200:
                    health = json.loads(raw)
                    nodes = health.get("nodes") or []
                    if not nodes or any(n.get("healthy") for n in nodes):
                        break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"dsec up did not answer /healthz at {url} in time; log:\n"
                            f"{srv.log_tail()}", pytrace=False)
            time.sleep(0.2)
        token_file = data_dir / "admin-token"
        while not token_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not token_file.exists():
            pytest.fail(f"{token_file} was not written by dsec up", pytrace=False)
        srv.admin_token = token_file.read_text().strip()
        yield srv
    finally:
        _stop(proc.pid, proc, kill_group=stop_sandboxes_on_exit)
        _swapoff_under(data_dir)
        shutil.rmtree(log_dir, ignore_errors=True)
        if not given:
            left = _mounts_under(data_dir)
            if left:
                print(f"dsec e2e: leaving {data_dir}: still mounted: {left[:5]}")
            else:
                shutil.rmtree(data_dir, ignore_errors=True)


def dsec_image(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    """``dsec image ARGS`` on the image store the tests' servers share
    (DSEC_TEST_IMAGES_DIR, else ``server``'s own)."""
    images = os.environ.get("DSEC_TEST_IMAGES_DIR") or str(server.data_dir / "images")
    return subprocess.run([str(DSEC), "image", *args, "--images-dir", images],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def drop_build_cache(server: Server) -> None:
    """Empties the Dockerfile builds' step cache of the shared store (and
    collects the blobs only it named): a test that builds leaves nothing."""
    r = dsec_image(server, "gc", "--build-cache")
    assert r.returncode == 0, r.stderr


def _create_tenant(server: Server, prefix: str) -> Tenant:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    status, raw = _http("POST", server.url + "/v1/tenants", server.admin_token, {"name": name})
    if status != 201:
        pytest.fail(f"POST /v1/tenants answered {status}: {raw[:300]!r}", pytrace=False)
    return Tenant(name=name, token=json.loads(raw)["token"])


@pytest.fixture(scope="session")
def tenant(server: Server) -> Tenant:
    """The tenant most tests act as (a user, not the admin)."""
    return _create_tenant(server, "e2e-a")


@pytest.fixture(scope="session")
def other_tenant(server: Server) -> Tenant:
    """A second tenant, to check isolation between tenants."""
    return _create_tenant(server, "e2e-b")


@pytest.fixture(scope="session")
def image(server: Server) -> str:
    """The image the tests run; fails clearly when the server lacks it."""
    status, raw = _http("GET", server.url + "/v1/images", server.admin_token)
    assert status == 200, raw
    names = [i["name"] for i in json.loads(raw)["images"]]
    if not any(n == IMAGE or n.startswith(IMAGE + ":") for n in names):
        pytest.fail(f"the server has no {IMAGE!r} image (it has {names}); prepare one with "
                    "`dsec image setup --images-dir DIR` and set DSEC_TEST_IMAGES_DIR=DIR "
                    "(or DSEC_DATA_DIR to a prepared data dir)", pytrace=False)
    return IMAGE


@pytest.fixture
async def client(server: Server, tenant: Tenant) -> AsyncIterator[DSecClient]:
    """An asyncio client acting as the session's tenant."""
    async with DSecClient(server.url, tenant.token) as c:
        yield c


@pytest.fixture
async def admin(server: Server) -> AsyncIterator[DSecClient]:
    """An asyncio client with the admin token."""
    async with DSecClient(server.url, server.admin_token) as c:
        yield c


def run_args(image: str, **kw: object) -> DSecContainerRunArgs:
    """The listing's arguments, with overrides; labelled so leftovers are findable."""
    base: dict[str, object] = dict(container_image=image, memory_limit_mb=1024,
                                   cpu_cores_limit=1, ttl_running_stop=300,
                                   network_rules={}, init_user="root",
                                   labels={"suite": "sdk-e2e"})
    base.update(kw)
    return DSecContainerRunArgs(**base)  # type: ignore[arg-type]


@pytest.fixture
async def sandbox(client: DSecClient, image: str) -> AsyncIterator[Sandbox]:
    """A running sandbox as in the paper's listing, deleted afterwards."""
    sb = await client.run_container(run_args(image), timeout=120)
    try:
        yield sb
    finally:
        try:
            await sb.delete()
        except Exception:
            pass
