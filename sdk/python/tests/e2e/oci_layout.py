"""Writes small but real OCI image layouts (busybox-based, two layers, one
deleting files of the other with whiteouts) for the image import tests.

The layout is what ``skopeo copy ... oci:DIR:TAG`` produces; the tests feed
it to skopeo to make a ``docker save`` archive and to push it to a
registry, so the real tools check the format too.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

BUSYBOX = "/bin/busybox"
APPLETS = ["sh", "cat", "ls", "env", "pwd", "echo", "sleep", "true", "id"]


def _tar(entries: list[tuple[str, str, bytes | str | None]]) -> bytes:
    """entries: (path, kind in file/dir/link/exe, content or link target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, kind, content in entries:
            info = tarfile.TarInfo(path)
            info.mtime = 1_700_000_000
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            elif kind == "link":
                info.type = tarfile.SYMTYPE
                info.linkname = str(content)
                info.mode = 0o777
                tar.addfile(info)
            else:
                data = content if isinstance(content, bytes) else str(content).encode()
                info.size = len(data)
                info.mode = 0o755 if kind == "exe" else 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _blob(root: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    path = root / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def layers() -> list[bytes]:
    """Base layer: busybox, passwd, files to delete later. Second layer:
    deletes /etc/secret (whiteout), hides /data/old's content (opaque) while
    adding a file to it, and adds a script."""
    busybox = Path(BUSYBOX).read_bytes()
    base: list[tuple[str, str, bytes | str | None]] = [
        (d, "dir", None) for d in ["bin", "etc", "proc", "sys", "dev", "tmp", "root", "work",
                                   "data", "data/old"]
    ]
    base += [("bin/busybox", "exe", busybox)]
    base += [(f"bin/{a}", "link", "busybox") for a in APPLETS]
    base += [
        ("etc/passwd", "file", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n"),
        ("etc/group", "file", "root:x:0:\nnogroup:x:65534:\n"),
        ("etc/secret", "file", "the answer\n"),
        ("data/old/a", "file", "a\n"),
        ("data/old/b", "file", "b\n"),
    ]
    top: list[tuple[str, str, bytes | str | None]] = [
        ("etc/.wh.secret", "file", b""),
        ("data/old/.wh..wh..opq", "file", b""),
        ("data/old/c", "file", "c\n"),
        ("bin/greet", "exe", '#!/bin/sh\necho "$GREETING from $(pwd)"\n'),
    ]
    return [_tar(base), _tar(top)]


def write_layout(root: Path, tag: str) -> Path:
    """An OCI image layout at ``root`` holding one image tagged ``tag``."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    tars = layers()
    layer_descs = []
    for t in tars:
        desc = _blob(root, gzip.compress(t, mtime=0))
        desc["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
        layer_descs.append(desc)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin", "GREETING=hello-from-oci"], "WorkingDir": "/work"},
        "rootfs": {"type": "layers",
                   "diff_ids": [f"sha256:{hashlib.sha256(t).hexdigest()}" for t in tars]},
    }
    config_desc = _blob(root, json.dumps(config).encode())
    config_desc["mediaType"] = "application/vnd.oci.image.config.v1+json"
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_desc, "layers": layer_descs}
    manifest_desc = _blob(root, json.dumps(manifest).encode())
    manifest_desc["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    manifest_desc["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2,
                                                 "manifests": [manifest_desc]}))
    return root
