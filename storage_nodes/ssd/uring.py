"""The io_uring backend, through the ``liburing`` package (Python bindings of C liburing).

One engine runs every batch: it keeps up to ``queue_depth`` requests in flight, refills
the ring as completions are reaped (one ``io_uring_submit_and_wait`` per round), and
runs the caller's per-request work while the device is busy — encoding the next blocks
before their writes are submitted, verifying each read as it lands. A data sync rides in
the same submission as the writes it covers, as ``fsync`` SQEs flagged IOSQE_IO_DRAIN
(started only once every earlier request has completed). Rings are not thread-safe, so
a small pool hands each concurrent caller its own.
"""

from __future__ import annotations

import errno
import threading
from collections import deque
from collections.abc import Callable, Sequence

import liburing as lu
import numpy as np

from storage_nodes.ssd.io_backend import IOBackend, IORequest, OnDone

_READ, _WRITE = 0, 1
_SUBMIT_EVERY = 4  # while encoding, hand the kernel writes this often


class _RingSlot:
    def __init__(self, entries: int) -> None:
        self.ring = lu.Ring()
        lu.io_uring_queue_init(entries, self.ring)  # raises OSError where io_uring is refused
        self.cqe = lu.Cqe()

    def close(self) -> None:
        lu.io_uring_queue_exit(self.ring)


class UringBackend(IOBackend):
    name = "uring"

    def __init__(self, queue_depth: int = 32) -> None:
        self.queue_depth = queue_depth
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
        results = [0] * n
        synced = [0] * len(sync_fds)
        done = [0] * n  # bytes transferred so far per request (short transfers resume)
        pending = deque(range(n))
        keep: list[lu.Iovec | None] = [None] * n  # iovecs must outlive their requests
        slot = self._acquire()
        ring, cqe = slot.ring, slot.cqe
        inflight = unsubmitted = 0
        sync_sent = not sync_fds
        between_done = between is None
        resync = False
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
                    r = reqs[i]
                    iov = _IOVECS.get(r.buf[done[i] :] if done[i] else r.buf)
                    keep[i] = iov
                    sqe = _get_sqe(ring)
                    prep_rw(sqe, r.fd, iov, r.offset + done[i])
                    lu.io_uring_sqe_set_data64(sqe, i)
                    inflight += 1
                    unsubmitted += 1
                    if prepare is not None and unsubmitted >= _SUBMIT_EVERY:
                        _submit(ring)
                        self.submissions += 1
                        unsubmitted = 0
                if not pending and not sync_sent and error is None:
                    for j, fd in enumerate(sync_fds):
                        sqe = _get_sqe(ring)
                        lu.io_uring_prep_fsync(sqe, fd, lu.IORING_FSYNC_DATASYNC)
                        lu.io_uring_sqe_set_flags(sqe, lu.IOSQE_IO_DRAIN)
                        lu.io_uring_sqe_set_data64(sqe, n + j)
                        inflight += 1
                        unsubmitted += 1
                    sync_sent = True
                if not between_done and not pending and sync_sent:
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
                    _retry_eintr(lambda: lu.io_uring_submit_and_wait(ring, 1))
                    self.submissions += 1
                    unsubmitted = 0
                else:
                    _retry_eintr(lambda: lu.io_uring_wait_cqe(ring, cqe))
                reaped: list[tuple[int, int]] = []
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
                    if res > 0:
                        done[i] += res
                        if done[i] < len(reqs[i].buf):
                            pending.append(i)  # short transfer: resubmit the rest
                            resync = resync or (sync_sent and bool(sync_fds))
                            continue
                        res = done[i]
                    elif res == 0:
                        res = -errno.EIO  # EOF inside a preallocated slab
                    results[i] = res
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
        if resync:
            synced = self.sync(sync_fds)
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
        addr = np.frombuffer(buf, np.uint8).__array_interface__["data"][0]
        key = (addr, len(buf))
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


def _get_sqe(ring: lu.Ring) -> lu.SQE:
    """An SQE, submitting what is queued first when the submission ring is full."""
    sqe = lu.io_uring_get_sqe(ring)
    while sqe is None:
        _submit(ring)
        sqe = lu.io_uring_get_sqe(ring)
    return sqe


def _submit(ring: lu.Ring) -> None:
    _retry_eintr(lambda: lu.io_uring_submit(ring))


def _retry_eintr(fn: Callable[[], object]) -> object:
    while True:
        try:
            return fn()
        except InterruptedError:
            continue
