"""Slot allocation: free-slot reservation, slab (chunk) growth and capacity eviction.

Invariants this class keeps, the ones crash safety rests on:

* A slot is handed to a writer only if the free list says so in a *committed*
  transaction: a freed slot is reused only after the transaction that freed it commits.
* A reserved slot stays in the on-disk free list until the put that reserved it
  publishes; a crash before that leaves it free, so reservations never leak.
* Capacity is shared between size classes in whole slabs: when a class needs room and
  no slab is unallocated, the least recently used block goes; if it belongs to another
  class, its whole slab is emptied and handed over (DESIGN §6: whole chunks move).
* Evictions are made for a put: the one reserving (``reserve``), or the next one of the
  same class and size, while a put's writes are in flight (``stock``) — never more than
  one put's room ahead, so the blocks that leave early are the ones the next put would
  evict anyway, and counting them as capacity evictions stays true (issue #14 item 5).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from itertools import islice

from kvstore.errors import IntegrityError
from storage_nodes.ssd.config import SSDConfig, slot_bytes_for
from storage_nodes.ssd.errors import SSDIOError
from storage_nodes.ssd.index import Index, Slot, Txn
from storage_nodes.ssd.index_room import RECORD_BYTES
from storage_nodes.ssd.recency import Recency
from storage_nodes.ssd.slab_table import SlabTable
from storage_nodes.ssd.slabs import FULL_ERRNOS, SlabFiles

log = logging.getLogger("storage_nodes.ssd")

_REFILL = 1024
_VICTIM_BATCH = 256
_GROW_RETRY_S = 60.0  # after a slab could not be created for lack of space
#: the room ``stock`` keeps ahead is at most this share of a class's slots
_STOCK_SHARE = 64


class SlotAllocator:
    def __init__(
        self,
        config: SSDConfig,
        index: Index,
        files: SlabFiles,
        recency: Recency,
        count: Callable[[Counter[str]], None],
        table: SlabTable,
    ) -> None:
        self._config = config
        self._index = index
        self._files = files
        self._table = table
        self._recency = recency
        self._count = count
        self._lock = threading.Lock()
        self._cache: dict[int, list[Slot]] = {}
        self._cached: set[Slot] = set()
        self._reserved: set[Slot] = set()
        self._reserved_in: Counter[int] = Counter()
        self._grow_blocked_until = 0.0
        with index.begin() as txn:
            self.slab_class = {s: i.block_bytes for s, i in index.slab_table(txn).items()}
        # Derived from ``slab_class`` and kept with it (``_assign``): ``stock`` asks both
        # on every put, and counting a 1 TiB store's 4096 slabs took ~0.25 ms a put.
        self._slabs_of: Counter[int] = Counter(self.slab_class.values())
        #: slabs beyond the capacity (a reduced one), until ``shrink_to_capacity`` at open
        self._beyond = sum(1 for s in self.slab_class if s >= config.chunks)

    def nslots(self, block_bytes: int) -> int:
        return self._config.slab_bytes // slot_bytes_for(block_bytes)

    # -- reservation ------------------------------------------------------------------
    def reserve(self, block_bytes: int, n: int) -> list[Slot]:
        """Up to ``n`` free slots of the class, evicting if needed; fewer if the capacity
        cannot hold them. Raises ``SSDIOError`` when a slab cannot be created."""
        out: list[Slot] = []
        with self._lock:
            while len(out) < n:
                cache = self._cache.setdefault(block_bytes, [])
                while cache and len(out) < n:
                    s = cache.pop()
                    self._cached.discard(s)
                    self._reserved.add(s)  # before any refill, which must skip it
                    self._reserved_in[s[0]] += 1
                    out.append(s)
                if len(out) == n or self._refill(block_bytes) or self._grow(block_bytes):
                    continue
                if not self._evict(block_bytes, n - len(out)):
                    break
        return out

    def stock(self, block_bytes: int, n: int) -> int:
        """Make room now for a next put of ``n`` blocks of the class, so that it finds
        its slots free and its first writes go in without an eviction transaction before
        them; returns the slots evicted for it.

        Called by a put while its writes are in flight (the device is busy; this thread
        would only wait, and a put beside it then reserves without a transaction). Only
        at capacity: while a slab can still be created the next put grows into it, and
        nothing is evicted ahead. Free slots already at hand count towards ``n``, so the
        room kept ahead never exceeds one put's. Only where that room is at most a 64th
        of the class's slots: a store holding thousands of puts loses a negligible share
        of its capacity to it, and a small one (where a put is a large share) keeps
        evicting exactly on demand."""
        with self._lock:
            if n * _STOCK_SHARE > self._slabs_of[block_bytes] * self.nslots(block_bytes):
                return 0
            have = len(self._cache.get(block_bytes, ()))
            if have >= n or self._can_grow():
                return 0
            if self._refill(block_bytes):
                have = len(self._cache[block_bytes])
                if have >= n:
                    return 0
            freed = self._evict(block_bytes, n - have)
            if freed:
                self._refill(block_bytes)
            return freed

    def release(self, slots: Sequence[Slot]) -> None:
        """End reservations whose slots stay free: an aborted put, or slots given back."""
        self.settle(slots, ())

    def settle(self, slots: Sequence[Slot], published: Collection[int]) -> None:
        """End a publish's reservations: ``slots[j]`` for ``j`` in ``published`` now hold
        blocks, the others (their keys raced in elsewhere) are free again. One pass, set
        and count operations at C speed: it runs after a put's last write, device idle."""
        with self._lock:
            self._reserved.difference_update(slots)
            for slab, k in Counter(s[0] for s in slots).items():
                self._reserved_in[slab] -= k
            if len(published) == len(slots):
                return  # the usual publish: nothing goes back to the free cache
            for j, s in enumerate(slots):
                if j not in published and self.slab_class.get(s[0]) is not None:
                    self._cache.setdefault(self.slab_class[s[0]], []).append(s)
                    self._cached.add(s)

    def _refill(self, block_bytes: int) -> bool:
        cache = self._cache.setdefault(block_bytes, [])
        with self._index.begin() as txn:
            scan = islice(
                self._index.iter_free(txn, block_bytes),
                _REFILL + len(self._reserved) + len(self._cached),
            )
            fresh = [s for s in scan if s not in self._reserved and s not in self._cached][:_REFILL]
        fresh.reverse()  # pop() from the end hands out low slots first: denser slabs
        cache[:0] = fresh
        self._cached.update(fresh)
        return bool(fresh)

    def _can_grow(self) -> bool:
        # some slab below the capacity is unallocated iff fewer than ``chunks`` are
        has_free = len(self.slab_class) - self._beyond < self._config.chunks
        return has_free and time.monotonic() >= self._grow_blocked_until

    def _assign(self, slab: int, block_bytes: int | None) -> None:
        """Give ``slab`` to a class (``None``: to none)."""
        old = self.slab_class.get(slab)
        if old is not None:
            self._slabs_of[old] -= 1
        if block_bytes is None:
            self.slab_class.pop(slab, None)
        else:
            self.slab_class[slab] = block_bytes
            self._slabs_of[block_bytes] += 1

    def _unallocated(self) -> int | None:
        return next((s for s in range(self._config.chunks) if s not in self.slab_class), None)

    def _grow(self, block_bytes: int) -> bool:
        if not self._can_grow():
            return False
        slab = self._unallocated()
        assert slab is not None
        try:
            self._files.create(slab)  # durable before any record names it
        except SSDIOError as e:
            if e.errno not in FULL_ERRNOS or not self.slab_class:
                raise
            # The file system holds fewer slabs than the capacity asked for: keep
            # working inside the slabs there are (evicting) and retry growth later.
            self._grow_blocked_until = time.monotonic() + _GROW_RETRY_S
            log.warning(
                "SSD %s: file system full at %d slabs (%s); evicting within them",
                self._config.dir,
                len(self.slab_class),
                e,
            )
            return False
        with self._index.write(self.nslots(block_bytes) * RECORD_BYTES) as txn:
            self._index.create_slab(txn, slab, block_bytes, self.nslots(block_bytes))
        self._save_table({**self.slab_class, slab: block_bytes})
        self._assign(slab, block_bytes)
        return True

    def _save_table(self, table: dict[int, int]) -> None:
        """Durable before a slot of a new or handed-over slab can be written: a rebuild
        reads each slab's headers at its class's slot offsets (``slab_table.py``)."""
        self._table.write(self._config.slab_bytes, table)

    # -- eviction -----------------------------------------------------------------------
    def _evict(self, block_bytes: int, need: int) -> int:
        """Evict the ``need`` least recent blocks a put needs room for — no more, so
        every eviction counted is a real capacity eviction (DESIGN §6); returns the
        slots freed (a hand-over frees a whole slab)."""
        counts: Counter[str] = Counter()
        expiry = self._config.expiry_bucket(self._config.clock())
        freed = 0
        # room for a hand-over's free records, should the victim be of another class
        with self._index.write(self.nslots(block_bytes) * RECORD_BYTES) as txn:
            self._recency.flush_into(self._index, txn)
            skip: set[bytes] = set()
            used = self._index.deltas()  # slab use counts written once per slab
            while freed < need:
                batch = [
                    fk
                    # a window of what is still needed: a put of 32 looks at ~32 keys
                    for fk in islice(
                        self._index.iter_lru(txn), len(skip) + min(need - freed, _VICTIM_BATCH)
                    )
                    if fk not in skip
                ]
                if not batch:
                    break
                for fk in batch:
                    loc = self._index.get(txn, fk)
                    if loc is None:
                        continue
                    if self.slab_class[loc.slab] == block_bytes:
                        self._note_eviction(counts, loc.bucket, expiry)
                        self._index.remove(txn, fk, loc, used=used)
                        freed += 1
                    elif self._reserved_in[loc.slab]:
                        skip.add(fk)  # a put of that class is writing into this slab
                    else:
                        used.flush(txn)  # the hand-over reads the slab's use count
                        freed += self._hand_over(txn, loc.slab, block_bytes, counts, expiry)
                    if freed >= need:
                        break
            used.flush(txn)
        if counts["slab_handovers"]:
            self._save_table(self.slab_class)
        self._count(counts)
        self._config.crash_point("after_free")
        return freed

    def _hand_over(
        self, txn: Txn, slab: int, block_bytes: int, counts: Counter[str], expiry: int
    ) -> int:
        """Empty ``slab`` (evicting every block in it) and give it to ``block_bytes``."""
        old = self.slab_class[slab]
        for fk in list(self._index.iter_slab(txn, slab)):
            loc = self._index.get(txn, fk)
            if loc is not None:
                self._note_eviction(counts, loc.bucket, expiry)
                self._index.remove(txn, fk, loc)
        self._index.retire_slab(txn, slab, old, self.nslots(old))
        self._index.create_slab(txn, slab, block_bytes, self.nslots(block_bytes))
        self._drop_cached(slab, old)
        self._assign(slab, block_bytes)
        counts["slab_handovers"] += 1
        return self.nslots(block_bytes)

    def _drop_cached(self, slab: int, block_bytes: int) -> None:
        cache = self._cache.get(block_bytes, [])
        keep = [s for s in cache if s[0] != slab]
        for s in cache:
            if s[0] == slab:
                self._cached.discard(s)
        cache[:] = keep

    @staticmethod
    def _note_eviction(counts: Counter[str], bucket: int, expiry: int) -> None:
        if bucket < expiry:
            counts["expired_total"] += 1
        else:
            counts["evictions"] += 1
            counts["retention_violations_total"] += 1

    def shrink_to_capacity(self) -> None:
        """Slabs beyond a reduced capacity are emptied and deleted (at open)."""
        extra = sorted(s for s in self.slab_class if s >= self._config.chunks)
        if not extra:
            return
        counts: Counter[str] = Counter()
        with self._index.write() as txn:
            for slab in extra:
                for fk in list(self._index.iter_slab(txn, slab)):
                    loc = self._index.get(txn, fk)
                    if loc is not None:
                        counts["evictions"] += 1
                        counts["retention_violations_total"] += 1
                        self._index.remove(txn, fk, loc)
                bb = self.slab_class[slab]
                self._assign(slab, None)
                self._index.retire_slab(txn, slab, bb, self.nslots(bb))
        self._beyond = 0
        self._save_table(self.slab_class)
        for slab in extra:
            self._files.path(slab).unlink(missing_ok=True)
        self._count(counts)

    # -- integrity ---------------------------------------------------------------------
    def check(self, txn: Txn) -> None:
        with self._lock:
            table = {s: i.block_bytes for s, i in self._index.slab_table(txn).items()}
            if table != self.slab_class:
                raise IntegrityError("allocator's slab classes disagree with the index")
            if +self._slabs_of != Counter(table.values()):
                raise IntegrityError("allocator's slab counts per class disagree with its table")
            free = {bb: set(self._index.iter_free(txn, bb)) for bb in set(table.values())}
            for bb, cache in self._cache.items():
                for s in cache:
                    if s not in free.get(bb, ()) or s in self._reserved:
                        raise IntegrityError(f"cached free slot {s} is not free or is reserved")
            for s in self._reserved:
                if s not in free[self.slab_class[s[0]]]:
                    raise IntegrityError(f"reserved slot {s} left the on-disk free list")
            if len(self._cached) != sum(len(c) for c in self._cache.values()):
                raise IntegrityError("free-slot cache has duplicates")
            for slab in self.slab_class:
                size = self._files.size_of(slab)
                if size != self._config.slab_bytes:
                    raise IntegrityError(
                        f"slab file {slab} is {size} bytes, expected {self._config.slab_bytes}"
                    )
