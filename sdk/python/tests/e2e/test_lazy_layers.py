"""On-demand layers: a second node whose own image store is empty starts a
sandbox from a shared store before the layers are local, fetching only
the chunks the sandbox reads; once for each flavour of shared store (a
directory, and an S3-compatible object store: moto's server on loopback,
which checks every request's SigV4 signature against an IAM user).

After the node stops, nothing is left: no FUSE or layer mount, no partial
cache file."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dsec import DSecClient, DSecRunArgs
from dsec.sandbox import Sandbox

from .conftest import REPO, Server, _free_port, _mounts_under, run_args, serve_dsec

DSEC = Path(os.environ.get("DSEC_BIN") or REPO / "target" / "release" / "dsec")
#: The workspace layer's unused data: the sandbox reads a few KiB of it.
BIG_MB = 24
BUCKET = "dsec-layers"


def _dsec_image(*args: str, env: dict[str, str] | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(DSEC), "image", *args], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"dsec image {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


@dataclass
class Source:
    """Where the images come from: a store holding busybox and ``lazyws:v1``
    (a workspace: a small file, a script and BIG_MB MiB of random data)."""

    images: Path
    busybox: Path


@pytest.fixture(scope="module")
def source(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Source]:
    work = tmp_path_factory.mktemp("lazy-src")
    tree = work / "tree"
    tree.mkdir()
    (tree / "hello.txt").write_text("hello from a lazy layer\n")
    with open(tree / "big.bin", "wb") as f:
        f.write(os.urandom(BIG_MB << 20))
    images = work / "images"
    _dsec_image("build", "lazyws:v1", "--from-dir", str(tree), "--kind", "workspace",
                "--images-dir", str(images))
    given = os.environ.get("DSEC_TEST_IMAGES_DIR")
    busybox = (Path(given) if given
               else request.getfixturevalue("server").data_dir / "images")
    try:
        yield Source(images=images, busybox=busybox)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def s3_server() -> Iterator[tuple[str, dict[str, str]]]:
    """moto's S3 server on a loopback port, with signature checking on: an
    IAM user with an S3 policy is made first, then every request must be
    signed with its key."""
    import boto3  # a test dependency (sdk/python[test])
    from moto import server as moto_server
    port = _free_port()
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        setup = {"endpoint_url": endpoint, "region_name": "us-east-1",
                 "aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        iam = boto3.client("iam", **setup)
        iam.create_user(UserName="dsec")
        iam.put_user_policy(UserName="dsec", PolicyName="s3", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="dsec")["AccessKey"]
        boto3.client("s3", **setup).create_bucket(Bucket=BUCKET)
        # From now on moto authenticates every request (SigV4, IAM policy).
        req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(req, timeout=10).read()
        env = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"],
               "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
               "AWS_REGION": "us-east-1", "DSEC_S3_ENDPOINT": endpoint}
        yield endpoint, env
    finally:
        srv.stop()


def _partial_files(own: Path) -> list[Path]:
    tmp = own / "tmp"
    return sorted(tmp.glob("lazy-*.partial")) if tmp.is_dir() else []


def _allocated(path: Path) -> int:
    """Bytes the sparse cache file really holds on disk."""
    return os.stat(path).st_blocks * 512


def _blob_size(images: Path, name: str) -> tuple[str, int]:
    manifest = json.loads((images / "manifests" / f"{name.replace(':', '@')}.json").read_text())
    layer = manifest["layers"][0]
    return layer["digest"].split(":", 1)[1], int(layer["size"])


async def _read_a_little(sb: Sandbox, own: Path, hexdigest: str, size: int) -> None:
    """Reads the small file and 100 KB of the big one; the workspace layer
    is not local then: a sparse cache file holds a small fraction of it."""
    r = await sb.run_shell("cat /hello.txt && head -c 100000 /big.bin | wc -c")
    assert r.stdout == "hello from a lazy layer\n100000\n", r
    assert not (own / "blobs" / "sha256" / f"{hexdigest}.erofs").exists()
    partial = [p for p in _partial_files(own) if p.name.startswith(f"lazy-{hexdigest[:16]}-")]
    assert len(partial) == 1, _partial_files(own)
    held = _allocated(partial[0])
    assert 0 < held < size // 10, (held, size)


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (a killed sandbox process
    whose parent died with the edge waits for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _serve_node(location: str, env: dict[str, str], own: Path, data: Path,
                **serve: object) -> tuple[Iterator[Server], Server]:
    """A node whose own image store is ``own``, reading images it lacks
    from the shared store at ``location`` on demand (``serve``: more
    arguments of ``serve_dsec``, for restarts)."""
    old = {k: os.environ.get(k) for k in [*env, "DSEC_TEST_IMAGES_DIR"]}
    os.environ.update({**env, "DSEC_TEST_IMAGES_DIR": str(own)})
    try:
        gen = serve_dsec(["--no-fncall", "--shared-store", location, "--image-cache-mb", "256"],
                         data_dir=data, **serve)  # type: ignore[arg-type]
        return gen, next(gen)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(params=["dir", "s3"])
def shared_store(request: pytest.FixtureRequest, source: Source,
                 tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """The two images pushed to a shared store of each flavour."""
    if request.param == "dir":
        location, env = str(tmp_path / "shared"), {}
    else:
        _, env = request.getfixturevalue("s3_server")
        location = f"s3://{BUCKET}/t-{tmp_path.name}"
    _dsec_image("push", "busybox", "--to", location, "--images-dir", str(source.busybox), env=env)
    _dsec_image("push", "lazyws:v1", "--to", location, "--images-dir", str(source.images), env=env)
    yield location, env


async def test_a_node_starts_sandboxes_before_their_layers_are_local(
        source: Source, shared_store: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    location, env = shared_store
    own = tmp_path / "own"
    data = tmp_path / "data"
    hexdigest, size = _blob_size(source.images, "lazyws:v1")
    gen, node = _serve_node(location, env, own, data)
    try:
        async with DSecClient(endpoint=node.url, token=node.admin_token) as c:
            sb = await c.run_container(
                run_args("busybox", memory_limit_mb=32, workspace="lazyws:v1"), timeout=60)
            try:
                await _read_a_little(sb, own, hexdigest, size)
                assert [m for m in _mounts_under(data) if m.endswith("/.on-demand")], _mounts_under(data)
            finally:
                await sb.stop()
    finally:
        gen.close()
    try:
        # Clean shutdown: no FUSE or layer mount, no partial cache file.
        assert not [line for line in open("/proc/self/mountinfo") if str(data) in line]
        assert not _mounts_under(data)
        assert _partial_files(own) == []
    finally:
        shutil.rmtree(data, ignore_errors=True)


async def test_a_restarted_node_needs_the_shared_store_only_for_chunk_data(
        source: Source, tmp_path: Path) -> None:
    """The node keeps the manifest and chunk tables of what it resolved on
    demand: after a restart it resolves the images again from its own
    store, although the shared store has lost both (only blobs are left)."""
    shared = tmp_path / "shared"
    _dsec_image("push", "busybox", "--to", str(shared), "--images-dir", str(source.busybox))
    _dsec_image("push", "lazyws:v1", "--to", str(shared), "--images-dir", str(source.images))
    own, data = tmp_path / "own", tmp_path / "data"
    hexdigest, _ = _blob_size(source.images, "lazyws:v1")
    args = run_args("busybox", memory_limit_mb=32, workspace="lazyws:v1")
    try:
        for run in ["first", "after a restart"]:
            gen, node = _serve_node(str(shared), {}, own, data)
            try:
                async with DSecClient(endpoint=node.url, token=node.admin_token) as c:
                    sb = await c.run_container(args, timeout=60)
                    try:
                        r = await sb.run_shell("cat /hello.txt && head -c 100000 /big.bin | wc -c")
                        assert r.stdout == "hello from a lazy layer\n100000\n", (run, r)
                    finally:
                        await sb.stop()
            finally:
                gen.close()
            kept = json.loads((own / "manifests" / "lazyws@v1.json").read_text())
            assert f"sha256:{hexdigest}" in kept["chunk_tables"], kept
            assert (own / "blobs" / "sha256" / f"{hexdigest}.chunks").is_file()
            assert not (own / "blobs" / "sha256" / f"{hexdigest}.erofs").exists()
            inspected = _dsec_image("inspect", "lazyws:v1", "--images-dir", str(own)).stdout
            assert hexdigest in inspected
            # The shared store forgets everything but the blobs.
            for p in [*(shared / "manifests").iterdir(),
                      *(shared / "blobs" / "sha256").glob("*.chunks")]:
                p.unlink()
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.parametrize("how", ["SIGKILL", "stop"])
async def test_an_edge_restart_fails_the_sandboxes_on_its_on_demand_layers(
        source: Source, tmp_path: Path, how: str) -> None:
    """The edge serves on-demand layer data through its own FUSE files, so
    when its process ends (SIGKILL, or a clean stop that leaves sandboxes
    running) the kernel ends that connection and a sandbox on such layers
    can no longer read what it has not read yet. The restarted edge does
    not re-adopt it as running: it removes it (no process, no cgroup) and
    reports it failed with the reason. A sandbox on local layers is
    re-adopted; a new sandbox on the same image reads it (fresh mounts);
    nothing of the dead process is left."""
    shared = tmp_path / "shared"
    _dsec_image("push", "busybox", "--to", str(shared), "--images-dir", str(source.busybox))
    _dsec_image("push", "lazyws:v1", "--to", str(shared), "--images-dir", str(source.images))
    own, data = tmp_path / "own", tmp_path / "data"
    # busybox is local; the workspace comes on demand.
    _dsec_image("fetch", "busybox", "--from", str(shared), "--images-dir", str(own))
    node = f"e2e-lazy-{uuid.uuid4().hex[:6]}"
    try:
        first, srv = _serve_node(str(shared), {}, own, data, node=node, stop_sandboxes_on_exit=False)
        async with DSecClient(endpoint=srv.url, token=srv.admin_token) as c:
            local = await c.run_container(run_args("busybox", memory_limit_mb=32), timeout=60)
            lazy = await c.run_container(
                run_args("busybox", memory_limit_mb=32, workspace="lazyws:v1"), timeout=60)
            r = await lazy.run_shell("cat /hello.txt && head -c 100000 /big.bin | wc -c")
            assert r.stdout == "hello from a lazy layer\n100000\n", r
            procs = glob.glob(f"/sys/fs/cgroup/*/dsec/{node}/{lazy.id}/cgroup.procs")
            lazy_pids = {int(p) for f in procs for p in Path(f).read_text().split()}
            assert lazy_pids, procs
        if how == "SIGKILL":
            os.kill(srv.pid, signal.SIGKILL)
        first.close()  # SIGTERM if still running: a clean stop

        second, srv = _serve_node(str(shared), {}, own, data, node=node)
        try:
            async with DSecClient(endpoint=srv.url, token=srv.admin_token) as c:
                info = await c.get(lazy.id)
                if info.state == "running":
                    # What happened before the fix: re-adopted, then its reads fail.
                    s = await c.connect(lazy.id)
                    r = await s.run_shell("tail -c 100000 /big.bin | wc -c")
                    pytest.fail(f"re-adopted as running; an unread part of its layer gives {r}")
                assert info.state == "failed", info
                assert "loaded on demand" in (info.state_reason or ""), info
                assert not glob.glob(f"/sys/fs/cgroup/*/dsec/{node}/{lazy.id}"), "cgroup left"
                assert not [p for p in lazy_pids if _running(p)], "processes left"

                again = await c.connect(local.id)
                assert (await again.run_shell("echo still here")).stdout == "still here\n"
                await again.stop()

                fresh = await c.run_container(
                    run_args("busybox", memory_limit_mb=32, workspace="lazyws:v1"), timeout=60)
                try:
                    r = await fresh.run_shell("cat /hello.txt && tail -c 100000 /big.bin | wc -c")
                    assert r.stdout == "hello from a lazy layer\n100000\n", r
                finally:
                    await fresh.stop()
        finally:
            second.close()
        assert not _mounts_under(data)
        assert _partial_files(own) == []
    finally:
        shutil.rmtree(data, ignore_errors=True)


async def test_a_microvm_boots_from_layers_loaded_on_demand(source: Source, tmp_path: Path) -> None:
    """A microVM's layers are the same FUSE files, given to QEMU as
    read-only disks: it boots before the layers are local, and what the
    guest reads is fetched, chunk by chunk, as for a container."""
    shared = tmp_path / "shared"
    _dsec_image("push", "busybox", "--to", str(shared), "--images-dir", str(source.busybox))
    _dsec_image("push", "lazyws:v1", "--to", str(shared), "--images-dir", str(source.images))
    own, data = tmp_path / "own", tmp_path / "data"
    # The guest kernel (not an image: never in a shared store).
    shutil.copytree(source.busybox / "vm" / "kernel", own / "vm" / "kernel")
    hexdigest, size = _blob_size(source.images, "lazyws:v1")
    gen, node = _serve_node(str(shared), {}, own, data)
    try:
        async with DSecClient(endpoint=node.url, token=node.admin_token) as c:
            args = DSecRunArgs(backend="microvm", image="busybox", workspace="lazyws:v1",
                               memory_limit_mb=256, cpu_cores_limit=1, disk_limit_mb=64)
            sb = await c.run(args, timeout=120)
            try:
                await _read_a_little(sb, own, hexdigest, size)
            finally:
                await sb.stop()
    finally:
        gen.close()
        shutil.rmtree(data, ignore_errors=True)


def test_s3_requests_are_signed_and_bad_credentials_refused(
        source: Source, s3_server: tuple[str, dict[str, str]]) -> None:
    _, env = s3_server
    bad = {**env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    images = ["--images-dir", str(source.images)]
    r = _dsec_image("push", "lazyws:v1", "--to", f"s3://{BUCKET}/bad", *images, env=bad, check=False)
    assert r.returncode != 0 and "HTTP 403 access denied" in r.stderr, r.stderr
    _dsec_image("push", "lazyws:v1", "--to", f"s3://{BUCKET}/signed", *images, env=env)
    r = _dsec_image("fetch", "lazyws:v1", "--from", f"s3://{BUCKET}/signed", *images, env=bad,
                    check=False)
    assert r.returncode != 0 and "SignatureDoesNotMatch" in r.stderr, r.stderr
    r = _dsec_image("fetch", "nope:v1", "--from", f"s3://{BUCKET}/signed", *images, env=env,
                    check=False)
    assert r.returncode != 0 and "not found" in r.stderr, r.stderr


def test_layer_commands_list_inspect_and_refuse_to_remove_used_layers(tmp_path: Path) -> None:
    images = ["--images-dir", str(tmp_path / "images")]
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f").write_text("x\n")
    _dsec_image("build", "tk:v1", "--from-dir", str(tree), "--kind", "toolkit", *images)
    digest, _ = _blob_size(tmp_path / "images", "tk:v1")

    def layer(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(DSEC), "layer", *args, *images], capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert not check or proc.returncode == 0, proc.stderr
        return proc

    lines = layer("ls").stdout.splitlines()
    assert len(lines) == 2 and lines[1].startswith(f"sha256:{digest[:12]}") and "toolkit" in lines[1]
    shown = layer("inspect", digest[:10]).stdout
    assert f"sha256:{digest}" in shown and "image:  tk:v1 (toolkit)" in shown
    r = layer("rm", digest[:10], check=False)
    assert r.returncode != 0 and "used by tk:v1" in r.stderr, r.stderr
    r = layer("inspect", "zz", check=False)
    assert r.returncode != 0 and "invalid layer digest" in r.stderr, r.stderr
    _dsec_image("rm", "tk:v1", *images)
    assert f"removed sha256:{digest}" in layer("rm", digest).stdout
    assert len(layer("ls").stdout.splitlines()) == 1
