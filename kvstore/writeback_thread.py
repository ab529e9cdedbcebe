"""The write-back of a store with tiers below its top: ``ThreadWriteBack``, flusher
threads that carry committed batches from DRAM into the lower tiers (DESIGN §6).

The contract it keeps — bounded dirty bytes, tickets, the refusal log that ``flush``
claims, ``sync_lower`` — is ``kvstore.writeback.WriteBack``; this module is the one
implementation with threads, queues and lower tiers to fail, kept apart from the contract
and its single-tier null object so each reads on its own.

Two batches are in flight at once (``inflight``): a lower tier's put returns only once
its writes completed, so one flusher leaves the SSD's queue empty between puts (its
publish, the next batch's reservation, a per-put sync where one is configured); with
two, one batch's writes overlap the other's. The SSD syncs its data behind its puts,
so the promise of ``durability="ssd"`` and ``flush()`` (durable against power loss) is
kept by ``sync_lower`` after the batches they cover are done. Batches may finish out
of order; a ticket counts as done only when every earlier batch is done too, so
``wait(seq)`` and the refusal log keep their in-order meaning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.errors import IntegrityError, StoreUnavailable
from kvstore.keys import Key, Namespace
from kvstore.tier import Tier
from kvstore.writeback import Ticket, WriteBack

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Batch:
    ns: Namespace
    keys: tuple[Key, ...]
    data: memoryview  # rows of ns.block_bytes, one per key (page aligned: see manager)
    checksums: tuple[int, ...]  # made at commit, one per key
    ticket: Ticket


_COUNTERS = (
    "writeback_blocks_total",  # inserted below
    "writeback_dropped_total",  # refused by a lower tier that answered
    "writeback_errors_total",  # refused by a lower tier that raised
    "writeback_refused_total",  # blocks some lower tier did not accept, either way
    "backpressure_waits_total",
    "touches_dropped_total",
    "touch_errors_total",
    "writeback_sync_failed_total",  # blocks written below whose data sync then failed
)

#: Refusal records kept for ``flush`` before the oldest are merged (one per failed batch).
_MAX_REFUSAL_RECORDS = 1 << 16


def _remaining(deadline_s: float | None) -> float | None:
    return None if deadline_s is None else max(0.0, deadline_s - time.monotonic())


class ThreadWriteBack(WriteBack):
    """``inflight`` flusher threads draining one FIFO of committed batches into the lower
    tiers (each takes the next batches in order; they complete in any order)."""

    def __init__(
        self,
        lower: Sequence[Tier],
        *,
        max_dirty_bytes: int,
        batch_blocks: int = 32,
        touch_interval_s: float = 30.0,
        max_pending_touches: int = 1 << 20,
        inflight: int = 2,
    ) -> None:
        if inflight < 1:
            raise ValueError(f"write-back needs at least one flusher, not {inflight}")
        self._lower = list(lower)
        self._max_dirty = max_dirty_bytes
        self._batch_blocks = batch_blocks
        self._touch_interval_s = touch_interval_s
        self._max_touches = max_pending_touches
        self._queue: deque[_Batch] = deque()
        self._dirty = 0
        self._reserved = 0
        self._next_seq = 1
        self._done_seq = 0  # every batch with seq <= this is done (durable or refused)
        # Batches done while an earlier one is still in flight: seq -> refused blocks.
        self._done_early: dict[int, int] = {}
        # (seq, refused blocks) of done batches with refusals not yet claimed by a flush,
        # in seq order (logged as ``_done_seq`` passes them).
        self._refusals: deque[tuple[int, int]] = deque()
        # Hits per namespace, in the order they happened (each a chain prefix).
        self._touches: dict[bytes, tuple[Namespace, list[tuple[Key, ...]]]] = {}
        self._touch_keys = 0
        # Blocks the lower tiers inserted since the last ``sync_lower`` began: what a
        # failed sync leaves unvouched for.
        self._unsynced = 0
        self._cond = threading.Condition()
        self._stop = False
        self._last_touch = time.monotonic()
        self.counters = Counter(dict.fromkeys(_COUNTERS, 0))
        self._threads = [
            threading.Thread(target=self._run, name=f"kvstore-writeback-{i}", daemon=True)
            for i in range(inflight)
        ]
        for t in self._threads:
            t.start()

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

    def submit(
        self, ns: Namespace, keys: Sequence[Key], data: memoryview, checksums: Sequence[int]
    ) -> Ticket:
        with self._cond:
            self._reserved -= len(data)
            if not keys:
                return Ticket(self._done_seq, 0)
            ticket = Ticket(self._next_seq, len(keys))
            self._next_seq += 1
            self._queue.append(_Batch(ns, tuple(keys), data, tuple(checksums), ticket))
            self._dirty += len(data)
            self._cond.notify_all()
            return ticket

    def wait(self, ticket: int, deadline_s: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._done_seq >= ticket, _remaining(deadline_s))

    def claim_refused(self, ticket: int) -> int:
        with self._cond:
            n = 0
            while self._refusals and self._refusals[0][0] <= ticket:
                n += self._refusals.popleft()[1]
            return n

    def sync_lower(self, deadline_s: float | None) -> int:
        with self._cond:
            n, self._unsynced = self._unsynced, 0
        failed = False
        for tier in self._lower:
            try:
                ok = tier.sync(timeout_s=_remaining(deadline_s))
            except StoreUnavailable:
                with self._cond:
                    self._unsynced += n  # not settled either way: the next sync covers them
                raise
            except Exception:  # a lower tier failing is its own error, not the caller's
                log.exception("data sync of %s failed", tier.name)
                ok = False
            failed = failed or not ok
        if not failed:
            return 0
        with self._cond:
            self.counters["writeback_sync_failed_total"] += n
        return max(n, 1)  # a failed sync vouches for nothing, even if no block was counted

    def check_integrity(self) -> None:
        with self._cond:
            queued = sum(len(b.data) for b in self._queue)
            if self._dirty < queued or self._reserved < 0:
                raise IntegrityError("write-back: dirty bytes below what is queued")
            seqs = [s for s, _ in self._refusals]
            if seqs != sorted(seqs) or any(s > self._done_seq for s in seqs):
                raise IntegrityError("write-back: refusal log out of order or ahead of done")
            if any(n <= 0 for _, n in self._refusals):
                raise IntegrityError("write-back: empty refusal record")
            if any(s <= self._done_seq or s >= self._next_seq for s in self._done_early):
                raise IntegrityError("write-back: a batch done early is not after the done mark")

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
        for t in self._threads:
            t.join(timeout=_remaining(deadline_s))

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
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._queue or self._stop, timeout=self._touch_interval_s
                )
                if self._stop and not self._queue:
                    return
                batches = self._take()
                touches = None
                now = time.monotonic()
                if now - self._last_touch >= self._touch_interval_s and self._touches:
                    touches, self._touches, self._touch_keys = self._touches, {}, 0
                    self._last_touch = now
            refused = [self._write(b) for b in batches]
            if touches is not None:
                self._refresh(touches)
            with self._cond:
                for b, n in zip(batches, refused, strict=True):
                    self._dirty -= len(b.data)
                    b.ticket.refused = n
                    self._done_early[b.ticket.seq] = n
                while self._done_seq + 1 in self._done_early:
                    self._done_seq += 1
                    n = self._done_early.pop(self._done_seq)
                    if n:
                        self._log_refusal(self._done_seq, n)
                self._cond.notify_all()

    def _log_refusal(self, seq: int, n: int) -> None:
        self.counters["writeback_refused_total"] += n
        self._refusals.append((seq, n))
        if len(self._refusals) > _MAX_REFUSAL_RECORDS:
            # Nobody flushes while blocks keep being refused: fold the two oldest records
            # into one, so the log stays bounded and the next flush still reports them.
            _, a = self._refusals.popleft()
            s2, b = self._refusals.popleft()
            self._refusals.appendleft((s2, a + b))

    def _write(self, b: _Batch) -> int:
        """Put the batch into every lower tier; returns how many of its blocks some tier
        did not accept (dropped, or all of them when the tier raised)."""
        refused = 0
        for tier in self._lower:
            try:
                res = tier.put(b.ns, b.keys, b.data, checksums=b.checksums)
                with self._cond:
                    self._unsynced += res.inserted
                self.counters["writeback_blocks_total"] += res.inserted
                self.counters["writeback_dropped_total"] += res.dropped
                refused = max(refused, res.dropped)
            except Exception:  # a lower tier failing must not kill the flusher
                log.exception("write-back to %s failed", tier.name)
                self.counters["writeback_errors_total"] += len(b.keys)
                refused = len(b.keys)
        return refused

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
