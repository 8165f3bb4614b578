"""File operations and directory transfer against the real server."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import dsec
from dsec import DSecClient
from dsec.sandbox import Sandbox

from .conftest import run_args

pytestmark = pytest.mark.e2e


async def test_binary_round_trip(sandbox: Sandbox) -> None:
    blob = os.urandom(4 << 20)
    w = await sandbox.write_file("/tmp/blob.bin", blob)
    assert w.bytes == len(blob)
    assert await sandbox.read_file("/tmp/blob.bin") == blob
    r = await sandbox.run_shell("sha256sum /tmp/blob.bin")
    assert r.stdout.split()[0] == hashlib.sha256(blob).hexdigest()
    st = await sandbox.stat("/tmp/blob.bin")
    assert st.is_file and st.size == len(blob) and st.name == "blob.bin"
    assert st.path == "/tmp/blob.bin"


async def test_text_mode_and_parents(sandbox: Sandbox) -> None:
    await sandbox.write_file("/tmp/new/dir/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    st = await sandbox.stat("/tmp/new/dir/run.sh")
    assert st.mode & 0o777 == 0o755
    assert (await sandbox.exec(["/tmp/new/dir/run.sh"])).stdout == "ran\n"
    assert await sandbox.read_text("/tmp/new/dir/run.sh") == "#!/bin/sh\necho ran\n"
    # Written files are visible to commands, and commands' files to reads.
    await sandbox.run_shell("printf from-shell > /tmp/new/s.txt")
    assert await sandbox.read_file("/tmp/new/s.txt") == b"from-shell"


async def test_list_stat_mkdir_remove(sandbox: Sandbox) -> None:
    await sandbox.mkdir("/tmp/t/a/b")
    assert (await sandbox.stat("/tmp/t/a/b")).is_dir
    await sandbox.mkdir("/tmp/t/a/b")  # with parents, an existing directory is fine
    await sandbox.write_file("/tmp/t/f.txt", "x")
    await sandbox.run_shell("ln -s /tmp/t/f.txt /tmp/t/link")
    entries = {e.name: e for e in await sandbox.list_dir("/tmp/t")}
    assert set(entries) == {"a", "f.txt", "link"}
    assert entries["a"].is_dir and entries["f.txt"].is_file and entries["f.txt"].size == 1
    assert entries["link"].is_symlink and entries["link"].link_target == "/tmp/t/f.txt"
    with pytest.raises(dsec.AlreadyExists):
        await sandbox.mkdir("/tmp/t/f.txt", parents=False)
    with pytest.raises(dsec.AlreadyExists):
        await sandbox.mkdir("/tmp/t/a", parents=False)
    with pytest.raises(dsec.DirectoryNotEmpty):
        await sandbox.remove("/tmp/t/a")
    await sandbox.remove("/tmp/t/f.txt")
    assert not await sandbox.exists("/tmp/t/f.txt")
    await sandbox.remove("/tmp/t", recursive=True)
    with pytest.raises(dsec.FileNotFound):
        await sandbox.stat("/tmp/t")
    with pytest.raises(dsec.FileNotFound):
        await sandbox.read_file("/tmp/t/f.txt")
    with pytest.raises(dsec.FileNotFound):
        await sandbox.list_dir("/no/such/dir")


async def test_bad_paths(sandbox: Sandbox) -> None:
    with pytest.raises(dsec.InvalidPath):
        await sandbox.read_file("/tmp/../etc/passwd")
    with pytest.raises(dsec.InvalidPath):
        await sandbox.write_file("/tmp/../x", b"x")
    with pytest.raises(dsec.InvalidPath):
        await sandbox.stat("relative/path")
    with pytest.raises(dsec.IsADirectory):
        await sandbox.read_file("/tmp")
    await sandbox.write_file("/tmp/plain", b"x")
    with pytest.raises(dsec.NotADirectory):
        await sandbox.write_file("/tmp/plain/child", b"x", parents=False)


def make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "top.txt": b"top\n",
        "a/mid.bin": os.urandom(1_300_000),
        "a/b/c/deep.txt": "déjà vu\n".encode(),
        "bin/tool.sh": b"#!/bin/sh\necho tool\n",
        "name with spaces.txt": b"spaces\n",
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (root / "bin" / "tool.sh").chmod(0o755)
    (root / "empty").mkdir()
    os.symlink("top.txt", root / "link-to-top")
    return files


async def test_upload_download_directory(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = make_tree(src)
    await sandbox.upload(src, "/tmp/proj")
    for rel, data in files.items():
        assert await sandbox.read_file(f"/tmp/proj/{rel}") == data, rel
    assert (await sandbox.stat("/tmp/proj/empty")).is_dir
    assert (await sandbox.exec(["/tmp/proj/bin/tool.sh"])).stdout == "tool\n"
    assert (await sandbox.stat("/tmp/proj/link-to-top")).is_symlink

    await sandbox.run_shell("echo added > /tmp/proj/a/added.txt")
    dst = tmp_path / "dst"
    await sandbox.download("/tmp/proj", dst)
    for rel, data in files.items():
        assert (dst / rel).read_bytes() == data, rel
    assert (dst / "a" / "added.txt").read_text() == "added\n"
    assert (dst / "empty").is_dir()
    assert os.readlink(dst / "link-to-top") == "top.txt"
    assert os.access(dst / "bin" / "tool.sh", os.X_OK)


async def test_upload_merges_into_an_existing_directory(sandbox: Sandbox, tmp_path: Path) -> None:
    # What is there and not in the upload stays; what the upload has replaces.
    await sandbox.run_shell("mkdir -p /tmp/merge/a && echo old > /tmp/merge/top.txt && "
                            "echo mine > /tmp/merge/a/mine.txt")
    src = tmp_path / "src"
    files = make_tree(src)
    await sandbox.upload(src, "/tmp/merge")
    for rel, data in files.items():
        assert await sandbox.read_file(f"/tmp/merge/{rel}") == data, rel
    assert await sandbox.read_file("/tmp/merge/a/mine.txt") == b"mine\n"
    # The staging directory is gone.
    assert ".dsec" not in (await sandbox.run_shell("ls -aR /tmp/merge")).stdout


async def test_upload_crosses_a_mount_inside_the_target(sandbox: Sandbox, tmp_path: Path) -> None:
    # /dev/shm is a mount of its own beneath /dev: entries bound there cannot
    # be renamed from the staging directory and are copied instead.
    src = tmp_path / "dev"
    (src / "shm" / "sub").mkdir(parents=True)
    (src / "shm").chmod(0o1777)
    (src / "shm" / "f.txt").write_text("across\n")
    (src / "shm" / "sub" / "run.sh").write_text("echo ran\n")
    (src / "shm" / "sub" / "run.sh").chmod(0o755)
    os.symlink("f.txt", src / "shm" / "link")
    await sandbox.upload(src, "/dev")
    try:
        assert await sandbox.read_file("/dev/shm/f.txt") == b"across\n"
        assert (await sandbox.exec(["/bin/sh", "/dev/shm/sub/run.sh"])).stdout == "ran\n"
        assert (await sandbox.stat("/dev/shm/sub/run.sh")).mode & 0o777 == 0o755
        assert (await sandbox.run_shell("readlink /dev/shm/link")).stdout == "f.txt\n"
        assert ".dsec" not in (await sandbox.run_shell("ls -a /dev /dev/shm")).stdout
    finally:
        await sandbox.run_shell("rm -rf /dev/shm/f.txt /dev/shm/sub /dev/shm/link")


async def test_upload_download_single_big_file(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for _ in range(12):
            f.write(os.urandom(1 << 20))
    await sandbox.upload(src, "/tmp/big.bin")
    r = await sandbox.run_shell("sha256sum /tmp/big.bin")
    want = hashlib.sha256(src.read_bytes()).hexdigest()
    assert r.stdout.split()[0] == want
    dst = tmp_path / "back.bin"
    await sandbox.download("/tmp/big.bin", dst)
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == want


async def test_download_missing(sandbox: Sandbox, tmp_path: Path) -> None:
    with pytest.raises(dsec.FileNotFound):
        await sandbox.download("/no/such/thing", tmp_path / "x")
    assert not (tmp_path / "x").exists()


async def test_owner_of_written_files(client: DSecClient, image: str) -> None:
    async with await client.run_container(run_args(image, init_user="user")) as sb:
        await sb.write_file("/tmp/mine.txt", "x", owner="user")
        assert (await sb.stat("/tmp/mine.txt")).uid == 1000
        r = await sb.run_shell("echo more >> /tmp/mine.txt && cat /tmp/mine.txt")
        assert r.exit_code == 0 and r.stdout == "xmore\n", r
