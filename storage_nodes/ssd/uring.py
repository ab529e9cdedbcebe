"""The io_uring backend, through the ``liburing`` package (Python bindings of C liburing).

One engine runs every batch: it keeps up to ``queue_depth`` requests in flight, refills
the ring as completions are reaped, and
runs the caller's per-request work while the device is busy — encoding the next blocks
before their writes are submitted, verifying each read as it lands. A data sync rides in
the same ring as the writes it covers: one ``fsync`` SQE per file, submitted as soon as
every write to that file has completed, so the syncs of files whose writes finished
early overlap the later writes (a put touches ~15 slab files: a drained sync each used to
make that 15 device flushes in a row after the last write). Rings are not thread-safe, so
a small pool hands each concurrent caller its own.

Waiting for completions releases the GIL (``_wait_cqes``): the binding's own wait calls
hold it while blocked, which stalled the encoder thread (its next copy could not start
while the writer slept in the kernel) and every other request of the process.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence

import liburing as lu

from kvstore.buffers import buffer_address
from storage_nodes.ssd.io_backend import IOBackend, IORequest, OnDone

_READ, _WRITE = 0, 1
#: while encoding writes or building reads, hand the kernel requests this often: the
#: device starts on the first ones while the rest are still being prepared
_SUBMIT_EVERY = 4


class _RingSlot:
    def __init__(self, entries: int) -> None:
        self.ring = lu.Ring()
        lu.io_uring_queue_init(entries, self.ring)  # raises OSError where io_uring is refused
        self.cqe = lu.Cqe()
        self.iovecs = _RawIovecs(entries) if RAW_IOVECS else None

    def close(self) -> None:
        lu.io_uring_queue_exit(self.ring)


class UringBackend(IOBackend):
    name = "uring"

    def __init__(self, queue_depth: int = 32) -> None:
        self.queue_depth = queue_depth
        self.vectored = RAW_IOVECS
        self._lock = threading.Lock()
        self._idle: list[_RingSlot] = [_RingSlot(queue_depth + 8)]
        self._closed = False
        #: io_uring_submit calls that handed the kernel new requests (tests check that a
        #: batch of N <= queue_depth reads is one submission); approximate under threads.
        self.submissions = 0

    def _acquire(self) -> _RingSlot:
        with self._lock:
            if self._closed:
                raise OSError(errno.EBADF, "io_uring backend is closed")
            if self._idle:
                return self._idle.pop()
        return _RingSlot(self.queue_depth + 8)  # room for the fsync SQEs beside a full queue

    def _release(self, slot: _RingSlot) -> None:
        with self._lock:
            if self._closed:
                slot.close()
            else:
                self._idle.append(slot)

    def read_batch(self, reqs: Sequence[IORequest], on_done: OnDone | None = None) -> list[int]:
        return self._run(_READ, reqs, on_done=on_done)[0]

    def write_batch(self, reqs: Sequence[IORequest]) -> list[int]:
        return self._run(_WRITE, reqs)[0]

    def sync(self, fds: Sequence[int]) -> list[int]:
        return self._run(_WRITE, [], sync_fds=fds)[1]

    def write_and_sync(
        self,
        reqs: Sequence[IORequest],
        fds: Sequence[int],
        *,
        prepare: Callable[[int], None] | None = None,
        between: Callable[[], None] | None = None,
    ) -> tuple[list[int], list[int]]:
        res, synced = self._run(_WRITE, reqs, sync_fds=fds, prepare=prepare, between=between)
        return res, ([] if any(r < 0 for r in res) else synced)

    def _run(
        self,
        op: int,
        reqs: Sequence[IORequest],
        *,
        sync_fds: Sequence[int] = (),
        prepare: Callable[[int], None] | None = None,
        between: Callable[[], None] | None = None,
        on_done: OnDone | None = None,
    ) -> tuple[list[int], list[int]]:
        n = len(reqs)
        if not self.vectored and any(r.head is not None or r.more for r in reqs):
            raise ValueError("this build of liburing cannot take vectored requests")
        results = [0] * n
        synced = [0] * len(sync_fds)
        done = [0] * n  # bytes transferred so far per request (short transfers resume)
        pending = deque(range(n))
        keep: list[lu.Iovec | None] = [None] * n  # iovecs must outlive their requests
        # each request as first taken from ``reqs``: the reaping below reads it again
        # without indexing ``reqs`` (for a lazy batch every index is a Python call)
        taken: list[IORequest | None] = [None] * n
        slot = self._acquire()
        ring, raw = slot.ring, slot.iovecs
        inflight = unsubmitted = 0
        # A file's sync goes in once every write to it has completed (not after the
        # whole batch): the syncs of files whose writes finished early run beside the
        # later writes. Writes still to complete, per file to be synced:
        unwritten = dict.fromkeys(sync_fds, 0)
        for r in reqs if sync_fds else ():  # reads: a lazy batch is built as submitted
            if r.fd in unwritten:
                unwritten[r.fd] += 1
        to_sync = deque(j for j, fd in enumerate(sync_fds) if not unwritten[fd])
        between_done = between is None
        error: BaseException | None = None
        prep_rw = lu.io_uring_prep_readv if op == _READ else lu.io_uring_prep_writev
        try:
            while True:
                while pending and inflight < self.queue_depth and error is None:
                    i = pending.popleft()
                    if prepare is not None and done[i] == 0:
                        try:
                            prepare(i)
                        except BaseException as e:  # stop submitting, drain, then raise
                            error = e
                            pending.clear()
                            break
                    r = taken[i] or reqs[i]
                    taken[i] = r
                    sqe = _get_sqe(ring)
                    if r.head is None and not r.more:
                        iov = _IOVECS.get(r.buf[done[i] :] if done[i] else r.buf)
                        keep[i] = iov
                        prep_rw(sqe, r.fd, iov, r.offset + done[i])
                    else:  # caller memory: an iovec of this ring's own, never cached
                        raw.prep(prep_rw, sqe, i, r, done[i])  # type: ignore[union-attr]
                    lu.io_uring_sqe_set_data64(sqe, i)
                    inflight += 1
                    unsubmitted += 1
                    if (prepare is not None or op == _READ) and unsubmitted >= _SUBMIT_EVERY:
                        _submit(ring)
                        self.submissions += 1
                        unsubmitted = 0
                while to_sync and error is None:
                    j = to_sync.popleft()
                    sqe = _get_sqe(ring)
                    lu.io_uring_prep_fsync(sqe, sync_fds[j], lu.IORING_FSYNC_DATASYNC)
                    lu.io_uring_sqe_set_data64(sqe, n + j)
                    inflight += 1
                    unsubmitted += 1
                if not between_done and not pending and error is None:
                    if unsubmitted:
                        _submit(ring)
                        self.submissions += 1
                        unsubmitted = 0
                    between_done = True
                    try:
                        between()  # type: ignore[misc]
                    except BaseException as e:
                        error = error or e
                if inflight == 0:
                    break
                if unsubmitted:
                    _submit(ring)
                    self.submissions += 1
                    unsubmitted = 0
                _wait_cqes(ring)
                reaped: list[tuple[int, int]] = []
                cqe = slot.cqe
                for _ in lu.CqeIter(ring, cqe):
                    entry = cqe[0]
                    try:
                        res = entry.res
                    except OSError as e:  # the binding raises for negative results
                        res = -(e.errno or errno.EIO)
                    reaped.append((entry.user_data, res))
                lu.io_uring_cq_advance(ring, len(reaped))
                inflight -= len(reaped)
                for i, res in reaped:
                    if i >= n:
                        synced[i - n] = min(res, 0)
                        continue
                    r = taken[i]  # type: ignore[assignment]
                    if raw is not None and r.head is not None:
                        raw.release(i)
                    if res > 0:
                        done[i] += res
                        if done[i] < r.nbytes:
                            pending.append(i)  # short transfer: resubmit the rest
                            continue
                        res = done[i]
                    elif res == 0:
                        res = -errno.EIO  # EOF inside a preallocated slab
                    results[i] = res
                    fd = r.fd
                    if fd in unwritten:
                        unwritten[fd] -= 1
                        if not unwritten[fd]:
                            to_sync.extend(j for j, f in enumerate(sync_fds) if f == fd)
                    if on_done is not None and error is None:
                        try:
                            on_done(i, res)
                        except BaseException as e:
                            error = e
        except BaseException:
            # Only reached if the ring itself failed: requests may still be in flight, so
            # this ring (and the buffers it names) must never be reused.
            raise
        else:
            self._release(slot)
        if error is not None:
            raise error
        return results, synced

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            rings, self._idle = self._idle, []
        for r in rings:
            r.close()


class _IovecCache:
    """One ``lu.Iovec`` per distinct buffer region, built once and reused.

    liburing's ``Iovec`` takes a reference to (and a buffer export of) every buffer it is
    given and never drops either: measured here, a fresh memoryview per request leaked
    ~190 bytes and kept its whole staging mmap alive. Reusing one Iovec per (address,
    length) bounds what is pinned to the staging buffers, which ``StagingPool`` keeps for
    the life of the process anyway. The address cannot be reused by another mapping: the
    pinned export keeps the original one mapped.
    """

    def __init__(self) -> None:
        self._iovecs: dict[tuple[int, int], lu.Iovec] = {}
        self._lock = threading.Lock()

    def get(self, buf: memoryview) -> lu.Iovec:
        key = (buffer_address(buf), len(buf))
        iov = self._iovecs.get(key)
        if iov is None:
            with self._lock:
                iov = self._iovecs.get(key)
                if iov is None:
                    iov = self._iovecs[key] = lu.Iovec([buf])
        return iov

    def __len__(self) -> int:
        return len(self._iovecs)


_IOVECS = _IovecCache()


class _RawIovecs:
    """Iovec arrays of one ring that are pointed at caller memory per request.

    ``lu.Iovec`` keeps a buffer export of everything it is given (``_IovecCache``), so it
    cannot name a caller's rows: each call's rows would stay pinned for good. Instead each
    ring owns ``entries`` two-entry ``Iovec`` objects, built once over a dummy buffer, and
    rewrites their C arrays (base, length) per request through ctypes. The layout this
    relies on (``_len`` and the array pointer right after the object header) is checked
    once at import (``RAW_IOVECS``); without it no vectored request is made. An entry is
    held from its request's submission until its completion.
    """

    def __init__(self, entries: int) -> None:
        self._objs = [lu.Iovec([_DUMMY, _DUMMY]) for _ in range(entries)]
        self._heads = [_fields(o) for o in self._objs]
        self._arrays = [(ctypes.c_size_t * 4).from_address(h[1]) for h in self._heads]
        self._free = list(range(entries))
        self._held: dict[int, int] = {}  # request index -> entry

    def prep(
        self, prep_rw: Callable[..., None], sqe: lu.SQE, i: int, r: IORequest, skip: int
    ) -> None:
        """Point a free entry at request ``i``'s segments less their first ``skip`` bytes
        (a short transfer resumed) and prepare ``sqe`` with it."""
        at = r.offset + skip
        segs = r.segments()
        while segs and skip >= len(segs[0]):
            skip -= len(segs.pop(0))
        if skip:
            segs[0] = segs[0][skip:]
        if len(segs) > 2:
            raise ValueError("the io_uring backend takes at most two segments a request")
        k = self._free.pop()
        self._held[i] = k
        arr, head = self._arrays[k], self._heads[k]
        for j, seg in enumerate(segs):
            arr[2 * j] = buffer_address(seg)
            arr[2 * j + 1] = len(seg)
        head[0] = len(segs)
        try:
            prep_rw(sqe, r.fd, self._objs[k], at)
        finally:
            head[0] = 2  # what the binding frees the array with

    def release(self, i: int) -> None:
        self._free.append(self._held.pop(i))


def _fields(iov: lu.Iovec) -> ctypes.Array[ctypes.c_size_t]:
    """``Iovec``'s two fields (count, pointer to the C ``struct iovec`` array)."""
    return (ctypes.c_size_t * 2).from_address(id(iov) + _OBJECT_HEADER_BYTES)


def _raw_iovecs_work() -> bool:
    """Whether ``Iovec`` is laid out as ``_RawIovecs`` assumes (checked on real buffers)."""
    a, b = bytearray(24), bytearray(40)
    try:
        iov = lu.Iovec([a, b])
        n, ptr = _fields(iov)
        arr = (ctypes.c_size_t * 4).from_address(ptr)
        want = [buffer_address(memoryview(a)), 24, buffer_address(memoryview(b)), 40]
        return n == 2 and list(arr) == want
    except Exception:  # any surprise: fall back to staging copies
        return False


_OBJECT_HEADER_BYTES = object.__basicsize__  # ob_refcnt, ob_type
_DUMMY = bytearray(1)
RAW_IOVECS = _raw_iovecs_work()


def _get_sqe(ring: lu.Ring) -> lu.SQE:
    """An SQE, submitting what is queued first when the submission ring is full."""
    sqe = lu.io_uring_get_sqe(ring)
    while sqe is None:
        _submit(ring)
        sqe = lu.io_uring_get_sqe(ring)
    return sqe


def _submit(ring: lu.Ring) -> None:
    _retry_eintr(lambda: lu.io_uring_submit(ring))


# io_uring_enter(2) has the same number on every architecture (the syscall table was
# unified before io_uring was added); ctypes drops the GIL around foreign calls.
_SYS_IO_URING_ENTER = 426
_IORING_ENTER_GETEVENTS = 1
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [
    ctypes.c_long,
    ctypes.c_uint,
    ctypes.c_uint,
    ctypes.c_uint,
    ctypes.c_uint,
    ctypes.c_void_p,
    ctypes.c_size_t,
]


def _wait_cqes(ring: lu.Ring) -> None:
    """Block until at least one completion is ready, without holding the GIL."""
    while lu.io_uring_cq_ready(ring) == 0:
        rc = _syscall(_SYS_IO_URING_ENTER, ring.ring_fd, 0, 1, _IORING_ENTER_GETEVENTS, None, 0)
        if rc < 0:
            err = ctypes.get_errno()
            if err in (errno.EINTR, errno.EAGAIN, errno.EBUSY):
                continue
            raise OSError(err, os.strerror(err))


def _retry_eintr(fn: Callable[[], object]) -> object:
    while True:
        try:
            return fn()
        except InterruptedError:
            continue
