"""envd's filesystem service and ``/files`` through the unmodified SDK."""

from __future__ import annotations

import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException

pytestmark = pytest.mark.e2e


def test_files_upload_download(sbx: Sandbox) -> None:
    # Multipart (the SDK's default), octet-stream and gzip uploads.
    info = sbx.files.write("/tmp/e2b/a.txt", "alpha")
    assert (info.path, info.name) == ("/tmp/e2b/a.txt", "a.txt")
    sbx.files.write("/tmp/e2b/b.bin", b"\x00\x01beta", use_octet_stream=True)
    sbx.files.write("/tmp/e2b/c.txt", "gamma " * 1000, gzip=True)
    assert sbx.files.read("/tmp/e2b/a.txt") == "alpha"
    assert bytes(sbx.files.read("/tmp/e2b/b.bin", format="bytes")) == b"\x00\x01beta"
    assert sbx.files.read("/tmp/e2b/c.txt") == "gamma " * 1000
    many = sbx.files.write_files(
        [{"path": "/tmp/e2b/m1", "data": "1"}, {"path": "/tmp/e2b/m2", "data": "2"}]
    )
    assert sorted(w.path for w in many) == ["/tmp/e2b/m1", "/tmp/e2b/m2"]
    assert sbx.commands.run("cat /tmp/e2b/m1 /tmp/e2b/m2").stdout == "12"
    with pytest.raises(NotFoundException):
        sbx.files.read("/tmp/e2b/missing")


def test_filesystem_service(sbx: Sandbox) -> None:
    assert sbx.files.make_dir("/tmp/fs/sub/deep") is True
    assert sbx.files.make_dir("/tmp/fs/sub/deep") is False, "an existing path is already_exists"
    sbx.files.write("/tmp/fs/sub/f.txt", "12345")
    st = sbx.files.get_info("/tmp/fs/sub/f.txt")
    assert (st.name, st.type.value, st.size, st.path) == ("f.txt", "file", 5, "/tmp/fs/sub/f.txt")
    assert st.permissions == "-rw-r--r--"
    assert sbx.files.exists("/tmp/fs/sub/f.txt") and not sbx.files.exists("/tmp/fs/nope")
    top = sbx.files.list("/tmp/fs")
    assert [e.path for e in top] == ["/tmp/fs/sub"]
    walk = sbx.files.list("/tmp/fs", depth=3)
    assert [e.path for e in walk] == ["/tmp/fs/sub", "/tmp/fs/sub/deep", "/tmp/fs/sub/f.txt"]
    moved = sbx.files.rename("/tmp/fs/sub/f.txt", "/tmp/fs/g.txt")
    assert moved.path == "/tmp/fs/g.txt"
    assert sbx.files.read("/tmp/fs/g.txt") == "12345"
    sbx.files.remove("/tmp/fs")
    assert not sbx.files.exists("/tmp/fs")
    sbx.files.remove("/tmp/fs")  # a missing path: no error, as envd
    with pytest.raises(NotFoundException):
        sbx.files.get_info("/tmp/fs")
