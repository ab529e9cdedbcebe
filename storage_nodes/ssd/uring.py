"""The io_uring backend, through the ``liburing`` package (Python bindings of C liburing).

Each batch keeps up to ``queue_depth`` requests in flight: the ring is filled, submitted
with one ``io_uring_submit``, and refilled as completions are reaped, so a ``get_into``
of 32 blocks costs one submission and one wait. Rings are not thread-safe, so a small
pool hands each concurrent caller its own ring.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Sequence

import liburing as lu

from storage_nodes.ssd.io_backend import IOBackend, IORequest

_READ, _WRITE, _FSYNC = 0, 1, 2


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
        self._idle: list[_RingSlot] = [_RingSlot(queue_depth)]
        self._all: list[_RingSlot] = list(self._idle)
        self._closed = False

    def _acquire(self) -> _RingSlot:
        with self._lock:
            if self._closed:
                raise OSError(errno.EBADF, "io_uring backend is closed")
            if self._idle:
                return self._idle.pop()
        slot = _RingSlot(self.queue_depth)
        with self._lock:
            self._all.append(slot)
        return slot

    def _release(self, slot: _RingSlot) -> None:
        with self._lock:
            self._idle.append(slot)

    def read_batch(self, reqs: Sequence[IORequest]) -> list[int]:
        return self._run(_READ, [(r.fd, r.offset, r.buf) for r in reqs])

    def write_batch(self, reqs: Sequence[IORequest]) -> list[int]:
        return self._run(_WRITE, [(r.fd, r.offset, r.buf) for r in reqs])

    def sync(self, fds: Sequence[int]) -> list[int]:
        return self._run(_FSYNC, [(fd, 0, memoryview(b"")) for fd in fds])

    def _run(self, op: int, work: list[tuple[int, int, memoryview]]) -> list[int]:
        n = len(work)
        if n == 0:
            return []
        results = [0] * n
        done = [0] * n  # bytes transferred so far per request (short transfers resume)
        pending = list(range(n - 1, -1, -1))  # a stack: pop() yields request 0 first
        slot = self._acquire()
        ring, cqe = slot.ring, slot.cqe
        keep: dict[int, lu.Iovec] = {}  # iovecs must outlive their requests
        inflight = 0
        try:
            while pending or inflight:
                while pending and inflight < self.queue_depth:
                    i = pending.pop()
                    fd, off, buf = work[i]
                    sqe = lu.io_uring_get_sqe(ring)
                    if op == _FSYNC:
                        lu.io_uring_prep_fsync(sqe, fd, lu.IORING_FSYNC_DATASYNC)
                    else:
                        iov = lu.Iovec([buf[done[i] :]])
                        keep[i] = iov
                        if op == _READ:
                            lu.io_uring_prep_readv(sqe, fd, iov, off + done[i])
                        else:
                            lu.io_uring_prep_writev(sqe, fd, iov, off + done[i])
                    lu.io_uring_sqe_set_data64(sqe, i)
                    inflight += 1
                _retry_eintr(lambda: lu.io_uring_submit(ring))
                _retry_eintr(lambda: lu.io_uring_wait_cqe(ring, cqe))
                seen = 0
                for _ in lu.CqeIter(ring, cqe):
                    entry = cqe[0]
                    i = entry.user_data
                    try:
                        res = entry.res
                    except OSError as e:  # the binding raises for negative results
                        res = -(e.errno or errno.EIO)
                    seen += 1
                    keep.pop(i, None)
                    if op == _FSYNC:
                        results[i] = res if res < 0 else 0
                    elif res < 0:
                        results[i] = res
                    elif res == 0:
                        results[i] = -errno.EIO  # EOF inside a preallocated slab
                    else:
                        done[i] += res
                        if done[i] < len(work[i][2]):
                            pending.append(i)  # short transfer: resubmit the rest
                        else:
                            results[i] = done[i]
                lu.io_uring_cq_advance(ring, seen)
                inflight -= seen
        except BaseException:
            # A ring with requests still in flight cannot be reused safely.
            with self._lock:
                self._all.remove(slot)
            if inflight == 0:
                slot.close()
            raise
        self._release(slot)
        return results

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            rings, self._all, self._idle = self._all, [], []
        for r in rings:
            r.close()


def _retry_eintr(fn: object) -> int:
    while True:
        try:
            return fn()  # type: ignore[operator, no-any-return]
        except InterruptedError:
            continue
