"""The embedded store: ``KVStore`` over an ordered list of tiers (DESIGN §5–§6).

``tiers[0]`` is the top (DRAM); the rest are below it (SSD or the cluster). Tiers are
inclusive: commits go to the top and, by write-back, to every tier below; reads are
served by the fastest tier holding each block and lower-tier hits are promoted
(``prefix_reader.py``). A lower tier that raises is treated as a miss and counted:
lost blocks are misses, never errors to the engine.

Checksums are made once, at commit, and travel with each block into every tier; reads
are checked where the bytes land (in the tiers' ``get_into``), and a promotion keeps the
checksum the lower tier stored. Durability is acknowledged only for what the lower tier
accepted (``writeback.py``, ``writeback_thread.py``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import xxhash

from kvstore.buffers import block_view, io_buffer, rows_view
from kvstore.errors import InvalidArgument, NotDurable, StoreUnavailable, UnknownNamespace
from kvstore.keys import Key, Namespace
from kvstore.prefix_reader import PrefixReader
from kvstore.tier import (
    CommitResult,
    Durability,
    KVStore,
    LookupResult,
    StoreStats,
    Tier,
    TierStats,
)
from kvstore.writeback import NullWriteBack, Ticket, WriteBack
from kvstore.writeback_thread import ThreadWriteBack

log = logging.getLogger(__name__)


_COUNTERS = (
    "lookups_total",
    "lookup_blocks_total",
    "lookup_hit_blocks_total",
    "get_blocks_total",
    "commits_total",
    "commit_blocks_total",
    "dropped_blocks_total",
    "promoted_blocks_total",
    "tier_errors_total",
    "commit_not_durable_total",  # asked for "ssd", truthfully acknowledged at "dram"
    "flush_not_durable_total",  # flushes that raised NotDurable
)


@dataclass(frozen=True, slots=True)
class ManagerConfig:
    max_dirty_bytes: int | None = None  # None: 10 % of the top tier
    commit_wait_s: float = 5.0  # back-pressure wait when the call gives no deadline
    close_flush_s: float = 60.0
    writeback_batch_blocks: int = 32
    writeback_inflight: int = 2  # batches written to the lower tiers at once (flushers)
    retention_touch_interval_s: float = 30.0  # DESIGN §6: SSD copies refreshed within a minute
    prefetch_workers: int = 2


def _deadline(timeout_s: float | None, default_s: float | None = None) -> float | None:
    t = default_s if timeout_s is None else timeout_s
    return None if t is None else time.monotonic() + t


class TierManager(KVStore):
    def __init__(self, tiers: Sequence[Tier], config: ManagerConfig = ManagerConfig()) -> None:
        if not tiers:
            raise InvalidArgument("a tier manager needs at least one tier")
        self.tiers = list(tiers)
        self.config = config
        self._top = self.tiers[0]
        max_dirty = config.max_dirty_bytes
        if max_dirty is None:
            max_dirty = max(1, self._top.stats().capacity_bytes // 10)
        self._wb: WriteBack = (
            ThreadWriteBack(
                self.tiers[1:],
                max_dirty_bytes=max_dirty,
                batch_blocks=config.writeback_batch_blocks,
                inflight=config.writeback_inflight,
                touch_interval_s=config.retention_touch_interval_s,
            )
            if len(self.tiers) > 1
            else NullWriteBack()
        )
        self._pool = ThreadPoolExecutor(
            config.prefetch_workers, thread_name_prefix="kvstore-prefetch"
        )
        self._reader = PrefixReader(self.tiers, self._count_tier_error)
        self._namespaces: dict[bytes, Namespace] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.counters: Counter[str] = Counter(dict.fromkeys(_COUNTERS, 0))

    # -- helpers ------------------------------------------------------------------
    def _check(self, ns: Namespace) -> None:
        if self._closed:
            raise StoreUnavailable("store is closed")
        if self._namespaces.get(ns.fingerprint) != ns:
            raise UnknownNamespace(f"namespace {ns.model_id!r} is not registered")

    def _count_tier_error(self, i: int) -> None:
        log.warning("tier %s failed; treating as a miss", self.tiers[i].name, exc_info=True)
        with self._lock:
            self.counters["tier_errors_total"] += 1

    # -- KVStore --------------------------------------------------------------------
    def register(self, ns: Namespace, *, timeout_s: float | None = None) -> None:
        if self._closed:
            raise StoreUnavailable("store is closed")
        for tier in self.tiers:
            tier.register(ns)
        with self._lock:
            self._namespaces[ns.fingerprint] = ns

    def lookup(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> LookupResult:
        self._check(ns)
        tiers: list[str] = []
        for run in self._reader.runs(ns, keys):
            tiers.extend([self.tiers[run.tier].name] * run.length)
        with self._lock:
            self.counters["lookups_total"] += 1
            self.counters["lookup_blocks_total"] += len(keys)
            self.counters["lookup_hit_blocks_total"] += len(tiers)
        return LookupResult(hit_blocks=len(tiers), tiers=tuple(tiers))

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        timeout_s: float | None = None,
        checksums: list[int] | None = None,
    ) -> int:
        self._check(ns)
        bb = ns.block_bytes
        out = rows_view(dst, len(keys), bb, writable=True)
        sums: list[int] = []
        served = self._fetch(ns, keys, out, sums)
        hit = sum(served.values())
        if checksums is not None:
            checksums.extend(sums[:hit])
        if hit:
            self._wb.note_hits(ns, keys[:hit])
        with self._lock:
            self.counters["get_blocks_total"] += len(keys)
            for name, count in served.items():
                self.counters[f"get_hit_blocks_{name}"] += count
        return hit

    def _fetch(
        self, ns: Namespace, keys: Sequence[Key], out: memoryview, sums: list[int]
    ) -> Counter[str]:
        """Copy the hit prefix into ``out`` and promote what came from below
        (``PrefixReader.fetch``); count the promoted blocks."""
        got = self._reader.fetch(ns, keys, out, sums)
        if got.promoted:
            with self._lock:
                self.counters["promoted_blocks_total"] += got.promoted
        return got.served

    def commit(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        payloads: Mapping[int, Any],
        *,
        durability: Durability = "dram",
        timeout_s: float | None = None,
    ) -> CommitResult:
        self._check(ns)
        if durability not in ("dram", "ssd"):
            raise InvalidArgument(f"durability must be 'dram' or 'ssd', got {durability!r}")
        bb = ns.block_bytes
        views: dict[int, memoryview] = {}
        for idx, buf in payloads.items():  # validate everything before storing anything
            if not isinstance(idx, int) or not 0 <= idx < len(keys):
                raise InvalidArgument(
                    f"payload index {idx!r} outside the chain of {len(keys)} keys"
                )
            views[idx] = block_view(buf, bb)
        deadline = _deadline(timeout_s, self.config.commit_wait_s)
        new = [i for i in sorted(views) if not self._top.contains(ns, keys[i : i + 1])]
        present = len(views) - len(new)
        # The checksums that stay with these blocks in every tier (DESIGN §4).
        sums = {i: xxhash.xxh3_64_intdigest(views[i]) for i in new}
        waited = self._wb.last_ticket()
        tickets: list[Ticket] = []
        accepted = self._write_back(ns, keys, new, views, sums, deadline, tickets)
        ssd_wanted = durability == "ssd" and self._wb.durable_level == "ssd"
        if ssd_wanted and present:
            # Blocks already in DRAM are acknowledged at "ssd" only if the SSD accepts
            # them too: an earlier write-back of them may have been refused. The lower
            # tier only touches the ones it holds.
            old = [i for i in sorted(views) if i not in sums]
            for i in old:
                sums[i] = xxhash.xxh3_64_intdigest(views[i])
            if len(self._write_back(ns, keys, old, views, sums, deadline, tickets)) < len(old):
                ssd_wanted = False
        # The top tier keeps a chain's head: in the hit-rate model a commit touches the
        # chain last→first, so blocks past the tier's capacity are inserted and at once
        # evicted by the head. Skipping them here is the same end state without evicting
        # the head first (they still reach the lower tiers through write-back).
        cap = self._top_capacity_blocks(ns)
        in_top = [i for i in accepted if i < cap]
        res = self._top.put(
            ns,
            [keys[i] for i in in_top],
            b"".join(views[i] for i in in_top),
            checksums=[sums[i] for i in in_top],
        )
        # With a lower tier, a block the top refuses (all pinned) is still stored below.
        lost = res.dropped if self._wb.durable_level == "dram" else 0
        inserted, dropped = len(accepted) - lost, len(new) - len(accepted) + lost
        self._top.touch(ns, keys)
        achieved: Durability = "dram"
        if ssd_wanted:
            last = max([waited, *(t.seq for t in tickets)])
            deadline = _deadline(timeout_s)
            if (
                self._wb.wait(last, deadline)
                and not any(t.refused for t in tickets)
                and self._synced_below(deadline)
            ):
                achieved = "ssd"
        with self._lock:
            self.counters["commits_total"] += 1
            self.counters["commit_blocks_total"] += inserted
            self.counters["dropped_blocks_total"] += dropped
            if durability == "ssd" and achieved != "ssd":
                self.counters["commit_not_durable_total"] += 1
        return CommitResult(
            inserted=inserted, present=present, dropped=dropped, durability=achieved
        )

    def _write_back(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        idx: list[int],
        views: Mapping[int, memoryview],
        sums: Mapping[int, int],
        deadline: float | None,
        tickets: list[Ticket],
    ) -> list[int]:
        """Hand blocks ``idx`` to the write-back; returns those it took (a prefix).

        Reserved head first, in pieces that fit under the dirty bound: a commit larger
        than the bound streams through the flusher, and what the deadline refuses is the
        chain's tail, the least valuable part (DESIGN §6)."""
        accepted: list[int] = []
        while len(accepted) < len(idx):
            granted = self._wb.reserve(len(idx) - len(accepted), ns.block_bytes, deadline)
            if granted == 0:
                break
            part = idx[len(accepted) : len(accepted) + granted]
            # The flusher's copy of the rows, in page-aligned memory on huge pages: the
            # SSD tier writes such rows as they are (a ``bytes`` object is not page
            # aligned, so every put paid the tier's staging copy as well).
            bb = ns.block_bytes
            data = memoryview(io_buffer(len(part) * bb))[: len(part) * bb]
            for j, i in enumerate(part):
                data[j * bb : (j + 1) * bb] = views[i]
            tickets.append(
                self._wb.submit(ns, [keys[i] for i in part], data, [sums[i] for i in part])
            )
            accepted.extend(part)
        return accepted

    def _top_capacity_blocks(self, ns: Namespace) -> float:
        for c in self._top.stats().size_classes:
            if c.block_bytes == ns.block_bytes:
                return c.capacity_blocks
        return math.inf

    def prefetch(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> Future[int]:
        self._check(ns)
        keys = list(keys)

        def promote() -> int:
            runs = self._reader.runs(ns, keys)
            if not runs or all(r.tier == 0 for r in runs):
                return sum(r.length for r in runs)
            scratch = bytearray(len(keys) * ns.block_bytes)
            self._fetch(ns, keys, memoryview(scratch), [])
            return self._top.contains(ns, keys)

        return self._pool.submit(promote)

    def writeback_mark(self) -> int:
        """The write-back position covering every block accepted so far: ``flush(upto=``
        a mark ``)`` waits for those blocks and not for ones accepted later."""
        return self._wb.last_ticket()

    def flush(self, *, timeout_s: float | None = None, upto: int | None = None) -> None:
        ticket = self._wb.last_ticket() if upto is None else upto
        deadline = _deadline(timeout_s)
        self._drain(timeout_s, ticket)
        refused = self._wb.claim_refused(ticket)
        below = ", ".join(t.name for t in self.tiers[1:])
        if refused:
            with self._lock:
                self.counters["flush_not_durable_total"] += 1
            raise NotDurable(refused, f"refused by the tier below DRAM ({below})")
        unsynced = self._wb.sync_lower(deadline)
        if unsynced:
            with self._lock:
                self.counters["flush_not_durable_total"] += 1
            raise NotDurable(unsynced, f"the data sync of the tier below DRAM ({below}) failed")

    def _synced_below(self, deadline: float | None) -> bool:
        """Whether every block written back so far is durable below (``durability="ssd"``);
        a deadline passing first is a no, as for the write-back wait."""
        try:
            return self._wb.sync_lower(deadline) == 0
        except StoreUnavailable:
            return False

    def _drain(self, timeout_s: float | None, ticket: int | None = None) -> None:
        """Wait until every block accepted so far (up to ``ticket``) has been written back
        (or refused)."""
        if self._closed:
            raise StoreUnavailable("store is closed")
        if ticket is None:
            ticket = self._wb.last_ticket()
        if not self._wb.wait(ticket, _deadline(timeout_s)):
            raise StoreUnavailable("flush did not finish before its deadline")

    def delete_namespace(self, ns: Namespace, *, timeout_s: float | None = None) -> int:
        self._check(ns)
        self._drain(timeout_s)  # nothing of ns may land below after the delete
        return sum(tier.delete_namespace(ns) for tier in self.tiers)

    def stats(self, *, timeout_s: float | None = None) -> StoreStats:
        with self._lock:
            counters = dict(self.counters)
        counters.update(self._wb.counters)
        counters["dirty_bytes"] = self._wb.dirty_bytes()
        tiers = tuple(self._tier_stats(i) for i in range(len(self.tiers)))
        # One store-wide figure for DESIGN §4's corrupt-block count, whatever each tier
        # calls it: every failed check on a read path, in any tier.
        counters["corrupt_blocks_total"] = sum(
            int(t.counters.get("corrupt_blocks_total", 0)) for t in tiers
        )
        return StoreStats(tiers=tiers, counters=counters)

    def _tier_stats(self, i: int) -> TierStats:
        tier = self.tiers[i]
        if i == 0:
            return tier.stats()
        try:
            return tier.stats()
        except Exception as e:  # a failing lower tier must not take stats() down with it
            self._count_tier_error(i)
            return TierStats(tier.name, 0, 0, info={"error": f"{type(e).__name__}: {e}"})

    def check_integrity(self) -> None:
        self._wb.check_integrity()
        for tier in self.tiers:
            tier.check_integrity()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wb.close(_deadline(self.config.close_flush_s))
        self._pool.shutdown(wait=True)
        for tier in self.tiers:
            tier.close()
