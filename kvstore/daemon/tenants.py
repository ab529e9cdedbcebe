"""Per-tenant accounting: what ``Stats`` and ``Flush`` show and wait for a tenant's token.

The store's own counters and tier usage are the whole daemon's; a tenant must see only
its own (SECURITY.md). ``TenantLedger`` counts each tenant's lookups, gets and commits
as the daemon serves them, remembers the write-back position after each tenant's last
commit (a tenant's ``Flush`` waits for that position, not for everyone's later blocks),
and builds a tenant's ``StoreStats``: tier capacities (configuration, not usage), the
blocks and bytes its namespaces hold in each tier that can count them, and its counters.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, runtime_checkable

from kvstore.errors import IntegrityError
from kvstore.keys import Namespace
from kvstore.tier import KVStore, SizeClassStats, StoreStats, TierStats

#: Counters of one tenant; the names are those of the store's own counters.
COUNTERS = (
    "lookups_total",
    "lookup_blocks_total",
    "lookup_hit_blocks_total",
    "gets_total",
    "get_blocks_total",
    "get_hit_blocks_total",
    "commits_total",
    "commit_blocks_total",
    "commit_present_blocks_total",
    "dropped_blocks_total",
)


@runtime_checkable
class MarkedFlush(Protocol):
    """A store whose flush can wait for a position of its write-back queue."""

    def writeback_mark(self) -> int: ...

    def flush(self, *, timeout_s: float | None = None, upto: int | None = None) -> None: ...


class TenantLedger:
    """Thread-safe counters and flush marks per tenant (the namespace's tenant field)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, Counter[str]] = {}
        self._marks: dict[str, int] = {}

    def count(self, tenant: str, **deltas: int) -> None:
        with self._lock:
            c = self._counts.setdefault(tenant, Counter({k: 0 for k in COUNTERS}))
            c.update(deltas)

    def counters(self, tenant: str) -> dict[str, int]:
        return self.counters_of(lambda t: t == tenant)

    def counters_of(self, scope: Callable[[str], bool]) -> dict[str, int]:
        """The counters summed over every tenant ``scope`` admits (a delegating token
        sees all of its sub-tenants together)."""
        total = Counter({k: 0 for k in COUNTERS})
        with self._lock:
            for tenant, c in self._counts.items():
                if scope(tenant):
                    total.update(c)
        return dict(total)

    def note_commit(self, tenant: str, store: KVStore) -> None:
        """Call after a tenant's commit returned: its blocks are queued up to here."""
        if isinstance(store, MarkedFlush):
            mark = store.writeback_mark()
            with self._lock:
                self._marks[tenant] = max(mark, self._marks.get(tenant, 0))

    def flush(
        self, scope: Callable[[str], bool] | None, store: KVStore, timeout_s: float | None
    ) -> None:
        """Wait for the accepted blocks of every tenant ``scope`` admits (``None``: for
        every block)."""
        if scope is None or not isinstance(store, MarkedFlush):
            store.flush(timeout_s=timeout_s)
            return
        with self._lock:
            marks = [m for t, m in self._marks.items() if scope(t)]
        if marks:
            store.flush(timeout_s=timeout_s, upto=max(marks))

    def forget(self, tenant: str) -> None:
        with self._lock:
            self._counts.pop(tenant, None)
            self._marks.pop(tenant, None)

    def check_integrity(self) -> None:
        with self._lock:
            for tenant, c in self._counts.items():
                if any(v < 0 for v in c.values()) or set(c) - set(COUNTERS):
                    raise IntegrityError(f"tenant {tenant!r}: counters negative or unknown")
                if c["lookup_hit_blocks_total"] > c["lookup_blocks_total"]:
                    raise IntegrityError(f"tenant {tenant!r}: more hits than blocks looked up")
                if c["get_hit_blocks_total"] > c["get_blocks_total"]:
                    raise IntegrityError(f"tenant {tenant!r}: more blocks got than asked for")


def held_blocks(
    store: KVStore, namespaces: Iterable[Namespace]
) -> dict[str, dict[int, int] | None]:
    """Blocks the given namespaces hold, per tier name and block size; ``None`` for a
    tier that cannot count them."""
    nss = list(namespaces)
    fps = {ns.fingerprint: ns.block_bytes for ns in nss}
    out: dict[str, dict[int, int] | None] = {}
    for tier in getattr(store, "tiers", ()):
        per_ns: Mapping[bytes, int] | None = tier.namespace_blocks(fps.keys())
        if per_ns is None:
            out[tier.name] = None
            continue
        by_class: Counter[int] = Counter({bb: 0 for bb in fps.values()})
        for fp, n in per_ns.items():
            if fp in fps:
                by_class[fps[fp]] += n
        out[tier.name] = dict(by_class)
    return out


def footprints(store: KVStore) -> dict[str, Callable[[int], int]]:
    """Per tier name, the bytes a block of a given size occupies there (its header and
    padding included where the tier stores them), so a tenant's usage is counted as the
    whole tier's is."""
    return {tier.name: tier.block_footprint for tier in getattr(store, "tiers", ())}


def tenant_stats(
    whole: StoreStats,
    held: Mapping[str, dict[int, int] | None],
    counters: Mapping[str, int],
    footprint: Mapping[str, Callable[[int], int]] | None = None,
) -> StoreStats:
    """``whole`` cut down to one tenant: capacities stay, usage is the tenant's own
    (``footprint``, by tier name, sizes each block as the tier does; else its payload)."""
    tiers = []
    for t in whole.tiers:
        mine = held.get(t.name)
        size = (footprint or {}).get(t.name, int)  # int(bb) == bb: the payload
        capacity = {c.block_bytes: c.capacity_blocks for c in t.size_classes}
        classes = tuple(
            SizeClassStats(bb, capacity.get(bb, 0), n) for bb, n in sorted((mine or {}).items())
        )
        tiers.append(
            TierStats(
                name=t.name,
                capacity_bytes=t.capacity_bytes,
                used_bytes=sum(size(c.block_bytes) * c.used_blocks for c in classes),
                size_classes=classes,
                info={"scope": "tenant", "held": "unknown" if mine is None else "exact"},
            )
        )
    return StoreStats(tiers=tuple(tiers), counters=dict(counters))
