"""How segment bytes move: the I/O backend contract and the small POSIX default
(the registry that picks one is ``backends.py``).

The tier hands a backend whole batches (a ``get_into`` of 32 blocks is one call with 32
reads) so that a distributed file system sees ``queue_depth`` requests in flight, as
``fio --iodepth`` gives it. Per-request failures come back as negative errnos; a backend
raises only when it cannot run at all. Buffers come from the backend (``alloc``):
O_DIRECT needs aligned memory, and 3FS's USRBIO needs memory registered with its FUSE
daemon (``usrbio.py``).

``posix`` is self-contained on purpose (``os.preadv``/``os.pwritev`` on a thread pool,
O_DIRECT where the file system accepts it): FUSE file systems complete requests
synchronously in the calling thread, so threads are what puts requests in flight.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

from kvstore.buffers import BufferPool
from kvstore.slot_io import IORequest, full_transfer
from storage_nodes.sharedfs.config import ALIGN_BYTES

log = logging.getLogger("storage_nodes.sharedfs")

__all__ = ["IOBackend", "IORequest", "PosixBackend", "probe_direct_io", "probe_user_memory"]


class IOBackend(ABC):
    """Contract:

    * ``open`` returns a descriptor usable by this backend (O_DIRECT when ``direct``);
      ``close_fd`` releases it. Own segments are opened writable, peers' read-only.
    * Request memory comes from ``alloc``; where ``user_memory`` is set, any writable
      memory also works (a slot's payload then moves straight between the file and the
      caller's row, scattered/gathered with its header: no staging copy). A request in
      such memory that fails with ``EINVAL`` means it does not after all (a FUSE client
      splits at page boundaries of the memory, and GlusterFS hands the pieces to O_DIRECT
      on its bricks): the caller then calls ``refuse_user_memory`` and redoes the batch
      through ``alloc``'d memory.
    * ``read_batch``/``write_batch`` perform every request and return per request the
      bytes transferred (full transfers; short ones are retried, EOF is ``-EIO``) or a
      negative errno, in request order.
    * ``read_batch(reqs, on_done)`` calls ``on_done(i, result)`` once per request after
      it completes and before returning; ``write_batch(reqs, prepare)`` calls
      ``prepare(i)`` once per request before it is issued. Both may run on backend
      threads, concurrently with each other and with requests in flight (that is their
      point: checking and encoding overlap the I/O); their exceptions propagate.
    * ``sync(fds)`` makes completed writes durable and visible to other clients of the
      file system (``fdatasync``: segments are sized once and never extended, so no
      metadata needs to follow; a FUSE client flushes its write cache); 0 or -errno per fd.
    * ``fresh(fd, offset, length)`` is called before reading a range another host may
      have rewritten: without O_DIRECT it drops the cached pages (a FUSE page cache can
      serve a stale copy indefinitely, GlusterFS does).
    * Thread-safe.
    """

    name: ClassVar[str]
    direct: bool = False
    user_memory: bool = False

    @abstractmethod
    def open(self, path: Path, *, write: bool, create: bool = False) -> int: ...

    def close_fd(self, fd: int) -> None:
        os.close(fd)

    @abstractmethod
    def alloc(self, nbytes: int) -> memoryview: ...

    @abstractmethod
    def free(self, buf: memoryview) -> None: ...

    @abstractmethod
    def read_batch(self, reqs: Sequence[IORequest],
                   on_done: Callable[[int, int], None] | None = None) -> list[int]: ...

    @abstractmethod
    def write_batch(self, reqs: Sequence[IORequest],
                    prepare: Callable[[int], None] | None = None) -> list[int]: ...

    def sync(self, fds: Sequence[int]) -> list[int]:
        return _run_each(os.fdatasync, fds)

    def refuse_user_memory(self) -> None:
        if self.user_memory:
            self.user_memory = False
            log.warning("shared-fs %s backend: the file system refused a transfer in "
                        "caller memory; staging every slot from now on", self.name)

    def fresh(self, fd: int, offset: int, length: int) -> None:
        if not self.direct:  # advisory: a stale copy is then caught by the header check
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)

    @abstractmethod
    def close(self) -> None:
        """Release threads and memory; idempotent."""


class PosixBackend(IOBackend):
    name = "posix"

    def __init__(self, queue_depth: int, direct: bool, user_memory: bool = False) -> None:
        self.direct = direct
        # The page cache takes any memory; O_DIRECT only where the probe said so (FUSE
        # file systems do, a local disk wants aligned memory).
        self.user_memory = user_memory or not direct
        self._pool = ThreadPoolExecutor(max(1, queue_depth), thread_name_prefix="sharedfs-io")
        self._buffers = BufferPool()  # page aligned, as O_DIRECT needs; huge pages
        self._lent: dict[int, mmap.mmap] = {}
        self._lock = threading.Lock()
        self._closed = False

    def open(self, path: Path, *, write: bool, create: bool = False) -> int:
        flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        if self.direct:
            flags |= os.O_DIRECT
        return os.open(path, flags, 0o640)

    def alloc(self, nbytes: int) -> memoryview:
        m = self._buffers.acquire(nbytes)
        mv = memoryview(m)[:nbytes]
        with self._lock:
            self._lent[id(mv)] = m
        return mv

    def free(self, buf: memoryview) -> None:
        with self._lock:
            m = self._lent.pop(id(buf), None)
        if m is not None:
            self._buffers.release(m)

    def _batch(self, op: Callable[[int], int], n: int) -> list[int]:
        if n <= 1:
            return [op(i) for i in range(n)]
        return list(self._pool.map(op, range(n)))

    def read_batch(self, reqs: Sequence[IORequest],
                   on_done: Callable[[int, int], None] | None = None) -> list[int]:
        def op(i: int) -> int:
            res = _pread_full(reqs[i])
            if on_done is not None:
                on_done(i, res)
            return res

        return self._batch(op, len(reqs))

    def write_batch(self, reqs: Sequence[IORequest],
                    prepare: Callable[[int], None] | None = None) -> list[int]:
        def op(i: int) -> int:
            if prepare is not None:
                prepare(i)
            return _pwrite_full(reqs[i])

        return self._batch(op, len(reqs))

    def sync(self, fds: Sequence[int]) -> list[int]:
        if len(fds) <= 1:
            return _run_each(os.fdatasync, fds)
        return list(self._pool.map(lambda fd: _run_each(os.fsync, [fd])[0], fds))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._buffers.close()
        self._pool.shutdown(wait=True)


def _pread_full(r: IORequest) -> int:
    return full_transfer(os.preadv, r)


def _pwrite_full(r: IORequest) -> int:
    return full_transfer(os.pwritev, r)


def _run_each(fn: Callable[[int], object], fds: Sequence[int]) -> list[int]:
    out = []
    for fd in fds:
        try:
            fn(fd)
            out.append(0)
        except OSError as e:
            out.append(-(e.errno or errno.EIO))
    return out


def probe_direct_io(directory: Path) -> bool:
    """Whether an aligned O_DIRECT write and read work in ``directory`` (FUSE file
    systems differ: MooseFS and GlusterFS accept it, tmpfs refuses)."""
    path = directory / f".direct-probe-{os.getpid()}-{threading.get_ident()}"
    buf = mmap.mmap(-1, ALIGN_BYTES)
    buf[:8] = b"kvprobe1"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        if os.pwritev(fd, [buf], 0) != ALIGN_BYTES:
            return False
        back = mmap.mmap(-1, ALIGN_BYTES)
        return os.preadv(fd, [back], 0) == ALIGN_BYTES and back[:8] == b"kvprobe1"
    except OSError:
        return False
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)


def probe_user_memory(directory: Path) -> bool:
    """Whether O_DIRECT moves a transfer whose memory is unaligned and scattered (a
    64-byte header, then a row anywhere in the caller's memory; a length that is not
    whole pages, as a slot's header and payload without its padding) in ``directory``.
    FUSE copies through its daemon and takes any memory, but splits a transfer at page
    boundaries of that memory: MooseFS takes the unaligned pieces, GlusterFS hands them
    to O_DIRECT on its bricks, which refuse them. So the probe is larger than any FUSE
    request (2 MiB), as a slot's transfer is."""
    path = directory / f".memory-probe-{os.getpid()}-{threading.get_ident()}"
    head, body = 64, 2 << 20
    raw = bytearray(head + body + 64)
    out = memoryview(raw)
    src = [out[:head], out[head + 13 : head + 13 + body]]
    for i, b in enumerate(src):
        b[:] = bytes([i + 1]) * len(b)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    ok = False
    try:
        want = b"".join(bytes(b) for b in src)
        if os.pwritev(fd, src, 0) == len(want):
            back = bytearray(len(want) + 5)
            dst = [memoryview(back)[5 : 5 + head], memoryview(back)[5 + head :]]
            ok = os.preadv(fd, dst, 0) == len(want) and bytes(back[5:]) == want
    except OSError:
        pass
    finally:
        try:
            os.close(fd)  # GlusterFS reports a refused write here too
        except OSError:
            ok = False
        with contextlib.suppress(OSError):
            os.unlink(path)
    return ok
