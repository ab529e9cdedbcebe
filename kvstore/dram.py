"""The host-DRAM tier: size classes over one preallocated (pinned) buffer.

Recency lives in a per-class eviction policy from ``kvstore.eviction``; capacity is
managed in slots (``kvstore.dram_slots``), so the policy never evicts on its own: the
tier pops victims explicitly when it needs a slot, which is what lets pinned blocks and
cross-class chunk moves stay exact. Every public method takes the tier lock; copies happen under
it, so a block can never be evicted while it is being read.

Each block keeps the xxh3-64 made when it was committed beside its payload; reads check
the copy in the destination against it (DESIGN §4). A pinned block (``pin``) keeps its
slot until the lease ends: eviction skips it, a chunk holding it is never given away,
and deleting it only hides it (the slot is retired, then freed when the lease ends).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from kvstore.buffers import as_view, rows_view, writable_rows
from kvstore.dram_index import ClassIndex
from kvstore.dram_pool import DramPool
from kvstore.dram_slots import SlotAllocator
from kvstore.errors import IntegrityError, InvalidArgument, StoreUnavailable, UnknownNamespace
from kvstore.eviction import make_policy
from kvstore.keys import Key, Namespace
from kvstore.leases import Lease, LeaseTable
from kvstore.row_copy import make_row_copier
from kvstore.tier import PutResult, SizeClassStats, Tier, TierStats

_DEFAULT_CHUNK_BYTES = 64 << 20


_COUNTERS = (
    "get_blocks",
    "get_misses",
    "put_blocks",
    "put_dropped",
    "evictions",
    "chunk_moves",
    "leases_expired_total",
    "corrupt_blocks_total",  # copies that failed their checksum (DESIGN §4)
    "quarantined_blocks_total",  # of those, blocks whose stored copy was bad: dropped
)


@dataclass(frozen=True, slots=True)
class DramConfig:
    capacity_bytes: int
    chunk_bytes: int | None = None  # None: min(64 MiB, capacity / 8)
    policy: str = "lru"
    pin_memory: bool | None = None  # None: pin when CUDA is available
    lease_timeout_s: float = 30.0
    name: str = "dram"
    #: Threads that copy and check a read (``kvstore.row_copy``; the native copier where
    #: it is built): 1, or 2 to share a read with a helper thread; None = 2 when there
    #: are two cores.
    copy_threads: int | None = None

    def resolved_chunk_bytes(self) -> int:
        if self.chunk_bytes is not None:
            return self.chunk_bytes
        return max(4096, min(_DEFAULT_CHUNK_BYTES, self.capacity_bytes // 8))


class DramTier(Tier):
    def __init__(
        self, config: DramConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``clock`` (monotonic seconds) times pin leases; tests inject one to expire a
        lease without sleeping."""
        self.config = config
        self._clock = clock
        self.name = config.name
        pin = torch.cuda.is_available() if config.pin_memory is None else config.pin_memory
        self._pool = DramPool(config.capacity_bytes, config.resolved_chunk_bytes(), pin_memory=pin)
        self._classes: dict[int, ClassIndex] = {}
        self._namespaces: dict[bytes, Namespace] = {}
        self._leases = LeaseTable()
        self._copier = make_row_copier(config.copy_threads)
        self._lock = threading.RLock()
        self._tick = 0
        self._closed = False
        self.counters: Counter[str] = Counter(dict.fromkeys(_COUNTERS, 0))
        self._slots = SlotAllocator(self._pool, self._classes, self._leases, self.counters)

    # -- helpers --------------------------------------------------------------------
    def _state(self, ns: Namespace) -> ClassIndex:
        if self._closed:
            raise StoreUnavailable(f"{self.name} tier is closed")
        held = self._namespaces.get(ns.fingerprint)
        if held is not ns and held != ns:  # `is`: most calls pass the registered object
            raise UnknownNamespace(f"namespace {ns.model_id!r} is not registered with {self.name}")
        return self._classes[ns.block_bytes]

    @staticmethod
    def _held(cs: ClassIndex, key: Key, fp: bytes) -> bool:
        # Keys of different namespaces never collide by construction, but a tenant that
        # learned another's keys must still not read its blocks: check the owner.
        return cs.owner.get(key) == fp

    def _touch_locked(self, cs: ClassIndex, fp: bytes, keys: Sequence[Key]) -> None:
        self._tick = cs.touch_held(keys, fp, self._tick)

    def _expire_leases(self) -> None:
        for lease in self._leases.expired(self._clock()):
            self.counters["leases_expired_total"] += 1
            self._release_locked(lease)

    # -- Tier API -------------------------------------------------------------------
    def register(self, ns: Namespace) -> None:
        with self._lock:
            if self._closed:
                raise StoreUnavailable(f"{self.name} tier is closed")
            sc = self._pool.size_class(ns.block_bytes)
            if ns.block_bytes not in self._classes:
                policy = make_policy(self.config.policy, 0)
                self._classes[ns.block_bytes] = ClassIndex(sc, policy, self._pool.chunk_bytes)
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

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        checksums: list[int] | None = None,
    ) -> int:
        bb = ns.block_bytes
        out = writable_rows(dst, len(keys), bb)
        with self._lock:
            cs = self._state(ns)

            def touch(n: int) -> None:
                self._tick = cs.touch_found(keys, n, self._tick)

            # One call finds the held prefix of ``keys`` (``found``), copies it and checks
            # each copy against the checksum stored at commit, from the copy (RowCopier).
            # Recency is refreshed while the copy runs (the helper thread copies
            # meanwhile), for every block found; a block whose copy then fails is dropped
            # below if its stored copy is bad, or was read like any other.
            found, got = self._copier.copy_found(
                self._pool.view, cs.rows, keys, ns.fingerprint, out, bb, touch
            )
            if got < found:
                key = keys[got]
                self._corrupt(cs, key, cs.slot[key], as_view(out)[got * bb : (got + 1) * bb])
            if checksums is not None:
                checksums.extend(cs.csum[k] for k in keys[:got])
            self.counters["get_blocks"] += got
            self.counters["get_misses"] += len(keys) - got
            return got

    def _corrupt(self, cs: ClassIndex, key: Key, slot: int, copy: memoryview) -> None:
        """A copy failed its check. If the stored payload fails too, the block is bad and
        is dropped; otherwise the damage happened in the copy or the destination (memory
        the caller can write, such as a staging segment) and the block stays."""
        self.counters["corrupt_blocks_total"] += 1
        stored = self._pool.slot_view(cs.sc, slot)
        if xxhash.xxh3_64_intdigest(stored) != cs.csum[key]:
            self.counters["quarantined_blocks_total"] += 1
            self._slots.drop(cs, key)

    def put(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        src: Any,
        *,
        present_ok: bool = True,
        checksums: Sequence[int] | None = None,
    ) -> PutResult:
        bb = ns.block_bytes
        data = rows_view(src, len(keys), bb)
        if len(set(keys)) != len(keys):
            raise InvalidArgument("put: duplicate keys in one call")
        if checksums is not None and len(checksums) != len(keys):
            raise InvalidArgument(f"put: {len(checksums)} checksums for {len(keys)} keys")
        digest = xxhash.xxh3_64_intdigest
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
                slot = self._slots.alloc(cs)
                if slot is None:
                    dropped += 1
                    continue
                row = data[i * bb : (i + 1) * bb]
                self._pool.slot_view(cs.sc, slot)[:] = row
                # Hashed from the source, not the copy: a copy gone wrong must fail later.
                cs.csum[key] = digest(row) if checksums is None else checksums[i]
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
            for key in doomed:  # pinned ones vanish from the index; their slots wait
                self._slots.drop(cs, key)
            return len(doomed)

    # -- pins -----------------------------------------------------------------------
    def pin(self, ns: Namespace, keys: Sequence[Key], *, lease_s: float | None = None) -> Lease:
        """Pin the present prefix of ``keys`` until ``unpin`` or the lease expires.

        While the lease is active its blocks' memory is neither moved nor reused: they
        leave the eviction policy, a chunk holding one is never given to another size
        class, and ``delete_namespace`` only hides them. ``pinned_views`` reads them in
        place. On release they come back to the policy, most recent.
        """
        with self._lock:
            cs = self._state(ns)
            self._expire_leases()
            n = self.contains(ns, keys)
            held = tuple(keys[:n])
            slots = tuple(cs.slot[k] for k in held)
            ttl = self.config.lease_timeout_s if lease_s is None else lease_s
            lease = self._leases.add(
                ns.block_bytes, held, slots, tuple(cs.csum[k] for k in held), self._clock() + ttl
            )
            for key, slot in zip(held, slots, strict=True):
                if self._leases.pin_count(ns.block_bytes, slot) == 1:
                    cs.policy.remove(key)
                    cs.policy.resize(cs.policy.capacity - 1)
            return lease

    def pinned_views(self, lease: Lease) -> list[memoryview]:
        """Read-only views of the pinned payloads, in ``lease.keys`` order; check them
        against ``lease.checksums``. Valid until the lease ends (then the memory may be
        reused)."""
        with self._lock:
            if not self._leases.is_active(lease):
                raise InvalidArgument(f"lease {lease.lease_id} is not active")
            sc = self._classes[lease.block_bytes].sc
            return [self._pool.slot_view(sc, s).toreadonly() for s in lease.slots]

    def unpin(self, lease: Lease) -> None:
        with self._lock:
            if self._leases.is_active(lease):
                self._release_locked(lease)

    def _release_locked(self, lease: Lease) -> None:
        cs = self._classes[lease.block_bytes]
        self._leases.remove(lease)
        for key, slot in zip(reversed(lease.keys), reversed(lease.slots), strict=True):
            if self._leases.pin_count(lease.block_bytes, slot):
                continue
            cs.policy.resize(cs.policy.capacity + 1)
            if slot in cs.retired:  # its block was dropped meanwhile: the slot is free now
                cs.retired.remove(slot)
                cs.sc.free.append(slot)
            elif cs.slot.get(key) == slot:
                cs.policy.access(key)

    # -- introspection ----------------------------------------------------------------
    def namespace_blocks(self, fingerprints: Collection[bytes]) -> dict[bytes, int]:
        wanted = set(fingerprints)
        with self._lock:
            held: Counter[bytes] = Counter()
            for cs in self._classes.values():
                held.update(cs.owner.values())
        return {fp: held[fp] for fp in wanted}

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
                cs.check_maps()
                slots = cs.slot.values()
                live[bb] = set(slots) | cs.retired
                pinned = self._leases.pinned_slots(bb)
                if cs.retired & set(slots) or not cs.retired <= pinned:
                    raise IntegrityError(f"class {bb}: a retired slot is live or unpinned")
                if not pinned <= live[bb]:
                    raise IntegrityError(f"class {bb}: a lease pins a free slot")
                if set(cs.policy) != {k for k, s in cs.slot.items() if s not in pinned}:
                    raise IntegrityError(f"class {bb}: policy keys disagree with unpinned blocks")
                if cs.policy.capacity != cs.sc.slot_count - len(pinned):
                    raise IntegrityError(f"class {bb}: policy capacity disagrees with slots")
                cs.policy.check_integrity()
            self._pool.check_integrity(live)
            self._leases.check_integrity()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._copier.close()
