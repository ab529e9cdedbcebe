"""The host-DRAM tier: size classes over one preallocated (pinned) buffer.

Recency lives in a per-class eviction policy from ``kvstore.eviction``; capacity is
managed here, in slots, so the policy never evicts on its own: the tier pops victims
explicitly when it needs a slot, which is what lets pinned blocks and cross-class
chunk moves stay exact. Every public method takes the tier lock; copies happen under
it, so a block can never be evicted while it is being read.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from kvstore.buffers import rows_view
from kvstore.dram_pool import DramPool, SizeClass
from kvstore.errors import IntegrityError, InvalidArgument, StoreUnavailable, UnknownNamespace
from kvstore.eviction import EvictionPolicy, make_policy
from kvstore.keys import Key, Namespace
from kvstore.leases import Lease, LeaseTable
from kvstore.tier import PutResult, SizeClassStats, Tier, TierStats

_DEFAULT_CHUNK_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class DramConfig:
    capacity_bytes: int
    chunk_bytes: int | None = None  # None: min(64 MiB, capacity / 8)
    policy: str = "lru"
    pin_memory: bool | None = None  # None: pin when CUDA is available
    lease_timeout_s: float = 30.0
    name: str = "dram"

    def resolved_chunk_bytes(self) -> int:
        if self.chunk_bytes is not None:
            return self.chunk_bytes
        return max(4096, min(_DEFAULT_CHUNK_BYTES, self.capacity_bytes // 8))


class _ClassState:
    """Index and recency of one size class."""

    def __init__(self, sc: SizeClass, policy: EvictionPolicy) -> None:
        self.sc = sc
        self.policy = policy
        self.slot: dict[Key, int] = {}
        self.owner: dict[Key, bytes] = {}  # key -> namespace fingerprint
        self.stamp: dict[Key, int] = {}  # logical clock of last access, for cross-class choice


class DramTier(Tier):
    def __init__(self, config: DramConfig) -> None:
        self.config = config
        self.name = config.name
        pin = torch.cuda.is_available() if config.pin_memory is None else config.pin_memory
        self._pool = DramPool(config.capacity_bytes, config.resolved_chunk_bytes(), pin_memory=pin)
        self._classes: dict[int, _ClassState] = {}
        self._namespaces: dict[bytes, Namespace] = {}
        self._leases = LeaseTable()
        self._lock = threading.RLock()
        self._tick = 0
        self._closed = False
        self.counters: Counter[str] = Counter()

    # -- helpers --------------------------------------------------------------------
    def _state(self, ns: Namespace) -> _ClassState:
        if self._closed:
            raise StoreUnavailable(f"{self.name} tier is closed")
        if self._namespaces.get(ns.fingerprint) != ns:
            raise UnknownNamespace(f"namespace {ns.model_id!r} is not registered with {self.name}")
        return self._classes[ns.block_bytes]

    @staticmethod
    def _held(cs: _ClassState, key: Key, fp: bytes) -> bool:
        # Keys of different namespaces never collide by construction, but a tenant that
        # learned another's keys must still not read its blocks: check the owner.
        return cs.owner.get(key) == fp

    def _touch_locked(self, cs: _ClassState, fp: bytes, keys: Sequence[Key]) -> None:
        for key in reversed(keys):
            if cs.owner.get(key) == fp and cs.policy.touch(key):
                self._tick += 1
                cs.stamp[key] = self._tick

    def _evict(self, cs: _ClassState) -> bool:
        victim = cast(Key | None, cs.policy.pop_victim())
        if victim is None:
            return False
        cs.sc.free.append(cs.slot.pop(victim))
        del cs.owner[victim], cs.stamp[victim]
        self.counters["evictions"] += 1
        return True

    def _oldest_class(self) -> _ClassState | None:
        best, best_stamp = None, math.inf
        for cs in self._classes.values():
            victim = cast(Key | None, cs.policy.peek_victim())
            if victim is not None and cs.stamp[victim] < best_stamp:
                best, best_stamp = cs, cs.stamp[victim]
        return best

    def _shrink(self, cs: _ClassState) -> None:
        """Give one whole chunk of ``cs`` back to the pool, evicting and compacting."""
        sc = cs.sc
        while len(sc.free) < sc.slots_per_chunk:
            if not self._evict(cs):
                return
        per_chunk = Counter(sc.chunk_of(s) for s in sc.free)
        chunk = max(per_chunk, key=per_chunk.__getitem__)
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
        self.counters["chunk_moves"] += 1

    def _grow(self, cs: _ClassState) -> bool:
        if not self._pool.grant_chunk(cs.sc):
            return False
        cs.policy.resize(cs.policy.capacity + cs.sc.slots_per_chunk)
        return True

    def _alloc(self, cs: _ClassState) -> int | None:
        sc = cs.sc
        while not sc.free:
            if self._grow(cs):
                break
            victim_cls = self._oldest_class()
            if victim_cls is None:
                return None  # nothing evictable: everything is pinned or the pool is empty
            if victim_cls is cs:
                self._evict(cs)
            else:
                self._shrink(victim_cls)
                if not self._grow(cs):
                    return None
        return sc.free.pop()

    def _expire_leases(self) -> None:
        for lease in self._leases.expired(time.monotonic()):
            self.counters["leases_expired_total"] += 1
            self._release_locked(lease)

    # -- Tier API -------------------------------------------------------------------
    def register(self, ns: Namespace) -> None:
        with self._lock:
            if self._closed:
                raise StoreUnavailable(f"{self.name} tier is closed")
            sc = self._pool.size_class(ns.block_bytes)
            if ns.block_bytes not in self._classes:
                self._classes[ns.block_bytes] = _ClassState(sc, make_policy(self.config.policy, 0))
            self._namespaces[ns.fingerprint] = ns

    def contains(self, ns: Namespace, keys: Sequence[Key]) -> int:
        with self._lock:
            owner, fp = self._state(ns).owner, ns.fingerprint
            n = 0
            for key in keys:
                if owner.get(key) != fp:
                    break
                n += 1
            return n

    def get_into(self, ns: Namespace, keys: Sequence[Key], dst: Any) -> int:
        bb = ns.block_bytes
        out = rows_view(dst, len(keys), bb, writable=True)
        with self._lock:
            cs = self._state(ns)
            fp = ns.fingerprint
            slots = [cs.slot[k] if cs.owner.get(k) == fp else None for k in keys]
            n = slots.index(None) if None in slots else len(slots)
            held = cast(list[int], slots[:n])
            view, sc, i = self._pool.view, cs.sc, 0
            while i < n:
                # Coalesce runs of adjacent slots in one chunk into a single copy.
                j = i + 1
                while (
                    j < n
                    and held[j] == held[j - 1] + 1
                    and sc.chunk_of(held[j]) == sc.chunk_of(held[i])
                ):
                    j += 1
                off = self._pool.offset(sc, held[i])
                out[i * bb : j * bb] = view[off : off + (j - i) * bb]
                i = j
            self._touch_locked(cs, fp, keys[:n])
            self.counters["get_blocks"] += n
            self.counters["get_misses"] += len(keys) - n
            return n

    def put(
        self, ns: Namespace, keys: Sequence[Key], src: Any, *, present_ok: bool = True
    ) -> PutResult:
        bb = ns.block_bytes
        data = rows_view(src, len(keys), bb)
        if len(set(keys)) != len(keys):
            raise InvalidArgument("put: duplicate keys in one call")
        with self._lock:
            cs = self._state(ns)
            fp = ns.fingerprint
            if not present_ok and any(self._held(cs, k, fp) for k in keys):
                raise InvalidArgument("put: key already present and present_ok=False")
            self._expire_leases()
            present = dropped = 0
            for i in range(len(keys) - 1, -1, -1):
                key = keys[i]
                if self._held(cs, key, fp):
                    present += 1
                    self._touch_locked(cs, fp, (key,))
                    continue
                if key in cs.slot:  # held for another namespace: refuse, never alias
                    dropped += 1
                    continue
                slot = self._alloc(cs)
                if slot is None:
                    dropped += 1
                    continue
                self._pool.slot_view(cs.sc, slot)[:] = data[i * bb : (i + 1) * bb]
                cs.slot[key] = slot
                cs.owner[key] = ns.fingerprint
                self._tick += 1
                cs.stamp[key] = self._tick
                evicted = cs.policy.access(key)
                if evicted:  # capacity is managed above, so the policy must not evict
                    raise IntegrityError(
                        f"{self.name}: policy evicted {len(evicted)} keys on insert"
                    )
            inserted = len(keys) - present - dropped
            self.counters["put_blocks"] += inserted
            self.counters["put_dropped"] += dropped
            return PutResult(inserted=inserted, present=present, dropped=dropped)

    def touch(self, ns: Namespace, keys: Sequence[Key]) -> None:
        with self._lock:
            self._touch_locked(self._state(ns), ns.fingerprint, keys)

    def delete_namespace(self, ns: Namespace) -> int:
        with self._lock:
            cs = self._state(ns)
            doomed = [k for k, fp in cs.owner.items() if fp == ns.fingerprint]
            for lease in self._leases.holding(doomed):
                self._release_locked(lease)
            for key in doomed:
                cs.policy.remove(key)
                cs.sc.free.append(cs.slot.pop(key))
                del cs.owner[key], cs.stamp[key]
            return len(doomed)

    # -- pins -----------------------------------------------------------------------
    def pin(self, ns: Namespace, keys: Sequence[Key], *, lease_s: float | None = None) -> Lease:
        """Pin the present prefix of ``keys`` until ``unpin`` or the lease expires.

        Pinned blocks leave the eviction policy (they cannot be chosen as victims) and
        come back to it, most recent, on release.
        """
        with self._lock:
            cs = self._state(ns)
            self._expire_leases()
            n = self.contains(ns, keys)
            held = tuple(keys[:n])
            ttl = self.config.lease_timeout_s if lease_s is None else lease_s
            lease = self._leases.add(ns.block_bytes, held, time.monotonic() + ttl)
            for key in held:
                if self._leases.pin_count(key) == 1:
                    cs.policy.remove(key)
                    cs.policy.resize(cs.policy.capacity - 1)
            return lease

    def unpin(self, lease: Lease) -> None:
        with self._lock:
            if self._leases.is_active(lease):
                self._release_locked(lease)

    def _release_locked(self, lease: Lease) -> None:
        cs = self._classes[lease.block_bytes]
        self._leases.remove(lease)
        for key in reversed(lease.keys):
            if self._leases.pin_count(key) == 0 and key in cs.slot:
                cs.policy.resize(cs.policy.capacity + 1)
                cs.policy.access(key)

    # -- introspection ----------------------------------------------------------------
    def stats(self) -> TierStats:
        with self._lock:
            classes = []
            used = 0
            free_chunks = len(self._pool.free_chunks)
            for bb, cs in sorted(self._classes.items()):
                sc = cs.sc
                used += len(cs.slot) * bb
                capacity = sc.slot_count + free_chunks * sc.slots_per_chunk
                classes.append(SizeClassStats(bb, capacity, len(cs.slot)))
            return TierStats(
                name=self.name,
                capacity_bytes=self._pool.capacity_bytes,
                used_bytes=used,
                size_classes=tuple(classes),
                counters=dict(self.counters, pinned_blocks=self._leases.pinned_total()),
                info={"pinned_memory": str(self._pool.pinned), "policy": self.config.policy},
            )

    def check_integrity(self) -> None:
        with self._lock:
            live: dict[int, set[int]] = {}
            for bb, cs in self._classes.items():
                slots = list(cs.slot.values())
                if len(set(slots)) != len(slots):
                    raise IntegrityError(f"class {bb}: two keys share a slot")
                live[bb] = set(slots)
                if set(cs.owner) != set(cs.slot) or set(cs.stamp) != set(cs.slot):
                    raise IntegrityError(f"class {bb}: owner/stamp maps disagree with the index")
                pinned = {k for k in cs.slot if self._leases.pin_count(k)}
                if set(cs.policy) != set(cs.slot) - pinned:
                    raise IntegrityError(f"class {bb}: policy keys disagree with unpinned blocks")
                if cs.policy.capacity != cs.sc.slot_count - len(pinned):
                    raise IntegrityError(f"class {bb}: policy capacity disagrees with slots")
                cs.policy.check_integrity()
            self._pool.check_integrity(live)
            self._leases.check_integrity()

    def close(self) -> None:
        with self._lock:
            self._closed = True
