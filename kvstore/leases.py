"""Pin leases: a pin that times out instead of leaking.

A client that pins blocks (to read them zero-copy, or while a transfer is in flight)
and then dies must not shrink the cache forever. Every pin is a lease with an expiry;
the owner of the table expires them lazily and counts each one.

Pins hold *slots*, not keys: while a lease is active the memory it names is neither
moved nor reused, even if its block is deleted or replaced meanwhile (the slot then
waits, retired, for the last lease on it to end).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from kvstore.errors import IntegrityError
from kvstore.keys import Key


@dataclass(frozen=True, slots=True)
class Lease:
    lease_id: int
    block_bytes: int
    keys: tuple[Key, ...]
    slots: tuple[int, ...]  # slot of keys[i] when pinned; stays put while the lease lives
    checksums: tuple[int, ...]  # stored xxh3-64 of each pinned payload, for zero-copy readers
    expires_at_s: float  # deadline on the owner's monotonic clock

    @property
    def count(self) -> int:
        return len(self.keys)


class LeaseTable:
    """Active leases and a pin count per (size class, slot). Not thread-safe: the owner
    locks."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._active: dict[int, Lease] = {}
        self._pins: dict[int, Counter[int]] = {}  # block_bytes -> slot -> pin count

    def add(
        self,
        block_bytes: int,
        keys: tuple[Key, ...],
        slots: tuple[int, ...],
        checksums: tuple[int, ...],
        expires_at_s: float,
    ) -> Lease:
        lease = Lease(next(self._ids), block_bytes, keys, slots, checksums, expires_at_s)
        self._active[lease.lease_id] = lease
        self._pins.setdefault(block_bytes, Counter()).update(slots)
        return lease

    def remove(self, lease: Lease) -> None:
        del self._active[lease.lease_id]
        pins = self._pins[lease.block_bytes]
        pins.subtract(lease.slots)
        for slot in lease.slots:
            if pins[slot] <= 0:
                del pins[slot]

    def is_active(self, lease: Lease) -> bool:
        return lease.lease_id in self._active

    def expired(self, now_s: float) -> list[Lease]:
        return [lease for lease in self._active.values() if lease.expires_at_s <= now_s]

    def pin_count(self, block_bytes: int, slot: int) -> int:
        pins = self._pins.get(block_bytes)
        return pins.get(slot, 0) if pins else 0

    def pinned_slots(self, block_bytes: int) -> set[int]:
        pins = self._pins.get(block_bytes)
        return set(pins) if pins else set()

    def pinned_total(self) -> int:
        return sum(len(p) for p in self._pins.values())

    def check_integrity(self) -> None:
        expect: dict[int, Counter[int]] = {}
        for lease in self._active.values():
            if len(lease.slots) != len(lease.keys) or len(lease.checksums) != len(lease.keys):
                raise IntegrityError(f"lease {lease.lease_id}: keys, slots, checksums disagree")
            expect.setdefault(lease.block_bytes, Counter()).update(lease.slots)
        if _nonempty(expect) != _nonempty(self._pins):
            raise IntegrityError("lease pin counts disagree with the active leases")


def _nonempty(pins: dict[int, Counter[int]]) -> dict[int, Counter[int]]:
    return {bb: +c for bb, c in pins.items() if +c}
