"""Block I/O backends: batches of positioned reads and writes plus data syncs.

The engine hands a backend whole batches (a ``get_into`` of N blocks is one call with N
reads) so io_uring can keep ``queue_depth`` requests in flight. Per-request failures
come back as negative errnos in the result list — a backend raises only when it cannot
run at all — so the engine decides what a failed block means (a miss, a drop, degraded
mode) without unwinding a half-done batch.
"""

from __future__ import annotations

import errno
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from functools import partial
from typing import ClassVar

from kvstore.slot_io import IORequest
from kvstore.slot_io import full_transfer as _full

OnDone = Callable[[int, int], None]
#: runs once a batch's requests are all submitted; may return requests that join the
#: batch, and then runs again once those are submitted (until it returns none)
Between = Callable[[], Sequence[IORequest] | None]


def check_added(fds: Sequence[int]) -> None:
    """Writes added to a batch by ``between`` are not covered by its syncs."""
    if fds:
        raise ValueError("writes added to a batch that syncs files would not be synced")


class IOBackend(ABC):
    """Contract:

    * ``read_batch``/``write_batch`` perform every request and return, per request, the
      bytes transferred (a full transfer; short transfers are retried internally) or a
      negative errno. Order of completion is unspecified; the result list is in request
      order. ``on_done(i, result)`` is called once per read as it completes — with
      io_uring while later reads are still in flight, so per-block work overlaps the I/O.
      ``reqs`` may be any ``Sequence``, also one that builds request ``i`` only when it is
      first indexed (``BlockIO``'s reads): a backend takes requests in order as it submits
      them rather than indexing all of them first, so the device starts on the first
      reads while later ones are still being built.
    * ``read_batch(..., between=)``: ``between()`` runs once the reads given are all
      submitted; the reads it returns join the batch as requests ``len(reqs)``,
      ``len(reqs) + 1``, ... (``on_done`` is called for them with those indexes, the
      results cover them after the others), and it runs again once those are submitted,
      until it returns none — a get looks up most of its keys while the reads of its
      first ones are in flight.
    * ``sync(fds)`` makes every completed write to those fds durable (fdatasync);
      returns 0 or a negative errno per fd.
    * ``write_and_sync`` writes then syncs; ``prepare(i)`` fills request ``i``'s buffer
      just before it is submitted and ``between()`` runs once every write is submitted,
      so encoding and index work overlap the device. ``between`` may return further
      writes (only when ``fds`` is empty: their files are not synced here): they join the
      batch as requests ``len(reqs)``, ``len(reqs) + 1``, ... (``prepare`` is called for
      them too), the results cover them after the others, and ``between`` runs again
      once they are submitted, until it returns none — a put reserves the slots of most
      of its blocks while its first writes are in flight, then fills its publishing
      transaction while the rest are.
    * An exception from a callback is re-raised only after every submitted request has
      completed: no request is ever left in flight on a buffer the caller may reuse.
    * Thread-safe: concurrent calls from several threads are allowed.
    """

    name: ClassVar[str]
    #: whether requests with a ``head`` segment are accepted (``BlockIO`` then reads and
    #: writes payloads in the caller's own page-aligned rows, without a staging copy)
    vectored: bool = True

    def read_batch(
        self,
        reqs: Sequence[IORequest],
        on_done: OnDone | None = None,
        *,
        between: Between | None = None,
    ) -> list[int]:
        """This default reads ``reqs``, then what ``between`` adds, one after the other."""
        res = self._reads(reqs, on_done)
        while between is not None and (more := between()):
            first = len(res)
            shifted = None if on_done is None else partial(_shifted, on_done, first)
            res += self._reads(more, shifted)
        return res

    @abstractmethod
    def _reads(self, reqs: Sequence[IORequest], on_done: OnDone | None) -> list[int]:
        """Every read of ``reqs``, ``on_done`` called per read (``read_batch``'s contract)."""

    @abstractmethod
    def write_batch(self, reqs: Sequence[IORequest]) -> list[int]: ...

    @abstractmethod
    def sync(self, fds: Sequence[int]) -> list[int]: ...

    def write_and_sync(
        self,
        reqs: Sequence[IORequest],
        fds: Sequence[int],
        *,
        prepare: Callable[[int], None] | None = None,
        between: Between | None = None,
    ) -> tuple[list[int], list[int]]:
        """Returns (write results, sync results); the sync is skipped (``[]``) when a
        write failed. This default runs the steps one after the other."""
        if prepare is not None:
            for i in range(len(reqs)):
                prepare(i)
        res = self.write_batch(reqs)
        if any(r < 0 for r in res):
            return res, []
        while between is not None and (more := between()):
            check_added(fds)
            if prepare is not None:
                for i in range(len(res), len(res) + len(more)):
                    prepare(i)
            res += self.write_batch(more)
            if any(r < 0 for r in res):
                return res, []
        return res, self.sync(fds)

    @abstractmethod
    def close(self) -> None:
        """Release kernel resources; idempotent."""


def _shifted(on_done: OnDone, first: int, i: int, res: int) -> None:
    on_done(first + i, res)


class PreadBackend(IOBackend):
    """``os.preadv``/``os.pwritev`` one request at a time: the fallback where io_uring
    is unavailable (old kernels, seccomp'd containers, io_uring_disabled=2)."""

    name = "pread"

    def __init__(self, queue_depth: int = 32) -> None:
        self.queue_depth = queue_depth

    def close(self) -> None:
        """Nothing to release: no kernel object outlives a call."""

    def _reads(self, reqs: Sequence[IORequest], on_done: OnDone | None) -> list[int]:
        out = [_full(os.preadv, r) for r in reqs]
        if on_done is not None:
            for i, r in enumerate(out):
                on_done(i, r)
        return out

    def write_batch(self, reqs: Sequence[IORequest]) -> list[int]:
        return [_full(os.pwritev, r) for r in reqs]

    def sync(self, fds: Sequence[int]) -> list[int]:
        out = []
        for fd in fds:
            try:
                os.fdatasync(fd)
                out.append(0)
            except OSError as e:
                out.append(-(e.errno or errno.EIO))
        return out
