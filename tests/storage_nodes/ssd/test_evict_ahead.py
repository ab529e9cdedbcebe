"""Room made ahead (``SlotAllocator.stock``): on a full store, a put alone in flight
evicts the next put's room while its own writes are in flight, so that the next put's
first write does not wait for an eviction transaction.

The store here holds 256 small blocks (4 slabs of 64 slots): a put of 4 is at most a
64th of it, so room is made ahead for it; a put of 8 is not, and evicts on demand.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage_nodes.ssd import SSDTier
from storage_nodes.testing.crash import SimulatedCrash, abandon
from tests.io_backends import skip_without_uring
from tests.storage_nodes.ssd.helpers import (
    SLAB,
    CrashOn,
    chain,
    log_submissions,
    make_config,
    rows,
    small_ns,
    verify_all,
)

CAP = 4 * SLAB
SLOTS = 256


def _full(t: SSDTier) -> list[list[bytes]]:
    """Four chains of 64, oldest first: the store is full and nothing was evicted."""
    ns = small_ns()
    t.register(ns)
    chains = [chain(ns, 64, salt=s) for s in range(4)]
    for c in chains:
        assert t.put(ns, c, rows(ns, c)).inserted == 64
    assert t.stats().counters["evictions"] == 0
    return chains


def _held(t: SSDTier) -> int:
    """Blocks the index names (unlike ``verify_all``, which reads them: a get is an
    access and would reorder the recency the victims are chosen by)."""
    return sum(1 for _ in t.iter_keys(small_ns()))


def _put(t: SSDTier, n: int, salt: int) -> list[bytes]:
    ns = small_ns()
    c = chain(ns, n, salt=salt)
    r = t.put(ns, c, rows(ns, c))
    assert (r.inserted, r.present, r.dropped) == (n, 0, 0)
    return c


def test_a_put_alone_on_a_full_store_evicts_the_next_puts_room(open_tier) -> None:
    ns = small_ns()
    t = open_tier(capacity_bytes=CAP)
    oldest = _full(t)[0]
    c = _put(t, 4, salt=10)
    # its own 4 and the next put's 4, least recent first (the oldest chain, tail first)
    cnt = t.stats().counters
    assert cnt["evictions"] == cnt["retention_violations_total"] == 8
    assert t.contains(ns, oldest) == 56
    assert _held(t) == SLOTS - 4
    t.check_integrity()  # the 4 free slots are free on disk, not reserved
    d = _put(t, 4, salt=11)  # into that room, making the room for the one after it
    assert t.stats().counters["evictions"] == 12
    assert t.contains(ns, oldest) == 52 and t.contains(ns, c) == 4
    assert _held(t) == SLOTS - 4
    e = _put(t, 8, salt=12)  # 8 is over a 64th of the store: the 4 free, 4 evicted, none ahead
    assert t.stats().counters["evictions"] == 16
    assert t.contains(ns, oldest) == 48
    assert t.contains(ns, d) == 4 and t.contains(ns, e) == 8
    assert verify_all(t, ns) == SLOTS
    t.check_integrity()


@pytest.fixture
def uring_tier(tmp_path: Path) -> Iterator[SSDTier]:
    """On io_uring only: the order of submissions is observed there (``uring._submit``)."""
    skip_without_uring()
    t = SSDTier(make_config(tmp_path / "ssd", io_backend="uring", capacity_bytes=CAP))
    yield t
    t.close()


def test_the_next_puts_first_write_goes_in_before_any_eviction(
    uring_tier: SSDTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = uring_tier
    _full(t)
    log: list[object] = []
    me = threading.current_thread().name
    alloc = t._writer._alloc
    real_evict = alloc._evict

    def evict(block_bytes: int, need: int) -> int:
        freed = real_evict(block_bytes, need)
        log.append(("evict", need, freed))
        return freed

    monkeypatch.setattr(alloc, "_evict", evict)
    log_submissions(monkeypatch, log, lambda name: "submit" if name == me else None)
    _put(t, 4, salt=10)
    # nothing free yet: its own room first, then the next put's while its writes fly
    assert log == [("evict", 4, 4), "submit", ("evict", 4, 4)]
    log.clear()
    _put(t, 4, salt=11)
    assert log == ["submit", ("evict", 4, 4)]
    t.check_integrity()


def test_no_room_is_made_ahead_while_the_store_can_still_grow(open_tier) -> None:
    ns = small_ns()
    t = open_tier(capacity_bytes=CAP)
    t.register(ns)
    first = _put(t, 4, salt=0)
    for salt in range(1, SLOTS // 4 - 1):
        _put(t, 4, salt=salt)
    assert t.stats().counters["evictions"] == 0  # slabs were created as puts needed them
    _put(t, 4, salt=SLOTS // 4)  # fills the last slots: the store is at capacity now
    assert t.stats().counters["evictions"] == 4  # the next put's room: the least recent
    assert t.contains(ns, first) == 0
    assert verify_all(t, ns) == SLOTS - 4
    t.check_integrity()


def test_a_crash_after_the_room_ahead_was_freed_loses_only_the_unpublished_put(
    tmp_path: Path, backend: str
) -> None:
    ns = small_ns()
    d = tmp_path / "ssd"
    hook = CrashOn("after_free", 2)  # the first is the put's own eviction
    t = SSDTier(make_config(d, io_backend=backend, capacity_bytes=CAP, crash_hook=hook))
    oldest = _full(t)[0]
    hook.armed = True
    c = chain(ns, 4, salt=10)
    with pytest.raises(SimulatedCrash):
        t.put(ns, c, rows(ns, c))
    assert hook.seen == 2
    abandon(t)
    t2 = SSDTier(make_config(d, io_backend=backend, capacity_bytes=CAP))
    t2.register(ns)
    t2.check_integrity()
    assert t2.contains(ns, c) == 0  # never published
    assert t2.contains(ns, oldest) == 56  # both evictions had committed
    assert verify_all(t2, ns) == SLOTS - 8
    _put(t2, 4, salt=10)  # the freed slots are reusable
    assert verify_all(t2, ns) == SLOTS - 4
    t2.check_integrity()
    t2.close()


def test_a_put_beside_another_makes_the_room_that_one_then_takes(
    uring_tier: SSDTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other put, held in flight before its reservation, finds its room made by the
    put beside it and reserves without evicting; its own eviction comes after its first
    write, for the put after it."""
    ns = small_ns()
    t = uring_tier
    oldest = _full(t)[0]
    alloc = t._writer._alloc
    real_reserve, real_evict = alloc.reserve, alloc._evict
    held, release = threading.Event(), threading.Event()
    log: list[tuple[str, str]] = []

    def reserve(block_bytes: int, n: int) -> list[tuple[int, int]]:
        if threading.current_thread().name == "other":
            held.set()
            release.wait(10)  # in flight: counted, before its reservation
        return real_reserve(block_bytes, n)

    def evict(block_bytes: int, need: int) -> int:
        log.append((threading.current_thread().name, f"evict {need}"))
        return real_evict(block_bytes, need)

    me = threading.current_thread().name
    monkeypatch.setattr(alloc, "reserve", reserve)
    monkeypatch.setattr(alloc, "_evict", evict)
    log_submissions(  # not the data syncer's
        monkeypatch, log, lambda name: (name, "submit") if name in (me, "other") else None
    )
    c = chain(ns, 4, salt=20)
    th = threading.Thread(target=t.put, args=(ns, c, rows(ns, c)), name="other")
    th.start()
    assert held.wait(10)
    b = _put(t, 4, salt=21)
    assert log == [(me, "evict 4"), (me, "submit"), (me, "evict 4")]
    log.clear()
    release.set()
    th.join(10)
    assert log == [("other", "submit"), ("other", "evict 4")]
    assert t.contains(ns, b) == 4 and t.contains(ns, c) == 4
    assert t.stats().counters["evictions"] == 12 and t.contains(ns, oldest) == 52
    assert _held(t) == SLOTS - 4
    t.check_integrity()
