"""An idle deadline for streaming calls: a stream that moves nothing is cancelled.

A client that opens a ``Commit`` and never finishes it would otherwise hold its
buffer (and an RPC thread) for as long as it likes. Each stream registers with the
watchdog and reports progress (every message); one background thread cancels the ones
idle for longer than the deadline. A cancelled ``Commit`` keeps its complete, verified
blocks, like any stream that ends early (DESIGN §7).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from kvstore.errors import IntegrityError

log = logging.getLogger(__name__)


class Cancellable(Protocol):
    def cancel(self) -> None: ...


@dataclass(slots=True)
class Stream:
    method: str
    ctx: Cancellable
    last_s: float = field(default_factory=time.monotonic)
    cancelled: bool = False

    def moved(self) -> None:
        self.last_s = time.monotonic()


class IdleWatchdog:
    def __init__(self, idle_timeout_s: float, tick_s: float | None = None) -> None:
        self.idle_timeout_s = idle_timeout_s
        self._tick_s = tick_s if tick_s is not None else min(1.0, idle_timeout_s / 4)
        self._lock = threading.Lock()
        self._streams: dict[int, Stream] = {}
        self._next = 0
        self.cancelled_total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream-watchdog", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def watch(self, method: str, ctx: Cancellable) -> Iterator[Stream]:
        s = Stream(method, ctx)
        with self._lock:
            sid = self._next
            self._next += 1
            self._streams[sid] = s
        try:
            yield s
        finally:
            with self._lock:
                del self._streams[sid]

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s):
            now = time.monotonic()
            with self._lock:
                idle = [
                    s
                    for s in self._streams.values()
                    if not s.cancelled and now - s.last_s > self.idle_timeout_s
                ]
                for s in idle:
                    s.cancelled = True
                self.cancelled_total += len(idle)
            for s in idle:
                log.info("%s stream idle for %.0f s: cancelled", s.method, self.idle_timeout_s)
                s.ctx.cancel()

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
