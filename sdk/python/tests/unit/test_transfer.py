"""Directory downloads land whole or not at all (dsec._transfer)."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dsec import _transfer


def archive(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def pieces(data: bytes, cut_at: int | None = None) -> AsyncIterator[bytes]:
    step = 4096
    for i in range(0, len(data), step):
        if cut_at is not None and i >= cut_at:
            raise ConnectionResetError("the download was cut")
        yield data[i:i + step]


FILES = {f"d/f{i}": os.urandom(5000) for i in range(20)}


async def test_a_new_directory_appears_whole(tmp_path: Path) -> None:
    dest = tmp_path / "new" / "out"
    await _transfer.extract_tar_stream(pieces(archive(FILES)), dest)
    for name, data in FILES.items():
        assert (dest / name).read_bytes() == data
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["out"]
    mask = os.umask(0)
    os.umask(mask)
    assert (dest.stat().st_mode & 0o777) == 0o777 & ~mask


async def test_a_cut_download_leaves_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    data = archive(FILES)
    with pytest.raises(ConnectionResetError):
        await _transfer.extract_tar_stream(pieces(data, cut_at=len(data) // 2), dest)
    assert list(tmp_path.iterdir()) == []


async def test_an_existing_directory_is_extracted_into(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("kept")
    await _transfer.extract_tar_stream(pieces(archive(FILES)), tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "kept"
    assert (tmp_path / "d" / "f0").read_bytes() == FILES["d/f0"]
