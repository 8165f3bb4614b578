"""`dsec cp`: the CLI's copies into and out of a sandbox, against the real
server, checked through the SDK."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dsec.sandbox import Sandbox

from .conftest import REPO, Server, Tenant
from .test_files import make_tree

pytestmark = pytest.mark.e2e


def cp(server: Server, tenant: Tenant, src: str, dst: str,
       stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    binary = os.environ.get("DSEC_BIN") or str(REPO / "target" / "release" / "dsec")
    env = {**os.environ, "DSEC_ENDPOINT": server.url, "DSEC_TOKEN": tenant.token}
    return subprocess.run([binary, "cp", src, dst], env=env, input=stdin,
                          capture_output=True, timeout=300)


def ok(proc: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[bytes]:
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"copied " in proc.stderr, proc.stderr.decode()
    return proc


async def test_a_directory_goes_in_and_comes_back(
        server: Server, tenant: Tenant, sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = make_tree(src)
    ok(cp(server, tenant, str(src), f"{sandbox.id}:/tmp/cp/proj"))
    for rel, data in files.items():
        assert await sandbox.read_file(f"/tmp/cp/proj/{rel}") == data, rel
    assert (await sandbox.stat("/tmp/cp/proj/link-to-top")).is_symlink
    assert (await sandbox.exec(["/tmp/cp/proj/bin/tool.sh"])).stdout == "tool\n"

    await sandbox.run_shell("echo added > /tmp/cp/proj/a/added.txt")
    back = tmp_path / "back"
    ok(cp(server, tenant, f"{sandbox.id}:/tmp/cp/proj", str(back)))
    for rel, data in files.items():
        assert (back / rel).read_bytes() == data, rel
    assert (back / "a" / "added.txt").read_text() == "added\n"
    assert os.readlink(back / "link-to-top") == "top.txt"
    assert os.access(back / "bin" / "tool.sh", os.X_OK)
    # Through a symlink to the directory, the same.
    await sandbox.run_shell("ln -s /tmp/cp/proj /tmp/cp/via-link")
    via = tmp_path / "via"
    ok(cp(server, tenant, f"{sandbox.id}:/tmp/cp/via-link", str(via)))
    assert (via / "a" / "added.txt").read_text() == "added\n"
    # To standard output, a directory is a tar stream.
    out = ok(cp(server, tenant, f"{sandbox.id}:/tmp/cp/proj", "-")).stdout
    assert out[257:262] == b"ustar" and len(out) % 512 == 0


async def test_files_both_ways_and_through_pipes(
        server: Server, tenant: Tenant, sandbox: Sandbox, tmp_path: Path) -> None:
    one = tmp_path / "one.sh"
    one.write_bytes(b"echo one\n" * 100_000)
    one.chmod(0o750)
    # To a new path, then to an existing directory (it lands inside).
    ok(cp(server, tenant, str(one), f"{sandbox.id}:/tmp/cpf/renamed.sh"))
    ok(cp(server, tenant, str(one), f"{sandbox.id}:/tmp/cpf"))
    for path in ["/tmp/cpf/renamed.sh", "/tmp/cpf/one.sh"]:
        assert await sandbox.read_file(path) == one.read_bytes()
        assert (await sandbox.stat(path)).mode & 0o777 == 0o750
    # Back, into a local directory and to a local name.
    down = tmp_path / "down"
    down.mkdir()
    ok(cp(server, tenant, f"{sandbox.id}:/tmp/cpf/renamed.sh", str(down)))
    ok(cp(server, tenant, f"{sandbox.id}:/tmp/cpf/one.sh", str(down / "named.sh")))
    for name in ["renamed.sh", "named.sh"]:
        assert (down / name).read_bytes() == one.read_bytes()
        assert (down / name).stat().st_mode & 0o777 == 0o750
    assert sorted(p.name for p in down.iterdir()) == ["named.sh", "renamed.sh"]
    # Standard input and output carry a file's content.
    ok(cp(server, tenant, "-", f"{sandbox.id}:/tmp/cpf/piped", stdin=b"through a pipe\0\n"))
    assert await sandbox.read_file("/tmp/cpf/piped") == b"through a pipe\0\n"
    assert ok(cp(server, tenant, f"{sandbox.id}:/tmp/cpf/piped", "-")).stdout == b"through a pipe\0\n"


async def test_bad_copies_are_clear_errors_and_leave_nothing(
        server: Server, tenant: Tenant, sandbox: Sandbox, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    cases = [
        (str(tmp_path / "f"), f"{sandbox.id}:relative", "must be absolute"),
        (str(tmp_path / "f"), str(tmp_path / "g"), "neither end is in a sandbox"),
        (f"{sandbox.id}:/a", f"{sandbox.id}:/b", "both ends are in sandboxes"),
        (str(tmp_path / "missing"), f"{sandbox.id}:/tmp/x", "missing"),
        (f"{sandbox.id}:/no/such/file", str(tmp_path / "out"), "not_found"),
        (str(tmp_path / "f"), "nosuchnode.abcdefghjkmn:/tmp/x", "sandbox_not_found"),
    ]
    for src, dst, expected in cases:
        proc = cp(server, tenant, src, dst)
        assert proc.returncode != 0, (src, dst)
        assert expected in proc.stderr.decode(), (src, dst, proc.stderr.decode())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    assert not await sandbox.exists("/tmp/x")
