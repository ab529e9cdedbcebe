"""Slab files and aligned staging memory.

A slab is one file of ``slab_bytes``, the unit in which capacity moves between size
classes; it is cut into fixed slots of one class (encoded block rounded up to 4 KiB).
Slab files are preallocated so ENOSPC shows up when a slab is created, not in the
middle of a write, and so a write never extends a file (no size metadata to sync).
"""

from __future__ import annotations

import errno
import mmap
import os
import resource
import threading
from pathlib import Path

from storage_nodes.ssd.config import ALIGN_BYTES
from storage_nodes.ssd.errors import SSDConfigError, SSDIOError


class StagingPool:
    """Page-aligned anonymous buffers (mmap), reused between calls.

    O_DIRECT needs aligned memory; anonymous mmaps are page aligned. Buffers are never
    unmapped: the io_uring binding pins every buffer it is handed (see
    ``uring._IovecCache``), so a dropped buffer would only leak. Their number is bounded
    by the calls in flight at once, times the distinct power-of-two sizes asked for.
    """

    def __init__(self) -> None:
        self._idle: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def acquire(self, nbytes: int) -> mmap.mmap:
        with self._lock:
            for i, m in enumerate(self._idle):
                if len(m) >= nbytes:
                    return self._idle.pop(i)
        size = max(1 << 20, 1 << (max(nbytes, 1) - 1).bit_length())
        return mmap.mmap(-1, size)

    def release(self, m: mmap.mmap) -> None:
        with self._lock:
            self._idle.append(m)
            self._idle.sort(key=len)


class SlabFiles:
    """The open descriptors of ``DIR/slabs/slab-NNNNN``; thread-safe."""

    def __init__(
        self, directory: Path, slab_bytes: int, direct_io: bool | None, max_slabs: int = 0
    ) -> None:
        _allow_open_files(max_slabs + 256)  # every slab keeps its descriptor open
        self.dir = Path(directory) / "slabs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.slab_bytes = slab_bytes
        supported = probe_direct_io(self.dir)
        if direct_io is True and not supported:
            raise SSDConfigError(f"O_DIRECT is refused by the file system under {self.dir}")
        self.direct = supported if direct_io is None else direct_io
        self.direct_refused = direct_io is None and not supported
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def path(self, slab: int) -> Path:
        return self.dir / f"slab-{slab:05d}"

    def _flags(self) -> int:
        return os.O_RDWR | os.O_CLOEXEC | (os.O_DIRECT if self.direct else 0)

    def create(self, slab: int) -> None:
        """Create (or recycle an orphan of a crash) and preallocate; durable on return."""
        try:
            fd = os.open(self.path(slab), self._flags() | os.O_CREAT, 0o644)
            try:
                os.posix_fallocate(fd, 0, self.slab_bytes)
                os.fsync(fd)
            except BaseException:
                os.close(fd)
                raise
            _fsync_dir(self.dir)
        except OSError as e:
            raise SSDIOError(
                f"cannot create slab {self.path(slab)}: {e.strerror}", e.errno or errno.EIO
            ) from e
        with self._lock:
            old = self._fds.pop(slab, None)
            self._fds[slab] = fd
        if old is not None:
            os.close(old)

    def fd(self, slab: int) -> int:
        with self._lock:
            fd = self._fds.get(slab)
            if fd is not None:
                return fd
        try:
            fd = os.open(self.path(slab), self._flags())
        except OSError as e:
            raise SSDIOError(
                f"cannot open slab {self.path(slab)}: {e.strerror}", e.errno or errno.EIO
            ) from e
        with self._lock:
            if slab in self._fds:  # another thread won the race
                os.close(fd)
                return self._fds[slab]
            self._fds[slab] = fd
            return fd

    def size_of(self, slab: int) -> int:
        try:
            return self.path(slab).stat().st_size
        except FileNotFoundError:
            return -1

    def close(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)


def _allow_open_files(n: int) -> None:
    """Raise the soft RLIMIT_NOFILE towards ``n`` (never above the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < n:
        cap = n if hard == resource.RLIM_INFINITY else min(n, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, cap), hard))


def probe_direct_io(directory: Path) -> bool:
    """Whether aligned O_DIRECT I/O works here (tmpfs refuses the open with EINVAL)."""
    probe = Path(directory) / ".direct-probe"
    buf = mmap.mmap(-1, ALIGN_BYTES)
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT | os.O_CLOEXEC, 0o644)
    except OSError:
        return False
    try:
        view = memoryview(buf)
        ok = os.pwritev(fd, [view], 0) == ALIGN_BYTES and os.preadv(fd, [view], 0) == ALIGN_BYTES
        view.release()
        return ok
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
        buf.close()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
