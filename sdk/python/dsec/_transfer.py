"""Streaming tar archives between the local disk and the archive route.

Directories travel as uncompressed tar streams. Python's :mod:`tarfile` is
synchronous, so it runs in a worker thread, joined to the event loop by a
small bounded queue: memory stays at a few chunks whatever the directory's
size, and a slow side holds the other back instead of buffering.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import shutil
import tarfile
import tempfile
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any

__all__ = ["tar_directory", "extract_tar_stream", "CHUNK"]

#: Size of the pieces moved between the thread and the event loop.
CHUNK = 256 * 1024
_QUEUE_CHUNKS = 8


class _Aborted(Exception):
    """The other side gave up; the worker thread stops quietly."""


_END = object()


# --- upload: local directory -> tar stream ------------------------------------


class _ChunkWriter:
    """The file object tarfile writes to: gathers bytes into CHUNK pieces."""

    def __init__(self, put: Callable[[object], None]) -> None:
        self._put = put
        self._buf = bytearray()

    def write(self, b: bytes) -> int:
        self._buf += b
        if len(self._buf) >= CHUNK:
            self._put(bytes(self._buf))
            self._buf.clear()
        return len(b)

    def flush(self) -> None:
        if self._buf:
            self._put(bytes(self._buf))
            self._buf.clear()


def _clean_info(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # Local account names mean nothing inside the sandbox.
    info.uname = ""
    info.gname = ""
    return info


def _walk(root: Path) -> list[tuple[str, str]]:
    """(local path, name in the archive) for everything under root, parents
    first, without following symlinks (they are archived as links)."""
    items: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        for name in dirnames + sorted(filenames):
            arc = name if rel == "." else f"{rel}/{name}"
            items.append((os.path.join(dirpath, name), arc.replace(os.sep, "/")))
    return items


async def tar_directory(local_dir: str | os.PathLike[str]) -> AsyncGenerator[bytes, None]:
    """Yield a tar archive of the *contents* of ``local_dir``, chunk by chunk.

    Entry names are relative to ``local_dir``, so extracting the archive into
    a directory makes that directory mirror ``local_dir``.
    """
    root = Path(local_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"not a directory: {root}")
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[Any] = asyncio.Queue(maxsize=_QUEUE_CHUNKS)
    stop = threading.Event()

    def put(item: object) -> None:
        fut = asyncio.run_coroutine_threadsafe(chunks.put(item), loop)
        while True:
            try:
                fut.result(timeout=0.2)
                return
            except concurrent.futures.TimeoutError:
                if stop.is_set():
                    fut.cancel()
                    raise _Aborted() from None

    def produce() -> None:
        try:
            writer = _ChunkWriter(put)
            with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tf:  # type: ignore[call-overload]
                for path, arc in _walk(root):
                    if stop.is_set():
                        raise _Aborted()
                    tf.add(path, arcname=arc, recursive=False, filter=_clean_info)
            writer.flush()
            put(_END)
        except _Aborted:
            pass
        except BaseException as e:  # handed to the event loop, raised there
            try:
                put(e)
            except (_Aborted, RuntimeError):
                pass

    thread = threading.Thread(target=produce, name="dsec-tar-writer", daemon=True)
    thread.start()
    try:
        while True:
            item = await chunks.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


# --- download: tar stream -> local directory ----------------------------------


class _ChunkReader:
    """The file object tarfile reads from: pulls chunks from a thread queue."""

    def __init__(self, q: queue.Queue[Any]) -> None:
        self._q = q
        self._buf = bytearray()
        self._eof = False

    def read(self, n: int = -1) -> bytes:
        while not self._eof and (n < 0 or len(self._buf) < n):
            item = self._q.get()
            if item is _END:
                self._eof = True
            elif isinstance(item, BaseException):
                raise item
            else:
                self._buf += item
        if n < 0 or n >= len(self._buf):
            data = bytes(self._buf)
            self._buf.clear()
        else:
            data = bytes(self._buf[:n])
            del self._buf[:n]
        return data


def _member_filter() -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo | None]:
    """A safe extraction filter: no absolute paths, nothing outside the
    destination (symlinks included), no device nodes."""
    tar_filter = getattr(tarfile, "tar_filter", None)

    def check(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        if member.ischr() or member.isblk():
            return None
        if tar_filter is not None:
            # tar_filter refuses names that resolve outside dest (through
            # symlinks already on disk, too) but keeps absolute symlink
            # targets, which are common and harmless in a tree copied out.
            return tar_filter(member, dest)  # type: ignore[no-any-return]
        name = member.name
        if os.path.isabs(name) or ".." in Path(name).parts:
            raise tarfile.TarError(f"refusing archive member outside the destination: {name!r}")
        target = os.path.realpath(os.path.join(dest, name))
        if os.path.commonpath([target, os.path.realpath(dest)]) != os.path.realpath(dest):
            raise tarfile.TarError(f"refusing archive member outside the destination: {name!r}")
        return member

    return check


def _extract(reader: _ChunkReader, dest: str) -> None:
    check = _member_filter()
    has_filters = hasattr(tarfile, "data_filter")
    with tarfile.open(fileobj=reader, mode="r|") as tf:  # type: ignore[call-overload]
        for member in tf:
            if has_filters:
                tf.extract(member, dest, filter=check)
            else:
                safe = check(member, dest)
                if safe is not None:
                    tf.extract(safe, dest)


async def extract_tar_stream(chunks: AsyncIterator[bytes],
                             local_dir: str | os.PathLike[str]) -> None:
    """Extract the tar archive arriving as ``chunks`` into ``local_dir``
    (created if missing), without holding the archive in memory.

    A directory that does not exist yet is extracted beside it under a
    temporary name and renamed when the archive ends: if the stream fails,
    nothing is left. An existing directory is extracted into in place."""
    dest = os.fspath(local_dir)
    if os.path.isdir(dest):
        await _extract_stream(chunks, dest)
        return
    parent, name = os.path.split(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}.dsec-part-", dir=parent)
    try:
        await _extract_stream(chunks, staging)
        os.chmod(staging, 0o777 & ~_umask())
        os.rename(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would change
    it for every thread for a moment)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


async def _extract_stream(chunks: AsyncIterator[bytes], dest: str) -> None:
    loop = asyncio.get_running_loop()
    q: queue.Queue[Any] = queue.Queue(maxsize=_QUEUE_CHUNKS)
    reader = _ChunkReader(q)
    done = loop.run_in_executor(None, _extract, reader, dest)

    async def feed(item: object) -> bool:
        """Queue item; False once the extractor has stopped reading."""
        while True:
            if done.done():
                return False
            try:
                q.put_nowait(item)
                return True
            except queue.Full:
                # Disk slower than network: wait for the thread to catch up.
                await asyncio.sleep(0.002)

    try:
        async for chunk in chunks:
            if not await feed(chunk):
                break
        await feed(_END)
    except BaseException:
        # Unblock the thread (it may be waiting for data), then re-raise.
        while True:
            try:
                q.put_nowait(_Aborted())
                break
            except queue.Full:
                try:
                    q.get_nowait()
                except queue.Empty:
                    pass
        try:
            await done
        except BaseException:
            pass
        raise
    await done
