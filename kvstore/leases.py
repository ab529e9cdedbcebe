"""Pin leases: a pin that times out instead of leaking.

A client that pins blocks (to read them zero-copy, or while a transfer is in flight)
and then dies must not shrink the cache forever. Every pin is a lease with an expiry;
the owner of the table expires them lazily and counts each one.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from kvstore.errors import IntegrityError
from kvstore.keys import Key


@dataclass(frozen=True, slots=True)
class Lease:
    lease_id: int
    block_bytes: int
    keys: tuple[Key, ...]
    expires_at_s: float  # time.monotonic() deadline

    @property
    def count(self) -> int:
        return len(self.keys)


class LeaseTable:
    """Active leases and a pin count per key. Not thread-safe: the owner locks."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._active: dict[int, Lease] = {}
        self._pins: Counter[Key] = Counter()

    def add(self, block_bytes: int, keys: tuple[Key, ...], expires_at_s: float) -> Lease:
        lease = Lease(next(self._ids), block_bytes, keys, expires_at_s)
        self._active[lease.lease_id] = lease
        self._pins.update(keys)
        return lease

    def remove(self, lease: Lease) -> None:
        del self._active[lease.lease_id]
        self._pins.subtract(lease.keys)
        for key in lease.keys:
            if self._pins[key] <= 0:
                del self._pins[key]

    def is_active(self, lease: Lease) -> bool:
        return lease.lease_id in self._active

    def expired(self, now_s: float) -> list[Lease]:
        return [lease for lease in self._active.values() if lease.expires_at_s <= now_s]

    def holding(self, keys: Iterable[Key]) -> list[Lease]:
        wanted = set(keys)
        return [lease for lease in self._active.values() if wanted.intersection(lease.keys)]

    def pin_count(self, key: Key) -> int:
        return self._pins.get(key, 0)

    def pinned_total(self) -> int:
        return len(self._pins)

    def check_integrity(self) -> None:
        expect: Counter[Key] = Counter()
        for lease in self._active.values():
            expect.update(lease.keys)
        if expect != self._pins:
            raise IntegrityError("lease pin counts disagree with the active leases")
