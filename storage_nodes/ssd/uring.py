"""The io_uring backend, through the ``liburing`` package (Python bindings of C liburing).

One engine runs every batch: it keeps up to ``queue_depth`` requests in flight, refills
the ring as completions are reaped, and
runs the caller's per-request work while the device is busy — encoding the next blocks
before their writes are submitted, verifying each read as it lands (with the last
eighth of a checked batch held back until the first reads land, so that the device has
work while they are verified: ``held_back_reads``), and adding to a batch the requests its
``between`` returns once the first ones are in flight (a put's later writes, a get's
later reads). A data sync rides in
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

from storage_nodes.ssd.io_backend import Between, IOBackend, IORequest, OnDone, check_added
from storage_nodes.ssd.uring_iovecs import IOVECS, RAW_IOVECS, RawIovecs

_READ, _WRITE = 0, 1
#: while encoding writes or building reads, hand the kernel requests this often: the
#: device starts on the first ones while the rest are still being prepared
_SUBMIT_EVERY = 4
#: see ``held_back_reads``
_HELD_BACK_FRACTION = 8
#: a sync's completion is told from a request's by its user data: request indexes stay
#: below this (a batch may grow while it runs)
_SYNC_DATA = 1 << 40


def held_back_reads(n: int) -> int:
    """How many of a batch of ``n`` checked reads wait for the batch's first completions.

    A read's check (its payload's xxh3) runs as it lands, while later reads are in
    flight. That overlap needs a device that completes reads one by one, as an NVMe
    drive does; a virtual disk may instead serve every queued request and signal them
    together (measured on this project's VMs: all 32 reads of a call completed within
    30 µs of each other, 2.6 ms after submission), leaving the device idle while the
    whole batch is checked. Keeping an eighth back makes a second, short pass that runs
    while the first pass's reads are checked: at ~10 µs per 256 KiB check against
    ~85 µs per 256 KiB read, an eighth covers the checks of the rest, and what stays
    exposed is the check of the last eighth. On a device that completes reads one by
    one the held-back reads go in at the first completion, a few µs later than they
    would have.
    """
    return n // _HELD_BACK_FRACTION


class _RingSlot:
    def __init__(self, entries: int) -> None:
        self.ring = lu.Ring()
        lu.io_uring_queue_init(entries, self.ring)  # raises OSError where io_uring is refused
        self.cqe = lu.Cqe()
        self.iovecs = RawIovecs(entries) if RAW_IOVECS else None

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

    def read_batch(
        self,
        reqs: Sequence[IORequest],
        on_done: OnDone | None = None,
        *,
        between: Between | None = None,
    ) -> list[int]:
        return self._run(_READ, reqs, on_done=on_done, between=between)[0]

    def _reads(self, reqs: Sequence[IORequest], on_done: OnDone | None) -> list[int]:
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
        between: Between | None = None,
    ) -> tuple[list[int], list[int]]:
        res, synced = self._run(_WRITE, reqs, sync_fds=fds, prepare=prepare, between=between)
        return res, ([] if res and min(res) < 0 else synced)

    def _run(
        self,
        op: int,
        reqs: Sequence[IORequest],
        *,
        sync_fds: Sequence[int] = (),
        prepare: Callable[[int], None] | None = None,
        between: Between | None = None,
        on_done: OnDone | None = None,
    ) -> tuple[list[int], list[int]]:
        n = n_given = len(reqs)  # ``n`` grows by the requests ``between`` adds
        if not self.vectored and any(r.head is not None or r.more for r in reqs):
            raise ValueError("this build of liburing cannot take vectored requests")
        results = [0] * n
        synced = [0] * len(sync_fds)
        done = [0] * n  # bytes transferred so far per request (short transfers resume)
        # Reads checked by ``on_done`` keep back the last of the batch (``held_back_reads``)
        # until the first completions arrive; they go in before those are checked.
        checked = op == _READ and on_done is not None
        held = held_back_reads(n) if checked else 0
        pending = deque(range(n - held))
        reserve = list(range(n - held, n))
        landed: list[tuple[int, int]] = []  # completed, ``on_done`` not yet run
        # iovecs must outlive their requests; None: the request is on a raw iovec
        keep: list[lu.Iovec | None] = [None] * n
        # each request as first taken from ``reqs``: the reaping below reads it again
        # without indexing ``reqs`` (for a lazy batch every index is a Python call)
        taken: list[IORequest | None] = [None] * n
        want = [0] * n  # each request's bytes
        added: list[tuple[int, Sequence[IORequest]]] = []  # (first index, what ``between`` added)
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

        def fill(hand_over: bool = True) -> None:
            """Prepare pending requests while the queue has room, handing them to the
            kernel every few (or, without ``hand_over``, only at the next ``flush``)."""
            nonlocal inflight, unsubmitted, error
            while pending and inflight < self.queue_depth and error is None:
                i = pending.popleft()
                if prepare is not None and done[i] == 0:
                    try:
                        prepare(i)
                    except BaseException as e:  # stop submitting, drain, then raise
                        error = e
                        pending.clear()
                        break
                r = taken[i]
                if r is None:
                    r = reqs[i] if i < n_given else _added(added, i)
                    taken[i] = r
                    want[i] = r.nbytes
                sqe = _get_sqe(ring)
                if r.head is None and not r.more:
                    iov = IOVECS.get(r.buf[done[i] :] if done[i] else r.buf)
                    keep[i] = iov
                    prep_rw(sqe, r.fd, iov, r.offset + done[i])
                else:  # caller memory: an iovec of this ring's own, never cached
                    raw.prep(prep_rw, sqe, i, r, done[i])  # type: ignore[union-attr]
                lu.io_uring_sqe_set_data64(sqe, i)
                inflight += 1
                unsubmitted += 1
                if hand_over and unsubmitted >= _SUBMIT_EVERY and (prepare or op == _READ):
                    flush()

        def flush() -> None:
            nonlocal unsubmitted
            if unsubmitted:
                _submit(ring)
                self.submissions += 1
                unsubmitted = 0

        try:
            while True:
                fill()
                while to_sync and error is None:
                    j = to_sync.popleft()
                    sqe = _get_sqe(ring)
                    lu.io_uring_prep_fsync(sqe, sync_fds[j], lu.IORING_FSYNC_DATASYNC)
                    lu.io_uring_sqe_set_data64(sqe, _SYNC_DATA + j)
                    inflight += 1
                    unsubmitted += 1
                if not between_done and not pending and error is None:
                    flush()
                    between_done = True
                    try:
                        more = between()  # type: ignore[misc]
                        if more:
                            check_added(sync_fds)
                    except BaseException as e:
                        error = error or e
                    else:
                        if more:  # they join the batch, taken in order like the rest
                            k = len(more)
                            between_done = False  # asked again once these are in flight
                            added.append((n, more))  # indexed as submitted: lazy stays lazy
                            # a grown read batch holds back its share of the added reads
                            keep_back = min(k, held_back_reads(n + k) - len(reserve))
                            keep_back = max(keep_back, 0) if checked else 0
                            pending.extend(range(n, n + k - keep_back))
                            reserve += range(n + k - keep_back, n + k)
                            results += [0] * k
                            done += [0] * k
                            keep += [None] * k
                            taken += [None] * k
                            want += [0] * k
                            n += k
                            continue  # submit them before waiting
                flush()
                # the caller's work on what landed, now that the refill is in flight
                for i, res in landed:
                    if error is None:
                        try:
                            on_done(i, res)  # type: ignore[misc]
                        except BaseException as e:
                            error = e
                landed.clear()
                if inflight == 0:
                    break
                if reserve and not pending and inflight + len(reserve) <= self.queue_depth:
                    # prepared now, handed over the moment the first reads complete: a
                    # device that hands back its whole queue at once idles only that long
                    pending.extend(reserve)
                    reserve = []
                    fill(hand_over=False)
                _wait_cqes(ring)
                flush()
                # Reaped and accounted in one pass, before the ring is advanced: the last
                # burst of a batch is reaped with the device idle (a put's ~32 writes
                # complete together here), so every µs per completion is on the call's
                # critical path.
                cqe, reaped = slot.cqe, 0
                for _ in lu.CqeIter(ring, cqe):
                    entry = cqe[0]
                    i = entry.user_data
                    try:
                        res = entry.res
                    except OSError as e:  # the binding raises for negative results
                        res = -(e.errno or errno.EIO)
                    reaped += 1
                    if i >= _SYNC_DATA:
                        synced[i - _SYNC_DATA] = min(res, 0)
                        continue
                    if keep[i] is None:  # prepared on one of this ring's raw iovecs
                        raw.release(i)  # type: ignore[union-attr]
                    if res > 0:
                        res += done[i]
                        done[i] = res
                        if res < want[i]:
                            pending.append(i)  # short transfer: resubmit the rest
                            continue
                    elif res == 0:
                        res = -errno.EIO  # EOF inside a preallocated slab
                    results[i] = res
                    if unwritten:
                        fd = taken[i].fd  # type: ignore[union-attr]
                        if fd in unwritten:
                            unwritten[fd] -= 1
                            if not unwritten[fd]:
                                to_sync.extend(j for j, f in enumerate(sync_fds) if f == fd)
                    if on_done is not None:
                        landed.append((i, res))
                lu.io_uring_cq_advance(ring, reaped)
                inflight -= reaped
                if reserve and error is None:  # the queue was too full above
                    pending.extend(reserve)
                    reserve = []
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


def _added(added: list[tuple[int, Sequence[IORequest]]], i: int) -> IORequest:
    """Request ``i`` of a batch among those ``between`` added (in chunks, in order)."""
    for first, reqs in reversed(added):
        if i >= first:
            return reqs[i - first]
    raise IndexError(i)


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
