"""Test-only I/O backends that wrap a real one: a power-cut simulator and a fault injector.

They run on the real file system through a real backend; what they simulate is only
what a test cannot produce on demand — losing the page cache, or a disk that fails.
"""

from __future__ import annotations

import bisect
import errno
import mmap
import threading
from collections.abc import Sequence

from storage_nodes.ssd.backends import make_auto, register_backend
from storage_nodes.ssd.io_backend import Between, IOBackend, IORequest, OnDone


class CrashSimBackend(IOBackend):
    """Holds every write in memory until a ``sync`` of its fd, then applies and syncs it.

    Reads see held writes (as the page cache would), also while a sync is landing them.
    ``crash()`` drops every write not followed by a sync — what a power cut does to a
    file — and, with ``keep_fraction``, lets a random subset of them reach the file
    first, modelling a disk that persisted some unsynced writes. A sync lands its writes
    in the order they were made: the inner backend completes a batch's requests in any
    order (io_uring does), and two held writes to one slot (a raced put's copy, then the
    block of the put that reused the slot) must leave the later one on the file, as the
    engine's sequential writes would. One sync lands at a time, and a cut waits for the
    one under way (the power goes just after it).
    """

    name = "crashsim"

    def __init__(self, inner: IOBackend) -> None:
        self.inner = inner
        self.vectored = inner.vectored
        self._held: dict[int, list[tuple[int, bytes]]] = {}
        # Writes a sync took from ``_held`` and is applying: reads still overlay them, or
        # a read between the take and the landing would see the file's older bytes (a
        # false corrupt block, quarantined).
        self._landing: dict[int, list[tuple[int, bytes]]] = {}
        self._lock = threading.Lock()  # ``_held``, ``_landing``, ``crashed``
        self._syncing = threading.Lock()  # one sync (or cut) applies writes at a time
        self.crashed = False
        self.dropped_writes = 0

    def _reads(self, reqs: Sequence[IORequest], on_done: OnDone | None) -> list[int]:
        # The file read and the overlay under one lock: a sync clears ``_landing`` only
        # once its writes are on the file, so a read sees them in one place or the other.
        with self._lock:
            res = self.inner.read_batch(reqs)
            for r, n in zip(reqs, res, strict=True):
                if n < 0:
                    continue
                start = r.offset
                for seg in r.segments():  # held writes overlay what the file returned
                    end = start + len(seg)
                    pending = [*self._landing.get(r.fd, ()), *self._held.get(r.fd, ())]
                    for off, data in pending:  # oldest first: the last write wins
                        lo, hi = max(off, start), min(off + len(data), end)
                        if lo < hi:
                            seg[lo - start : hi - start] = data[lo - off : hi - off]
                    start = end
        if on_done is not None:
            for i, n in enumerate(res):
                on_done(i, n)
        return res

    def write_batch(self, reqs: Sequence[IORequest]) -> list[int]:
        with self._lock:
            if self.crashed:
                return [-errno.EIO] * len(reqs)
            for r in reqs:
                data = b"".join(bytes(seg) for seg in r.segments())
                self._held.setdefault(r.fd, []).append((r.offset, data))
        return [r.nbytes for r in reqs]

    def sync(self, fds: Sequence[int]) -> list[int]:
        with self._syncing:
            with self._lock:
                if self.crashed:
                    return [-errno.EIO] * len(fds)
                held = [(fd, self._held.pop(fd, [])) for fd in fds]
                self._landing = dict(held)
            try:
                for fd, writes in held:
                    if not self._land(fd, writes):
                        return [-errno.EIO] * len(fds)
                return self.inner.sync(fds)
            finally:
                with self._lock:
                    self._landing = {}

    def crash(self, *, keep_fraction: float = 0.0, seed: int = 0) -> None:
        """Simulate a power cut now (after a sync under way). Later writes and syncs fail
        with EIO."""
        import random

        rng = random.Random(seed)
        with self._syncing:
            with self._lock:
                self.crashed = True
                held, self._held = self._held, {}
            for fd, writes in held.items():
                survivors = [w for w in writes if rng.random() < keep_fraction]
                self.dropped_writes += len(writes) - len(survivors)
                self._land(fd, survivors)

    def _land(self, fd: int, writes: list[tuple[int, bytes]]) -> bool:
        """Apply ``writes`` to the file in their order: in batches of writes that do not
        overlap, each batch after the one before it completed."""
        for batch in _in_order(writes):
            if any(n < 0 for n in self.inner.write_batch(_aligned(fd, batch))):
                return False
        return True

    def close(self) -> None:
        self.inner.close()


def _in_order(writes: list[tuple[int, bytes]]) -> list[list[tuple[int, bytes]]]:
    """``writes`` cut into runs without two writes to overlapping bytes: a batch's
    requests complete in any order, so a write that overlaps an earlier one goes in a
    later batch."""
    out: list[list[tuple[int, bytes]]] = []
    run: list[tuple[int, bytes]] = []
    starts: list[int] = []  # the run's spans, sorted and disjoint: (starts[i], ends[i])
    ends: list[int] = []
    for off, data in writes:
        end = off + len(data)
        i = bisect.bisect_right(starts, off)
        if (i and ends[i - 1] > off) or (i < len(starts) and starts[i] < end):
            out.append(run)
            run, starts, ends, i = [], [], [], 0
        run.append((off, data))
        starts.insert(i, off)
        ends.insert(i, end)
    if run:
        out.append(run)
    return out


def _aligned(fd: int, writes: list[tuple[int, bytes]]) -> list[IORequest]:
    """Copies in page-aligned memory: the inner backend may use O_DIRECT."""
    out = []
    for off, data in writes:
        m = mmap.mmap(-1, max(len(data), 1))
        m[: len(data)] = data
        out.append(IORequest(fd, off, memoryview(m)[: len(data)]))
    return out


class FaultyBackend(IOBackend):
    """Fails requests on demand: ``write_errno``/``read_errno``/``sync_errno`` set to an
    errno make every later request of that kind fail with it (``None`` = healthy);
    ``write_budget_bytes`` lets that many bytes through first (a filling disk)."""

    name = "faulty"

    def __init__(self, inner: IOBackend) -> None:
        self.inner = inner
        self.vectored = inner.vectored
        self.write_errno: int | None = None
        self.read_errno: int | None = None
        self.sync_errno: int | None = None
        self.write_budget_bytes: int | None = None

    def read_batch(
        self,
        reqs: Sequence[IORequest],
        on_done: OnDone | None = None,
        *,
        between: Between | None = None,
    ) -> list[int]:
        if self.read_errno is None:  # healthy: the inner backend's batch, growth included
            return self.inner.read_batch(reqs, on_done, between=between)
        return super().read_batch(reqs, on_done, between=between)

    def _reads(self, reqs: Sequence[IORequest], on_done: OnDone | None) -> list[int]:
        out = [-(self.read_errno or errno.EIO)] * len(reqs)
        if on_done is not None:
            for i, n in enumerate(out):
                on_done(i, n)
        return out

    def write_batch(self, reqs: Sequence[IORequest]) -> list[int]:
        if self.write_errno is not None and self.write_budget_bytes is None:
            return [-self.write_errno] * len(reqs)
        ok: list[IORequest] = []
        out: list[int] = []
        for r in reqs:
            if self.write_budget_bytes is not None:
                if self.write_budget_bytes < r.nbytes:
                    out.append(-(self.write_errno or errno.ENOSPC))
                    continue
                self.write_budget_bytes -= r.nbytes
            ok.append(r)
            out.append(r.nbytes)
        res = iter(self.inner.write_batch(ok))
        return [next(res) if n > 0 else n for n in out]

    def sync(self, fds: Sequence[int]) -> list[int]:
        if self.sync_errno is not None:
            return [-self.sync_errno] * len(fds)
        return self.inner.sync(fds)

    def close(self) -> None:
        self.inner.close()


def _crashsim(queue_depth: int) -> IOBackend:
    return CrashSimBackend(make_auto(queue_depth))


def _faulty(queue_depth: int) -> IOBackend:
    return FaultyBackend(make_auto(queue_depth))


# Importing this module makes the names valid ``SSDConfig.io_backend`` values (both wrap
# ``auto``: they run on the real file system through a real backend).
register_backend("crashsim", _crashsim)
register_backend("faulty", _faulty)
