"""3FS's native user-space I/O (USRBIO) behind the backend registry.

On a 3FS mount, data moves through shared-memory rings that the 3FS FUSE daemon serves
(``hf3fs_fuse.io`` from the ``hf3fs-py-usrbio`` package) instead of FUSE read/write:
no FUSE round trip per request, no FUSE size limit, RDMA straight into our buffers.
Large preallocated segment files suit it: each file is registered once (``register_fd``)
for as long as it stays open.

**This path cannot run on the development and CI machines** (no 3FS cluster, and the
package does not build without 3FS's client library), so it is written against the
published API and kept behind the same conformance suite: with ``KVSTORE_3FS_MOUNT``
set to a directory on a 3FS mount, ``tests/conformance`` adds a ``sharedfs-usrbio``
tier. ``hf3fs-py-usrbio`` is not a dependency; ``auto`` picks this backend only when the
mount is 3FS (statfs magic) and the module imports.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from storage_nodes.sharedfs.config import ALIGN_BYTES
from storage_nodes.sharedfs.errors import BackendUnavailable
from storage_nodes.sharedfs.io_backend import IOBackend, IORequest

HF3FS_SUPER_MAGIC = 0x8F3F5FFF


class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 112)]


def is_3fs(path: Path) -> bool:
    """Whether ``path`` lies on a 3FS mount (statfs ``f_type``)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        st = _StatFs()
        if libc.statfs(os.fsencode(str(path)), ctypes.byref(st)) != 0:
            return False
        return (st.f_type & 0xFFFFFFFF) == HF3FS_SUPER_MAGIC
    except OSError:
        return False


def _import_usrbio() -> Any:
    try:
        import hf3fs_fuse.io as h3io  # type: ignore[import-not-found]
    except ImportError as e:
        raise BackendUnavailable(
            f"hf3fs-py-usrbio is not installed ({e}); pip install hf3fs-py-usrbio on a 3FS "
            "client host"
        ) from None
    return h3io


class UsrbioBackend(IOBackend):
    """One registered shared-memory region carved into staging buffers, one read and
    one write ring of ``queue_depth`` entries; requests are prepared in batches of the
    ring size and reaped together. Descriptors are registered on open."""

    name = "usrbio"
    direct = True  # no page cache between us and 3FS

    def __init__(self, root: Path, queue_depth: int, region_bytes: int = 256 << 20) -> None:
        if not is_3fs(root):
            raise BackendUnavailable(f"{root} is not on a 3FS mount")
        from multiprocessing.shared_memory import SharedMemory

        self._h3 = _import_usrbio()
        self._mount = self._h3.extract_mount_point(str(root))
        self._shm = SharedMemory(size=region_bytes, create=True)
        self._iov = self._h3.make_iovec(self._shm, self._mount, 0, -1)
        self._shm.unlink()  # the iovec keeps the mapping; nothing left in /dev/shm
        self._entries = max(1, queue_depth)
        self._rring = self._h3.make_ioring(self._mount, self._entries, True, 0)
        self._wring = self._h3.make_ioring(self._mount, self._entries, False, 0)
        assert self._shm.buf is not None
        self._region = memoryview(self._shm.buf)
        self._free: list[tuple[int, int]] = [(0, region_bytes)]  # (offset, length)
        self._lent: dict[int, tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._ring_lock = threading.Lock()

    def open(self, path: Path, *, write: bool, create: bool = False) -> int:
        flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        fd = os.open(path, flags, 0o640)
        try:
            self._h3.register_fd(fd)
        except Exception:
            os.close(fd)
            raise
        return fd

    def close_fd(self, fd: int) -> None:
        try:
            self._h3.deregister_fd(fd)
        finally:
            os.close(fd)

    def alloc(self, nbytes: int) -> memoryview:
        want = -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES
        with self._lock:
            for i, (off, length) in enumerate(self._free):
                if length >= want:
                    self._free[i : i + 1] = [(off + want, length - want)] if length > want else []
                    mv = self._region[off : off + nbytes]
                    self._lent[id(mv)] = (off, want)
                    return mv
        raise BackendUnavailable(f"USRBIO staging region exhausted ({nbytes} bytes asked)")

    def free(self, buf: memoryview) -> None:
        with self._lock:
            span = self._lent.pop(id(buf), None)
            if span is not None:
                self._free.append(span)
                self._free.sort()
                merged: list[tuple[int, int]] = []
                for off, length in self._free:
                    if merged and merged[-1][0] + merged[-1][1] == off:
                        merged[-1] = (merged[-1][0], merged[-1][1] + length)
                    else:
                        merged.append((off, length))
                self._free = merged

    def _offset_of(self, buf: memoryview) -> int:
        base = ctypes.addressof(ctypes.c_char.from_buffer(self._region))
        return ctypes.addressof(ctypes.c_char.from_buffer(buf)) - base

    def _run(self, ring: Any, reqs: Sequence[IORequest], read: bool) -> list[int]:
        out = [-errno.EIO] * len(reqs)
        with self._ring_lock:
            for start in range(0, len(reqs), self._entries):
                part = reqs[start : start + self._entries]
                for j, r in enumerate(part):
                    off = self._offset_of(r.buf)
                    ring.prepare(self._iov[off : off + len(r.buf)], read, r.fd, r.offset,
                                 userdata=start + j)
                for done in ring.submit().wait(min_results=len(part)):
                    i = done.userdata
                    res = done.result
                    out[i] = res if res < 0 else (res if res == len(reqs[i].buf) else -errno.EIO)
        return out

    def read_batch(self, reqs: Sequence[IORequest],
                   on_done: Callable[[int, int], None] | None = None) -> list[int]:
        out = self._run(self._rring, reqs, True)
        if on_done is not None:  # the ring completes a whole batch: check after it
            for i, res in enumerate(out):
                on_done(i, res)
        return out

    def write_batch(self, reqs: Sequence[IORequest],
                    prepare: Callable[[int], None] | None = None) -> list[int]:
        if prepare is not None:
            for i in range(len(reqs)):
                prepare(i)
        return self._run(self._wring, reqs, False)

    def close(self) -> None:
        self._rring = self._wring = None
        self._iov = None
        self._region.release()
        self._shm.close()
