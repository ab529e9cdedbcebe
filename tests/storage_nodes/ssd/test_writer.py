"""The group commit (``storage_nodes/ssd/writer.py``): a large put reserves a quarter of
its slots before its first write goes in and the rest while those writes are in flight,
their writes joining the same batch; it stores, evicts and counts exactly what a put that
reserved everything first did. A put alone in flight fills its publishing transaction
while its writes are in flight; beside another put, after them."""

from __future__ import annotations

import errno
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import xxhash

from kvstore.keys import Key
from kvstore.tier import PutResult
from storage_nodes.ssd import SSDTier, uring
from storage_nodes.ssd.errors import SSDIOError
from storage_nodes.ssd.writer import _first_reserved
from tests.io_backends import backends_here, skip_without_uring
from tests.storage_nodes.ssd.helpers import (
    SLAB,
    aligned,
    chain,
    log_submissions,
    make_config,
    paged_ns,
    payload_for,
    rows,
    small_ns,
    verify_all,
)

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
    me = threading.current_thread().name
    alloc = t._writer._alloc
    real_reserve = alloc.reserve

    def reserve(block_bytes: int, n: int) -> list[tuple[int, int]]:
        got = real_reserve(block_bytes, n)
        log.append(("reserve", n, len(got)))
        return got

    monkeypatch.setattr(alloc, "reserve", reserve)
    log_submissions(monkeypatch, log, lambda name: "submit" if name == me else None)
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
            alloc.release(got[room:])
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


def _publish_log(t: SSDTier, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The order, on this thread, of submissions, waits for completions, the filling of
    the publishing transaction and its commit."""
    log: list[str] = []
    me = threading.get_ident()

    def logged(event: str, real):  # type: ignore[no-untyped-def]
        def call(*a: object, **k: object) -> object:
            out = real(*a, **k)
            if threading.get_ident() == me:
                log.append(event)
            return out

        return call

    monkeypatch.setattr(uring, "_submit", logged("submit", uring._submit))
    monkeypatch.setattr(uring, "_wait_cqes", logged("wait", uring._wait_cqes))
    monkeypatch.setattr(t._writer, "_publish", logged("publish", t._writer._publish))
    monkeypatch.setattr(t._index, "commit", logged("commit", t._index.commit))
    return log


def test_a_put_alone_fills_its_publish_while_its_writes_are_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its records are written once every write is submitted, before the wait for them,
    and committed after the last write completed."""
    skip_without_uring()
    t, _ = _full_tier(tmp_path / "ssd", "uring")
    ns = small_ns()
    log = _publish_log(t, monkeypatch)
    b = chain(ns, 32, salt=2)
    assert t.put(ns, b, rows(ns, b)).inserted == 32
    pub = log.index("publish")
    assert "submit" not in log[pub:]  # every write was in before the records
    assert "wait" in log[pub:]  # ... which were written before the writes completed
    assert log[-1] == "commit" and log.count("publish") == 1
    assert t.contains(ns, b) == 32 and verify_all(t, ns) == 128
    t.check_integrity()
    t.close()


def test_a_put_beside_another_publishes_after_its_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With another put in flight, holding the writer lock across the I/O would stall
    that put's reservation: the records are written after the last write completed. Its
    slots are reserved in one transaction: the other put's writes keep the device busy,
    so a second reservation during the writes would only cost CPU."""
    skip_without_uring()
    t, _ = _full_tier(tmp_path / "ssd", "uring")
    ns = small_ns()
    other = threading.Event()
    release = threading.Event()
    real_reserve = t._writer._alloc.reserve

    asked: list[int] = []

    def held(block_bytes: int, n: int) -> list[tuple[int, int]]:
        if threading.current_thread().name == "other":
            other.set()
            release.wait(10)  # stays in flight, between its reservation and its writes
        else:
            asked.append(n)
        return real_reserve(block_bytes, n)

    monkeypatch.setattr(t._writer._alloc, "reserve", held)
    c = chain(ns, 4, salt=9)
    th = threading.Thread(target=t.put, args=(ns, c, rows(ns, c)), name="other")
    th.start()
    assert other.wait(10)
    log = _publish_log(t, monkeypatch)
    b = chain(ns, 32, salt=2)
    assert t.put(ns, b, rows(ns, b)).inserted == 32
    release.set()
    th.join(10)
    pub = log.index("publish")
    assert "wait" not in log[pub:] and log[pub + 1] == "commit"
    assert asked == [32]
    assert t.contains(ns, b) == 32 and t.contains(ns, c) == 4
    t.check_integrity()
    t.close()


def test_a_failed_group_aborts_the_publish_it_filled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group that fails after its records were written names none of its blocks and
    leaves the writer lock and its slots free: the next put stores everything."""
    t, _ = _full_tier(tmp_path / "ssd", backends_here()[0])
    ns = small_ns()
    blocks = t._writer._blocks
    real = blocks.write_slots
    filled: list[int] = []

    def failing(*args: object, **kw: object) -> object:
        in_flight = kw["in_flight"]

        def spy(slots):  # type: ignore[no-untyped-def]
            in_flight(slots)  # type: ignore[operator]
            filled.append(len(slots))

        real(*args, **{**kw, "in_flight": spy})
        raise SSDIOError("a write failed", errno.EIO)

    monkeypatch.setattr(blocks, "write_slots", failing)
    b = chain(ns, 32, salt=2)
    r = t.put(ns, b, rows(ns, b))
    assert filled == [32] and r.inserted == 0 and t.contains(ns, b) == 0
    monkeypatch.setattr(blocks, "write_slots", real)
    assert t.probe() == "ok"  # degraded by the failure; its probe writes the index too
    assert t.put(ns, b, rows(ns, b)).inserted == 32
    assert verify_all(t, ns) == 128
    t.check_integrity()
    t.close()


def _paged_put(t: SSDTier, keys: list[Key]) -> PutResult:
    """``keys`` put from page-aligned rows with their commit checksums (the write-back's
    shape: rows moved direct, checksums given)."""
    ns = paged_ns()
    sums = [xxhash.xxh3_64_intdigest(payload_for(ns, k)) for k in keys]
    return t.put(ns, keys, aligned(rows(ns, keys)), checksums=sums)


def test_a_large_put_looks_up_most_of_its_keys_while_its_first_writes_are_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the keys of a put's first writes are looked up before those go in; the rest
    (here three already stored, one of them among the first) while they are in flight.
    Present keys are counted present and noted as used, absent ones stored whole."""
    skip_without_uring()
    ns = paged_ns()
    t = SSDTier(make_config(tmp_path / "ssd", io_backend="uring", capacity_bytes=CAP))
    t.register(ns)
    b = chain(ns, 40, salt=2)
    old = [b[3], b[17], b[33]]
    assert _paged_put(t, old).inserted == 3
    log: list[object] = []
    me = threading.current_thread().name
    view = t._view
    real_present = view.present_set

    def present_set(fkeys: Sequence[bytes]) -> set[int]:
        log.append(("look-up", len(fkeys)))
        return real_present(fkeys)

    monkeypatch.setattr(view, "present_set", present_set)
    log_submissions(monkeypatch, log, lambda name: "submit" if name == me else None)
    r = _paged_put(t, b)
    assert (r.inserted, r.present, r.dropped) == (37, 3, 0)
    ahead = _first_reserved(40)
    assert log[:2] == [("look-up", ahead), "submit"]  # the first writes' keys, then in
    assert ("look-up", 40 - ahead) in log[2:]  # the rest, looked up after
    assert "submit" in log[log.index(("look-up", 40 - ahead)) + 1 :]  # their writes join
    assert t.contains(ns, b) == 40
    assert verify_all(t, ns) == 40
    t.check_integrity()
    t.close()


def test_a_put_whose_first_writes_find_no_room_still_counts_its_later_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No slot for even the first writes: the keys never looked up are looked up all the
    same, so the result counts the stored ones present and the rest dropped."""
    ns = paged_ns()
    t = SSDTier(make_config(tmp_path / "ssd", io_backend=backends_here()[0], capacity_bytes=CAP))
    t.register(ns)
    b = chain(ns, 32, salt=4)
    assert _paged_put(t, [b[20], b[30]]).inserted == 2
    monkeypatch.setattr(t._writer._alloc, "reserve", lambda bb, n: [])
    r = _paged_put(t, b)
    assert (r.inserted, r.present, r.dropped) == (0, 2, 30)
    assert t.contains(ns, [b[20]]) == 1 and t.contains(ns, b[:20]) == 0
    t.check_integrity()
    t.close()
