"""An idle deadline for streaming calls: a stream whose client moves nothing is cancelled.

A client that opens a ``Commit`` and never finishes it would otherwise hold its
buffer (and an RPC thread) for as long as it likes. Each stream registers with the
watchdog; one background thread cancels the streams that have been waiting on their
client for longer than the deadline. A stream waits on its client only while the servicer
is blocked on it: reading the next message of a ``Commit`` or handing the next message
of a ``Get`` to a reader that does not take it. Time the daemon spends on its own work
(allocating the buffer, verifying, committing to a slow tier, or simply not scheduled)
is never the client's idleness, so a stream is cut only after everything its client
sent before going quiet has been read. A cancelled ``Commit`` keeps its complete,
verified blocks, like any stream that ends early (DESIGN §7).

``clock`` (monotonic seconds) measures the waits: tests inject one and move it past the
deadline only once the daemon has read what they sent, so which blocks a cut stream
keeps is decided by the test, not by the scheduler.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from kvstore.errors import IntegrityError

log = logging.getLogger(__name__)
T = TypeVar("T")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


@dataclass(slots=True)
class Stream:
    method: str
    ctx: Cancellable
    clock: Callable[[], float]
    # Since when the servicer has been blocked on the client; None while the daemon works.
    waiting_since: float | None = None
    cancelled: bool = False

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Around each blocking read from (or hand-over to) the client."""
        self.waiting_since = self.clock()
        try:
            yield
        finally:
            self.waiting_since = None

    def reading(self, it: Iterator[T]) -> Iterator[T]:
        """``it``, each ``next`` counted as waiting on the client."""
        while True:
            with self.waiting():
                msg = next(it, _END)
            if msg is _END:
                return
            yield msg  # type: ignore[misc]


_END: object = object()


class IdleWatchdog:
    def __init__(
        self,
        idle_timeout_s: float,
        tick_s: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_timeout_s = idle_timeout_s
        self._tick_s = tick_s if tick_s is not None else min(1.0, idle_timeout_s / 4)
        self._clock = clock
        self._lock = threading.Lock()
        self._streams: dict[int, Stream] = {}
        self._next = 0
        self.cancelled_total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream-watchdog", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def watch(self, method: str, ctx: Cancellable) -> Iterator[Stream]:
        s = Stream(method, ctx, self._clock)
        with self._lock:
            sid = self._next
            self._next += 1
            self._streams[sid] = s
        try:
            yield s
        finally:
            with self._lock:
                del self._streams[sid]

    def sweep(self) -> int:
        """Cancel the streams that have waited on their client past the deadline (the
        background thread calls this every tick); returns how many it cancelled."""
        now = self._clock()
        with self._lock:
            idle = []
            for s in self._streams.values():
                since = s.waiting_since  # read once: the stream's thread may clear it
                if not s.cancelled and since is not None and now - since > self.idle_timeout_s:
                    idle.append(s)
            for s in idle:
                s.cancelled = True
            self.cancelled_total += len(idle)
        for s in idle:
            log.info("%s stream idle for %.0f s: cancelled", s.method, self.idle_timeout_s)
            s.ctx.cancel()
        return len(idle)

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s):
            self.sweep()

    @property
    def open_streams(self) -> int:
        with self._lock:
            return len(self._streams)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def check_integrity(self) -> None:
        with self._lock:
            if self.cancelled_total < sum(s.cancelled for s in self._streams.values()):
                raise IntegrityError("watchdog cancelled more streams than it counted")
