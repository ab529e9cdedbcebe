"""Batched last-access bookkeeping (DESIGN §6: coarse buckets, updated in batches).

Every access gets a stamp ``(bucket, seq)`` when it happens; ``seq`` is one global
counter, so recency order is exact even inside a one-minute bucket. Touches of blocks
already on disk wait here and reach LMDB in one transaction per batch (every
``touch_flush_s`` or ``touch_batch_max`` keys, and before any eviction or sweep), so a
hot block costs one index write per batch, not one per hit. A crash loses at most the
pending batch: recency only, never data.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from storage_nodes.ssd.config import SSDConfig
from storage_nodes.ssd.index import Index, Location, Txn

Stamp = tuple[int, int]  # (bucket, seq)


class Recency:
    def __init__(self, config: SSDConfig, first_seq: int) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._pending: dict[bytes, Stamp] = {}
        self._next = first_seq
        self._last_flush = time.monotonic()

    @property
    def high_water(self) -> int:
        """The largest seq handed out so far (persisted with every transaction using one)."""
        with self._lock:
            return self._next - 1

    def stamps(self, n: int) -> list[Stamp]:
        """Stamps for ``n`` keys accessed last→first: element ``i`` is for key ``i``, and
        key 0 gets the newest, so the head of a chain ends up most recent."""
        bucket = self._config.bucket_of(self._config.clock())
        with self._lock:
            first = self._next
            self._next += n
        return [(bucket, first + n - 1 - i) for i in range(n)]

    def note(self, fkeys: Sequence[bytes], stamps: Sequence[Stamp]) -> None:
        with self._lock:
            pending = self._pending
            for fk, st in zip(fkeys, stamps, strict=True):
                old = pending.get(fk)
                if old is None or old[1] < st[1]:
                    pending[fk] = st

    def pending_stamp(self, fkey: bytes) -> Stamp | None:
        with self._lock:
            return self._pending.get(fkey)

    def due(self) -> bool:
        with self._lock:
            if not self._pending:
                return False
            return (
                len(self._pending) >= self._config.touch_batch_max
                or time.monotonic() - self._last_flush >= self._config.touch_flush_s
            )

    def take(self) -> dict[bytes, Stamp]:
        with self._lock:
            out, self._pending = self._pending, {}
            self._last_flush = time.monotonic()
            return out

    def apply(self, index: Index, txn: Txn, batch: dict[bytes, Stamp]) -> int:
        """Write a taken batch inside ``txn``; absent keys and stale stamps are skipped."""
        done = 0
        for fk, (bucket, seq) in batch.items():
            loc: Location | None = index.get(txn, fk)
            if loc is not None and loc.seq < seq:
                index.retouch(txn, fk, loc, bucket, seq)
                done += 1
        index.set_seq_high_water(txn, self.high_water)
        return done

    def flush_into(self, index: Index, txn: Txn) -> int:
        return self.apply(index, txn, self.take())
