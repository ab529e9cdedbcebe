"""Write-back from the top tier to the tiers below it (DESIGN §6).

``commit`` returns once blocks are in DRAM; this module carries them to SSD in the
background. Dirty bytes are bounded: past ``max_dirty_bytes`` a commit waits for the
flusher (back-pressure, counted) until its deadline, then the blocks that still do not
fit are refused and counted — never silently lost.

``NullWriteBack`` is the single-tier case: nothing below, so nothing is ever dirty.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.keys import Key, Namespace
from kvstore.tier import Tier

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Batch:
    ns: Namespace
    keys: tuple[Key, ...]
    data: bytes  # rows of ns.block_bytes, one per key
    seq: int


class WriteBack(ABC):
    """Contract: ``reserve`` waits until ``n_blocks`` of ``block_bytes`` fit under the dirty
    bound or the deadline passes, and returns how many blocks were granted; ``submit``
    hands over exactly the granted blocks and returns a ticket that ``wait`` blocks on
    until those blocks are durable below (or the deadline). ``last_ticket`` is the
    newest ticket handed out, which ``flush`` waits for."""

    counters: Counter[str]

    @abstractmethod
    def reserve(self, n_blocks: int, block_bytes: int, deadline_s: float | None) -> int: ...

    @abstractmethod
    def last_ticket(self) -> int: ...

    @abstractmethod
    def submit(self, ns: Namespace, keys: Sequence[Key], data: bytes) -> int: ...

    @abstractmethod
    def wait(self, ticket: int, deadline_s: float | None) -> bool: ...

    @abstractmethod
    def note_hits(self, ns: Namespace, keys: Sequence[Key]) -> None:
        """Blocks served from the top tier: refresh their lower copies' retention soon."""

    @abstractmethod
    def dirty_bytes(self) -> int: ...

    @abstractmethod
    def close(self, deadline_s: float | None) -> None: ...

    @property
    def durable_level(self) -> str:
        return "ssd"


class NullWriteBack(WriteBack):
    def __init__(self) -> None:
        self.counters = Counter()

    def reserve(self, n_blocks: int, block_bytes: int, deadline_s: float | None) -> int:
        return n_blocks

    def last_ticket(self) -> int:
        return 0

    def submit(self, ns: Namespace, keys: Sequence[Key], data: bytes) -> int:
        return 0

    def wait(self, ticket: int, deadline_s: float | None) -> bool:
        return True

    def note_hits(self, ns: Namespace, keys: Sequence[Key]) -> None:
        pass

    def dirty_bytes(self) -> int:
        return 0

    def close(self, deadline_s: float | None) -> None:
        pass

    @property
    def durable_level(self) -> str:
        return "dram"


def _remaining(deadline_s: float | None) -> float | None:
    return None if deadline_s is None else max(0.0, deadline_s - time.monotonic())


class ThreadWriteBack(WriteBack):
    """One flusher thread draining a FIFO of committed batches into the lower tiers."""

    def __init__(
        self,
        lower: Sequence[Tier],
        *,
        max_dirty_bytes: int,
        batch_blocks: int = 32,
        touch_interval_s: float = 30.0,
        max_pending_touches: int = 1 << 20,
    ) -> None:
        self._lower = list(lower)
        self._max_dirty = max_dirty_bytes
        self._batch_blocks = batch_blocks
        self._touch_interval_s = touch_interval_s
        self._max_touches = max_pending_touches
        self._queue: deque[_Batch] = deque()
        self._dirty = 0
        self._reserved = 0
        self._next_seq = 1
        self._done_seq = 0  # every batch with seq <= this is durable (or failed, counted)
        # Hits per namespace, in the order they happened (each a chain prefix).
        self._touches: dict[bytes, tuple[Namespace, list[tuple[Key, ...]]]] = {}
        self._touch_keys = 0
        self._cond = threading.Condition()
        self._stop = False
        self.counters = Counter()
        self._thread = threading.Thread(target=self._run, name="kvstore-writeback", daemon=True)
        self._thread.start()

    def reserve(self, n_blocks: int, block_bytes: int, deadline_s: float | None) -> int:
        with self._cond:

            def fits() -> int:
                room = self._max_dirty - self._dirty - self._reserved
                idle = self._dirty == 0 and self._reserved == 0
                # An idle queue always takes one block, so a block larger than the bound
                # (or a tiny bound in tests) still makes progress instead of deadlocking.
                return min(n_blocks, max(room // block_bytes, 1 if idle else 0))

            if fits() < n_blocks:
                self.counters["backpressure_waits_total"] += 1
                self._cond.wait_for(lambda: fits() > 0 or self._stop, _remaining(deadline_s))
            granted = fits()
            self._reserved += granted * block_bytes
            return granted

    def last_ticket(self) -> int:
        with self._cond:
            return self._next_seq - 1

    def submit(self, ns: Namespace, keys: Sequence[Key], data: bytes) -> int:
        with self._cond:
            self._reserved -= len(data)
            if not keys:
                return self._done_seq
            seq = self._next_seq
            self._next_seq += 1
            self._queue.append(_Batch(ns, tuple(keys), data, seq))
            self._dirty += len(data)
            self._cond.notify_all()
            return seq

    def wait(self, ticket: int, deadline_s: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._done_seq >= ticket, _remaining(deadline_s))

    def note_hits(self, ns: Namespace, keys: Sequence[Key]) -> None:
        with self._cond:
            if self._touch_keys + len(keys) > self._max_touches:
                self.counters["touches_dropped_total"] += len(keys)
                return
            self._touches.setdefault(ns.fingerprint, (ns, []))[1].append(tuple(keys))
            self._touch_keys += len(keys)

    def dirty_bytes(self) -> int:
        with self._cond:
            return self._dirty

    def close(self, deadline_s: float | None) -> None:
        self.wait(self.last_ticket(), deadline_s)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=_remaining(deadline_s))

    # -- flusher ------------------------------------------------------------------
    def _take(self) -> list[_Batch]:
        out: list[_Batch] = []
        blocks = 0
        while self._queue and (not out or blocks + len(self._queue[0].keys) <= self._batch_blocks):
            b = self._queue.popleft()
            out.append(b)
            blocks += len(b.keys)
        return out

    def _run(self) -> None:
        last_touch = time.monotonic()
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._queue or self._stop, timeout=self._touch_interval_s
                )
                if self._stop and not self._queue:
                    return
                batches = self._take()
                touches = None
                if time.monotonic() - last_touch >= self._touch_interval_s and self._touches:
                    touches, self._touches, self._touch_keys = self._touches, {}, 0
            for b in batches:
                self._write(b)
            if touches is not None:
                last_touch = time.monotonic()
                self._refresh(touches)
            with self._cond:
                for b in batches:
                    self._dirty -= len(b.data)
                    self._done_seq = max(self._done_seq, b.seq)
                self._cond.notify_all()

    def _write(self, b: _Batch) -> None:
        for tier in self._lower:
            try:
                res = tier.put(b.ns, b.keys, b.data)
                self.counters["writeback_blocks_total"] += res.inserted
                self.counters["writeback_dropped_total"] += res.dropped
            except Exception:  # a lower tier failing must not kill the flusher
                log.exception("write-back to %s failed", tier.name)
                self.counters["writeback_errors_total"] += len(b.keys)

    def _refresh(self, touches: dict[bytes, tuple[Namespace, list[tuple[Key, ...]]]]) -> None:
        for ns, hits in touches.values():
            # One touch call replaying every hit in order: ``touch`` applies last→first,
            # so the newest hit goes first in the list, and a key keeps only its newest
            # position — the lower tier ends with the recency it would have had if each
            # hit had been forwarded at once.
            keys = list(dict.fromkeys(k for hit in reversed(hits) for k in hit))
            for tier in self._lower:
                try:
                    tier.touch(ns, keys)
                except Exception:
                    log.exception("retention touch on %s failed", tier.name)
                    self.counters["touch_errors_total"] += 1
