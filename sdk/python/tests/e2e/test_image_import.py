"""OCI images imported with the real tools' formats, then run as sandboxes:
an OCI layout (one dsec layer per OCI layer, so deletions are overlay
whiteouts), a ``docker save`` archive written by skopeo, and a pull from a
real local registry (Debian's docker-registry) pushed to by skopeo; and
``dsec image push`` to that registry, read back by skopeo and by a pull."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsec import DSecClient

from .conftest import REPO, Server, _free_port, run_args, serve_dsec
from .oci_layout import write_layout

DSEC = Path(os.environ.get("DSEC_BIN") or REPO / "target" / "release" / "dsec")


def _images_dir(server: Server) -> Path:
    given = os.environ.get("DSEC_TEST_IMAGES_DIR")
    return Path(given) if given else server.data_dir / "images"


def _dsec_image(server: Server, *args: str, check: bool = True,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(DSEC), "image", *args, "--images-dir", str(_images_dir(server))],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"dsec image {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _skopeo(*args: str) -> None:
    subprocess.run(["skopeo", "--insecure-policy", "copy", "-q", *args], check=True,
                   timeout=120, stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def _serve_registry(root: Path, htpasswd: str | None = None) -> Iterator[str]:
    """A Debian docker-registry on a loopback port of its own (with Basic
    authentication when an htpasswd line is given)."""
    port = _free_port()
    config = root / "config.yml"
    auth = ""
    if htpasswd:
        (root / "htpasswd").write_text(htpasswd + "\n")
        auth = f"auth:\n  htpasswd:\n    realm: dsec-test\n    path: {root / 'htpasswd'}\n"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root / 'data'}\n{auth}http:\n  addr: 127.0.0.1:{port}\n")
    with open(root / "log", "wb") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as r:
                    if r.status == 200:
                        break
            except urllib.error.HTTPError as e:
                if e.code == 401 and htpasswd:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"docker-registry did not start: {(root / 'log').read_text()}")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _serve_registry(tmp_path_factory.mktemp("registry")) as address:
        yield address


# bcrypt (cost 4) of PUSH_PASSWORD: docker-registry's htpasswd wants bcrypt,
# which Python's standard library cannot compute.
PUSH_USER = "pusher"
PUSH_PASSWORD = "dsec-test-password"
PUSH_HTPASSWD = f"{PUSH_USER}:$2b$04$7FEunJcuPIqhJ18amqmlduAiOsuXIMTrubR1l7bZjzXyZOAqW4Gt2"


@pytest.fixture(scope="module")
def private_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _serve_registry(tmp_path_factory.mktemp("private-registry"), PUSH_HTPASSWD) as address:
        yield address


@pytest.fixture(scope="module")
def imported(server: Server, registry: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The same image imported three ways; removed (and collected) after."""
    work = tmp_path_factory.mktemp("oci")
    unique = f"e2e-oci-{uuid.uuid4().hex[:8]}"
    layout = write_layout(work / "layout", "v1")
    names = {"layout": f"{unique}-layout:v1"}
    _dsec_image(server, "import", str(layout), "--name", names["layout"], "--merge-below-mb", "0")

    archive = work / "saved.tar"
    _skopeo(f"oci:{layout}:v1", f"docker-archive:{archive}:team/{unique}-saved:v1")
    out = _dsec_image(server, "import", str(archive)).stdout.split()
    names["docker-save"] = out[-1]

    _skopeo("--dest-tls-verify=false", f"oci:{layout}:v1",
            f"docker://{registry}/team/{unique}-pulled:v1")
    out = _dsec_image(server, "pull", f"{registry}/team/{unique}-pulled:v1").stdout.split()
    names["registry"] = out[-1]
    try:
        yield names
    finally:
        _dsec_image(server, "rm", *names.values(), check=False)
        _dsec_image(server, "gc", check=False)
        shutil.rmtree(work, ignore_errors=True)


def test_names_come_from_the_sources(imported: dict[str, str]) -> None:
    assert imported["docker-save"].endswith("-saved:v1")
    assert imported["registry"].endswith("-pulled:v1")


@pytest.mark.parametrize("how", ["layout", "docker-save", "registry"])
async def test_imported_images_run_with_their_config_and_deletions(
        client: DSecClient, imported: dict[str, str], how: str) -> None:
    sandbox = await client.run_container(run_args(imported[how], memory_limit_mb=64), timeout=60)
    try:
        # The image's Env and WorkingDir apply; the script of layer 2 runs.
        r = await sandbox.run_shell("greet")
        assert r.exit_code == 0, r
        assert r.stdout == "hello-from-oci from /work\n"
        # Layer 2's whiteout deleted /etc/secret; its opaque marker hid
        # /data/old's earlier files but kept its own.
        r = await sandbox.run_shell("ls /data/old; test -e /etc/secret || echo no-secret")
        assert r.stdout == "c\nno-secret\n", r
    finally:
        await sandbox.stop()


def test_bad_pulls_and_imports_fail_clearly(server: Server, registry: str,
                                            tmp_path: Path) -> None:
    r = _dsec_image(server, "pull", f"{registry}/team/does-not-exist:v1", check=False)
    assert r.returncode != 0 and "not found" in r.stderr, r.stderr
    closed = f"127.0.0.1:{_free_port()}"
    r = _dsec_image(server, "pull", f"{closed}/team/x:v1", check=False)
    assert r.returncode != 0 and "cannot reach" in r.stderr, r.stderr
    r = _dsec_image(server, "pull", "UPPER/case", check=False)
    assert r.returncode != 0 and "invalid registry reference" in r.stderr, r.stderr
    not_an_image = tmp_path / "x.tar"
    not_an_image.write_bytes(b"\0" * 1024)
    r = _dsec_image(server, "import", str(not_an_image), check=False)
    assert r.returncode != 0 and "not an OCI image layout" in r.stderr, r.stderr


async def _output_in(client: DSecClient, image: str, command: str) -> str:
    """What `command` prints in a new sandbox of `image` (stopped after)."""
    sandbox = await client.run_container(run_args(image, memory_limit_mb=64), timeout=60)
    try:
        return (await sandbox.run_shell(command)).stdout
    finally:
        await sandbox.stop()


async def test_a_pushed_image_comes_back_whole(client: DSecClient, server: Server, registry: str,
                                              imported: dict[str, str], tmp_path: Path) -> None:
    """The layout image (two dsec layers, the top one deleting with overlay
    whiteouts) pushed to the registry: skopeo copies it (checking every
    digest) and reads its config; pulled back it runs like the original; a
    second push sends nothing."""
    source = imported["layout"]
    dest = f"{registry}/team/{source.split(':')[0]}-pushed:v2"
    r = _dsec_image(server, "push", source, dest)
    pushed = r.stdout.split()[-1]
    assert pushed.startswith(dest + "@sha256:"), r.stdout
    assert "pushed 2 layers" in r.stderr and "1 whiteouts, 1 opaque directories" in r.stderr, r.stderr

    out = tmp_path / "copied"
    _skopeo("--src-tls-verify=false", f"docker://{dest}", f"oci:{out}:v2")
    info = json.loads(subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", f"docker://{dest}"], check=True,
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL).stdout)
    assert "GREETING=hello-from-oci" in info["Env"] and len(info["Layers"]) == 2, info
    assert pushed.endswith(info["Digest"]), (pushed, info["Digest"])

    again = _dsec_image(server, "push", source, dest)
    assert again.stdout.split()[-1] == pushed
    assert "pushed 0 layers" in again.stderr and "2 already there" in again.stderr, again.stderr

    back = _dsec_image(server, "pull", dest, "--name", f"{source.split(':')[0]}-back:v2",
                       "--merge-below-mb", "0").stdout.split()[-1]
    try:
        out = await _output_in(client, back, "greet; ls /data/old; test -e /etc/secret || echo no-secret")
        assert out == "hello-from-oci from /work\nc\nno-secret\n", out
    finally:
        _dsec_image(server, "rm", back, check=False)


def _layer_kinds(server: Server, image: str) -> list[str]:
    shown = json.loads(_dsec_image(server, "inspect", image).stdout)
    return [layer["kind"] for layer in shown["manifest"]["layers"]]


async def test_a_pulled_image_keeps_its_layer_kinds(client: DSecClient, server: Server,
                                                    registry: str, imported: dict[str, str]) -> None:
    """`dsec image push` records each layer's kind as an annotation and a
    pull reads it back: a packed sandbox (base layers + a workspace layer)
    comes back as a base and a workspace, the small base layers merged but
    never merged with the workspace; an image from another producer (no
    annotations, pushed by skopeo) is all base, as before."""
    assert set(_layer_kinds(server, imported["registry"])) == {"base"}
    stem = imported["layout"].split(":")[0]
    parent = await client.run_container(run_args(imported["layout"], memory_limit_mb=64), timeout=60)
    try:
        r = await parent.run_shell("mkdir -p /work/task && echo packed > /work/task/note")
        assert r.exit_code == 0, r
        packed = await parent.pack_diff(f"{stem}-packed:v1")
    finally:
        await parent.stop()
    kinds = _layer_kinds(server, packed.image)
    assert kinds[-1] == "workspace" and set(kinds[:-1]) == {"base"} and len(kinds) >= 3, kinds
    dest = f"{registry}/team/{stem}-packed:v1"
    back = f"{stem}-packed-back:v1"
    try:
        _dsec_image(server, "push", packed.image, dest)
        _dsec_image(server, "pull", dest, "--name", back)
        assert _layer_kinds(server, back) == ["base", "workspace"]
        out = await _output_in(client, back, "cat /work/task/note; greet")
        assert out == "packed\nhello-from-oci from /work\n", out
    finally:
        for image in (back, packed.image):
            _dsec_image(server, "rm", image, check=False)


def test_bad_pushes_fail_clearly(server: Server, registry: str, private_registry: str,
                                 imported: dict[str, str]) -> None:
    source = imported["layout"]
    closed = f"127.0.0.1:{_free_port()}"
    r = _dsec_image(server, "push", source, f"{closed}/team/x:v1", check=False)
    assert r.returncode != 0 and "cannot reach" in r.stderr, r.stderr
    r = _dsec_image(server, "push", source, "127.0.0.1:1/UPPER/case:v1", check=False)
    assert r.returncode != 0 and "invalid registry reference" in r.stderr, r.stderr
    r = _dsec_image(server, "push", source, f"{registry}/team/x@sha256:{'a' * 64}", check=False)
    assert r.returncode != 0 and "push to a tag" in r.stderr, r.stderr
    r = _dsec_image(server, "push", "no-such-image:v9", f"{registry}/team/x:v1", check=False)
    assert r.returncode != 0 and "no-such-image:v9" in r.stderr, r.stderr

    dest = f"{private_registry}/team/private:v1"
    r = _dsec_image(server, "push", source, dest, check=False)
    assert r.returncode != 0 and "access denied (401)" in r.stderr, r.stderr
    wrong = {"DSEC_REGISTRY_USER": PUSH_USER, "DSEC_REGISTRY_PASSWORD": "wrong"}
    r = _dsec_image(server, "push", source, dest, check=False, env=wrong)
    assert r.returncode != 0 and "access denied (401)" in r.stderr, r.stderr
    right = {"DSEC_REGISTRY_USER": PUSH_USER, "DSEC_REGISTRY_PASSWORD": PUSH_PASSWORD}
    r = _dsec_image(server, "push", source, dest, env=right)
    assert r.stdout.split()[-1].startswith(dest + "@sha256:"), r.stdout


@pytest.fixture(scope="module")
def shared_node(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """A second node whose own image store starts empty, fetching from a
    shared store into which the first node's busybox image was pushed."""
    root = tmp_path_factory.mktemp("shared")
    shared, own = root / "shared", root / "own"
    _dsec_image(server, "push", "busybox", "--to", str(shared))
    old = os.environ.get("DSEC_TEST_IMAGES_DIR")
    os.environ["DSEC_TEST_IMAGES_DIR"] = str(own)
    try:
        gen = serve_dsec(["--no-fncall", "--shared-store", str(shared), "--image-cache-mb", "64",
                          "--layer-fetch", "eager"])
        node = next(gen)
    finally:
        if old is None:
            os.environ.pop("DSEC_TEST_IMAGES_DIR", None)
        else:
            os.environ["DSEC_TEST_IMAGES_DIR"] = old
    try:
        yield node, own
    finally:
        gen.close()
        shutil.rmtree(root, ignore_errors=True)


async def test_a_node_fetches_images_from_the_shared_store(
        shared_node: tuple[Server, Path]) -> None:
    node, own = shared_node
    assert not (own / "manifests").exists() or not any((own / "manifests").iterdir())
    async with DSecClient(endpoint=node.url, token=node.admin_token) as c:
        sb = await c.run_container(run_args("busybox", memory_limit_mb=32), timeout=60)
        try:
            r = await sb.run_shell("echo fetched")
            assert r.stdout == "fetched\n"
        finally:
            await sb.stop()
    assert any(p.name.startswith("busybox@") for p in (own / "manifests").iterdir())
