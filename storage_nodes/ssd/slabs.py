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
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from storage_nodes.ssd.config import ALIGN_BYTES
from storage_nodes.ssd.errors import SSDConfigError, SSDIOError


class SlabFiles:
    """The open descriptors of ``DIR/slabs/slab-NNNNN``; thread-safe."""

    def __init__(
        self, directory: Path, slab_bytes: int, direct_io: bool | None, max_slabs: int = 0
    ) -> None:
        _allow_open_files(max_slabs + 256)  # every slab keeps its descriptor open
        self.dir = Path(directory) / "slabs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.slab_bytes = slab_bytes
        probe = probe_io(self.dir)
        supported = probe.direct
        #: False when the file system refused a 4 KiB write at open (a full disk): the
        #: tier then starts read-only and probes until writes are accepted again.
        self.room_at_open = probe.room
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
        """Create (or recycle an orphan of a crash) and preallocate; durable on return.
        A failure removes the file: a preallocation cut short by a full disk would
        otherwise keep the blocks it got, and the disk stays full across restarts. Only
        slabs no index record names are ever created, so removing one loses nothing."""
        path = self.path(slab)
        try:
            fd = os.open(path, self._flags() | os.O_CREAT, 0o644)
            try:
                os.posix_fallocate(fd, 0, self.slab_bytes)
                os.fsync(fd)
            except BaseException:
                os.close(fd)
                with suppress(OSError):
                    path.unlink(missing_ok=True)
                    _fsync_dir(self.dir)
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

    def open_probe(self) -> int:
        """A scratch file beside the slabs, opened as they are (a degraded tier's probe)."""
        return os.open(self.dir / ".probe", self._flags() | os.O_CREAT, 0o644)

    def drop_probe(self, fd: int) -> None:
        os.close(fd)
        with suppress(OSError):
            (self.dir / ".probe").unlink(missing_ok=True)

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


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@dataclass(frozen=True, slots=True)
class IOProbe:
    """What a directory's file system allows: aligned O_DIRECT I/O (``direct``), and
    whether it takes a new 4 KiB write at all (``room``: False on a full disk)."""

    direct: bool
    room: bool


def probe_io(directory: Path) -> IOProbe:
    """Write, sync and read back 4 KiB in a probe file, with O_DIRECT where the open
    accepts it (tmpfs refuses it with EINVAL). A full disk is an answer, never an error:
    O_DIRECT is then assumed from the open alone, and ``room`` is False."""
    direct = _probe_once(Path(directory), os.O_DIRECT)
    if direct is False:
        room = _probe_once(Path(directory), 0) is not None
        return IOProbe(direct=False, room=room)
    return IOProbe(direct=True, room=direct is not None)


def _probe_once(directory: Path, flags: int) -> bool | None:
    """True: the open, write, sync and read worked; False: refused (not for lack of
    space); None: the file system is full."""
    probe = directory / ".direct-probe"
    buf = mmap.mmap(-1, ALIGN_BYTES)
    view = memoryview(buf)
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | flags, 0o644)
    except OSError as e:
        view.release()
        buf.close()
        return None if e.errno in FULL_ERRNOS else False
    try:
        ok = os.pwritev(fd, [view], 0) == ALIGN_BYTES
        os.fdatasync(fd)
        return ok and os.preadv(fd, [view], 0) == ALIGN_BYTES
    except OSError as e:
        return None if e.errno in FULL_ERRNOS else False
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
        view.release()  # before close: an exported view would make close() raise
        buf.close()


def probe_direct_io(directory: Path) -> bool:
    """Whether aligned O_DIRECT I/O works here."""
    return probe_io(directory).direct


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
