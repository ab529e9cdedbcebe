"""Test-only I/O backends that wrap a real one: a power-cut simulator and a fault injector.

They run on the real file system through a real backend; what they simulate is only
what a test cannot produce on demand — losing the page cache, or a disk that fails.
"""

from __future__ import annotations

import errno
import mmap
import threading
from collections.abc import Sequence

from storage_nodes.ssd.backends import make_auto, register_backend
from storage_nodes.ssd.io_backend import Between, IOBackend, IORequest, OnDone


class CrashSimBackend(IOBackend):
    """Holds every write in memory until a ``sync`` of its fd, then applies and syncs it.

    Reads see held writes (as the page cache would). ``crash()`` drops every write not
    followed by a sync — what a power cut does to a file — and, with ``keep_fraction``,
    lets a random subset of them reach the file first, modelling a disk that persisted
    some unsynced writes in any order.
    """

    name = "crashsim"

    def __init__(self, inner: IOBackend) -> None:
        self.inner = inner
        self.vectored = inner.vectored
        self._held: dict[int, list[tuple[int, bytes]]] = {}
        self._lock = threading.Lock()
        self.crashed = False
        self.dropped_writes = 0

    def _reads(self, reqs: Sequence[IORequest], on_done: OnDone | None) -> list[int]:
        res = self.inner.read_batch(reqs)
        with self._lock:
            for r, n in zip(reqs, res, strict=True):
                if n < 0:
                    continue
                start = r.offset
                for seg in r.segments():  # held writes overlay what the file returned
                    end = start + len(seg)
                    for off, data in self._held.get(r.fd, ()):
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
        with self._lock:
            if self.crashed:
                return [-errno.EIO] * len(fds)
            held = [(fd, self._held.pop(fd, [])) for fd in fds]
        for fd, writes in held:
            if any(n < 0 for n in self.inner.write_batch(_aligned(fd, writes))):
                return [-errno.EIO] * len(fds)
        return self.inner.sync(fds)

    def crash(self, *, keep_fraction: float = 0.0, seed: int = 0) -> None:
        """Simulate a power cut now. Later writes and syncs fail with EIO."""
        import random

        rng = random.Random(seed)
        with self._lock:
            self.crashed = True
            held, self._held = self._held, {}
        for fd, writes in held.items():
            survivors = [w for w in writes if rng.random() < keep_fraction]
            self.dropped_writes += len(writes) - len(survivors)
            if survivors:
                self.inner.write_batch(_aligned(fd, survivors))

    def close(self) -> None:
        self.inner.close()


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
