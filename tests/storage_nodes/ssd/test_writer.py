"""The group commit (``storage_nodes/ssd/writer.py``): a large put reserves a quarter of
its slots before its first write goes in and the rest while those writes are in flight,
their writes joining the same batch; it stores, evicts and counts exactly what a put that
reserved everything first did."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from storage_nodes.ssd import SSDTier, uring
from storage_nodes.ssd.writer import _first_reserved
from tests.io_backends import backends_here, skip_without_uring
from tests.storage_nodes.ssd.helpers import SLAB, chain, make_config, rows, small_ns, verify_all

CAP = 2 * SLAB  # 128 slots of 4 KiB: the small namespace's blocks


def _full_tier(d: Path, backend: str) -> tuple[SSDTier, list[bytes]]:
    ns = small_ns()
    t = SSDTier(make_config(d, io_backend=backend, capacity_bytes=CAP, queue_depth=64))
    t.register(ns)
    a = chain(ns, 128, salt=1)
    assert t.put(ns, a, rows(ns, a)).inserted == 128
    return t, a


def test_a_large_put_reserves_most_of_its_slots_while_its_first_writes_are_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_without_uring()
    t, a = _full_tier(tmp_path / "ssd", "uring")
    ns = small_ns()
    log: list[object] = []
    me = threading.get_ident()
    alloc = t._writer._alloc
    real_reserve, real_submit = alloc.reserve, uring._submit

    def reserve(block_bytes: int, n: int) -> list[tuple[int, int]]:
        got = real_reserve(block_bytes, n)
        log.append(("reserve", n, len(got)))
        return got

    def submit(ring: object) -> None:
        if threading.get_ident() == me:
            log.append("submit")
        real_submit(ring)  # type: ignore[arg-type]

    monkeypatch.setattr(alloc, "reserve", reserve)
    monkeypatch.setattr(uring, "_submit", submit)
    b = chain(ns, 40, salt=2)
    r = t.put(ns, b, rows(ns, b))
    assert (r.inserted, r.present, r.dropped) == (40, 0, 0)
    first = _first_reserved(40)
    assert first == 10
    assert log[0] == ("reserve", first, first)  # a quarter, evicted for, before any write
    assert log[1] == "submit"  # its writes went in ...
    second = log.index(("reserve", 40 - first, 40 - first))  # ... before the rest was
    assert "submit" in log[second + 1 :]  # whose writes joined the batch after it
    assert t.contains(ns, b) == 40 and t.contains(ns, a) == 88
    cnt = t.stats().counters
    assert cnt["evictions"] == cnt["retention_violations_total"] == 40  # one per block
    assert verify_all(t, ns) == 128
    t.check_integrity()
    t.close()


@pytest.mark.parametrize("room", [0, 7])
def test_a_put_whose_later_slots_find_no_room_stores_the_head_of_its_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, room: int
) -> None:
    """The second reservation may give fewer slots than asked (capacity held by other
    writers): the keys after them are dropped, nothing is named that was not written,
    and no reservation is left behind."""
    t, _ = _full_tier(tmp_path / "ssd", backends_here()[0])
    ns = small_ns()
    alloc = t._writer._alloc
    real_reserve = alloc.reserve
    calls: list[int] = []

    def reserve(block_bytes: int, n: int) -> list[tuple[int, int]]:
        got = real_reserve(block_bytes, n)
        calls.append(n)
        if len(calls) == 2:  # the later slots: only ``room`` of them
            alloc.release(got[room:], still_free=True)
            got = got[:room]
        return got

    monkeypatch.setattr(alloc, "reserve", reserve)
    b = chain(ns, 32, salt=3)
    r = t.put(ns, b, rows(ns, b))
    assert calls == [8, 24]
    assert (r.inserted, r.present, r.dropped) == (8 + room, 0, 24 - room)
    assert t.contains(ns, b) == 8 + room
    assert verify_all(t, ns) == 128 - 24 + room  # the freed slots nobody took stay free
    t.check_integrity()  # no slot left reserved, none named without its write
    t.close()


def test_a_put_that_syncs_its_data_reserves_everything_first(tmp_path: Path) -> None:
    """With ``data_sync="per_put"`` the files to sync must be known before the writes go
    in, so no slot is reserved later."""
    ns = small_ns()
    t = SSDTier(make_config(tmp_path / "ssd", capacity_bytes=CAP, data_sync="per_put"))
    t.register(ns)
    a = chain(ns, 128, salt=1)
    t.put(ns, a, rows(ns, a))
    seen: list[int] = []
    alloc = t._writer._alloc
    real_reserve = alloc.reserve
    alloc.reserve = lambda bb, n: (seen.append(n), real_reserve(bb, n))[1]  # type: ignore[method-assign]
    b = chain(ns, 40, salt=2)
    assert t.put(ns, b, rows(ns, b)).inserted == 40
    assert seen == [40]
    t.check_integrity()
    t.close()
