"""Concurrency: how trace requests are spread over ``N`` streams (worker threads).

Both dispatchers take requests from one iterator in replay order (the simulator's order)
and hand them out in that order, so with one stream the replay *is* the simulator's
sequence: each request's lookup sees every earlier request committed, nothing later.
With more streams:

* ``pool``: one FIFO shared by all streams: the next free stream takes the next request.
  Requests overlap as in a serving fleet; a request may look up a prefix an earlier,
  still running request has not committed yet (a real-world miss the model cannot see).
* ``namespace``: each trace namespace (a kv-cache-tester session) is bound to one stream,
  streams taking namespaces round-robin in order of first appearance, so a session's
  turns stay in order: a turn starts after the previous one has committed, as an agent's
  would. Mooncake traces have one namespace and use ``pool``.

``--speed S`` paces dispatch at ``S`` × trace time (``inf``: as fast as the streams go).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

from kvstore.loadgen.errors import LoadgenError
from kvstore.loadgen.replay import TraceRequest

_QUEUE_PER_STREAM = 16
_STOP = None


class Pacer(ABC):
    """Holds the dispatcher back until a request is due."""

    @abstractmethod
    def wait_for(self, trace_time_s: float) -> None: ...


class Unpaced(Pacer):
    def wait_for(self, trace_time_s: float) -> None:
        return None


class Paced(Pacer):
    """Wall time since the first request = (trace time since it) / ``speed``."""

    def __init__(self, speed: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not speed > 0 or math.isinf(speed):
            raise LoadgenError(f"--speed must be a positive number or inf, got {speed}")
        self.speed = speed
        self._clock = clock
        self._start: tuple[float, float] | None = None

    def wait_for(self, trace_time_s: float) -> None:
        if self._start is None:
            self._start = (self._clock(), trace_time_s)
            return
        wall0, trace0 = self._start
        delay = wall0 + (trace_time_s - trace0) / self.speed - self._clock()
        if delay > 0:
            time.sleep(delay)


def make_pacer(speed: float) -> Pacer:
    return Unpaced() if math.isinf(speed) else Paced(speed)


class Dispatcher(ABC):
    """Runs ``handle`` over ``items`` on ``streams`` threads. Contract: items are handed out
    in iteration order; ``run`` returns when all are handled; an exception escaping
    ``handle`` stops dispatch and is re-raised by ``run``."""

    def __init__(self, streams: int, pacer: Pacer) -> None:
        if streams < 1:
            raise LoadgenError(f"--concurrency must be >= 1, got {streams}")
        self.streams = streams
        self.pacer = pacer
        self._error: BaseException | None = None
        self._stop = threading.Event()

    def run(self, items: Iterable[TraceRequest], handle: Callable[[TraceRequest], None]) -> None:
        queues = self._queues()
        threads = [
            threading.Thread(
                target=self._work, args=(q, handle), name=f"loadgen-stream-{i}", daemon=True
            )
            for i, q in enumerate(queues)
        ]
        for t in threads:
            t.start()
        try:
            for item in items:
                if self._stop.is_set():
                    break
                self.pacer.wait_for(item.request.time_s)
                self._put(queues[self._route(item)], item)
        finally:
            for q in queues:  # one stop per stream (the pool lists its one queue N times)
                self._put(q, _STOP)
            for t in threads:
                t.join()
        if self._error is not None:
            raise self._error

    def _put(self, q: queue.Queue[TraceRequest | None], item: TraceRequest | None) -> None:
        while True:  # a bounded put that notices a failed stream instead of blocking forever
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                if self._stop.is_set() and item is not _STOP:
                    return

    def _work(
        self, q: queue.Queue[TraceRequest | None], handle: Callable[[TraceRequest], None]
    ) -> None:
        while True:
            item = q.get()
            if item is _STOP:
                return
            if self._stop.is_set():
                continue  # drain so the dispatcher's puts complete
            try:
                handle(item)
            except BaseException as e:  # re-raised by run() in the caller's thread
                if self._error is None:
                    self._error = e
                self._stop.set()

    @abstractmethod
    def _queues(self) -> list[queue.Queue[TraceRequest | None]]:
        """One entry per stream; entries may be the same queue."""

    @abstractmethod
    def _route(self, item: TraceRequest) -> int: ...


class PoolDispatcher(Dispatcher):
    def _queues(self) -> list[queue.Queue[TraceRequest | None]]:
        return [queue.Queue(maxsize=_QUEUE_PER_STREAM * self.streams)] * self.streams

    def _route(self, item: TraceRequest) -> int:
        return 0


class NamespaceDispatcher(Dispatcher):
    def __init__(self, streams: int, pacer: Pacer) -> None:
        super().__init__(streams, pacer)
        self._stream_of: dict[bytes, int] = {}

    def _queues(self) -> list[queue.Queue[TraceRequest | None]]:
        return [queue.Queue(maxsize=_QUEUE_PER_STREAM) for _ in range(self.streams)]

    def _route(self, item: TraceRequest) -> int:
        fp = item.ns.fingerprint
        s = self._stream_of.get(fp)
        if s is None:
            s = self._stream_of[fp] = len(self._stream_of) % self.streams
        return s


DISPATCHERS: dict[str, type[Dispatcher]] = {
    "pool": PoolDispatcher,
    "namespace": NamespaceDispatcher,
}


def make_dispatcher(name: str, streams: int, speed: float) -> Dispatcher:
    try:
        cls = DISPATCHERS[name]
    except KeyError:
        raise LoadgenError(
            f"--streams: unknown mode {name!r}; known: auto, {', '.join(DISPATCHERS)}"
        ) from None
    return cls(streams, make_pacer(speed))
