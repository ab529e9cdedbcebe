"""Where a new DRAM block goes: the DRAM tier's slot allocator (``kvstore.dram``).

Capacity is managed here, in slots, never by the eviction policies: a class with no free
slot first asks the pool for a chunk; failing that, room comes from the class whose
oldest block is the oldest of all — an eviction in the same class, or one of that
class's chunks given back to the pool (its blocks evicted or moved out) and lent to
this one. A pinned block's memory is never moved or reused: eviction skips it (it is
outside the policy), a chunk holding it is never given away, and dropping it retires
its slot until the lease ends.

It stands apart from the tier so that the tier reads as its API (reads, puts, pins,
stats) and this module as the one place that decides what is evicted and what moves.
It works on the tier's own maps, in place, under the tier's lock.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import cast

from kvstore.dram_index import ClassIndex
from kvstore.dram_pool import DramPool
from kvstore.keys import Key
from kvstore.leases import LeaseTable


class SlotAllocator:
    """The slots of every size class of one DRAM tier: ``alloc`` finds a slot for a new
    block, ``drop`` removes a held block. ``classes`` and ``counters`` are the tier's own
    (it adds classes as namespaces register; evictions and chunk moves are counted in
    its counters); the tier holds its lock around every call."""

    def __init__(
        self,
        pool: DramPool,
        classes: Mapping[int, ClassIndex],
        leases: LeaseTable,
        counters: Counter[str],
    ) -> None:
        self._pool = pool
        self._classes = classes
        self._leases = leases
        self._counters = counters

    def _pinned(self, cs: ClassIndex, slot: int) -> bool:
        return self._leases.pin_count(cs.sc.block_bytes, slot) > 0

    def _evict(self, cs: ClassIndex) -> bool:
        victim = cast(Key | None, cs.policy.pop_victim())
        if victim is None:
            return False
        cs.sc.free.append(cs.slot.pop(victim))
        del cs.owner[victim], cs.stamp[victim], cs.csum[victim]
        self._counters["evictions"] += 1
        return True

    def drop(self, cs: ClassIndex, key: Key) -> None:
        """Remove a held block from the index. A pinned one keeps its slot, retired, until
        its last lease ends: a lease holder may still be reading that memory."""
        slot = cs.slot.pop(key)
        del cs.owner[key], cs.stamp[key], cs.csum[key]
        if self._pinned(cs, slot):
            cs.retired.add(slot)
        else:
            cs.policy.remove(key)
            cs.sc.free.append(slot)

    def _oldest_class(self) -> ClassIndex | None:
        best, best_stamp = None, math.inf
        for cs in self._classes.values():
            victim = cast(Key | None, cs.policy.peek_victim())
            if victim is not None and cs.stamp[victim] < best_stamp:
                best, best_stamp = cs, cs.stamp[victim]
        return best

    def _shrink(self, cs: ClassIndex) -> bool:
        """Give one whole chunk of ``cs`` back to the pool, evicting and compacting; a chunk
        holding a pinned slot never moves. False (nothing evicted) when impossible."""
        sc = cs.sc
        movable = sc.chunks - {sc.chunk_of(s) for s in self._leases.pinned_slots(sc.block_bytes)}
        if not movable or len(sc.free) + len(cs.policy) < sc.slots_per_chunk:
            return False
        while len(sc.free) < sc.slots_per_chunk:
            self._evict(cs)
        per_chunk = Counter(sc.chunk_of(s) for s in sc.free)
        chunk = max(movable, key=per_chunk.__getitem__)
        lo, hi = chunk * sc.slots_per_chunk, (chunk + 1) * sc.slots_per_chunk
        outside = [s for s in sc.free if not lo <= s < hi]
        for key, slot in list(cs.slot.items()):
            if lo <= slot < hi:  # live block in the chunk being freed: move it out
                dst = outside.pop()
                sc.free.remove(dst)
                self._pool.move(sc, slot, dst)
                cs.slot[key] = dst
                sc.free.append(slot)
        self._pool.release_chunk(sc, chunk)
        cs.policy.resize(cs.policy.capacity - sc.slots_per_chunk)
        self._counters["chunk_moves"] += 1
        return True

    def _grow(self, cs: ClassIndex) -> bool:
        if not self._pool.grant_chunk(cs.sc):
            return False
        cs.policy.resize(cs.policy.capacity + cs.sc.slots_per_chunk)
        return True

    def alloc(self, cs: ClassIndex) -> int | None:
        sc = cs.sc
        while not sc.free:
            if self._grow(cs):
                break
            victim_cls = self._oldest_class()
            if victim_cls is None:
                return None  # nothing evictable: everything is pinned or the pool is empty
            if victim_cls is cs:
                self._evict(cs)
            elif not (self._shrink(victim_cls) and self._grow(cs)) and not self._evict(cs):
                # The oldest block's class cannot give a chunk back (pins in every chunk)
                # and this class has nothing of its own to evict.
                return None
        return sc.free.pop()
