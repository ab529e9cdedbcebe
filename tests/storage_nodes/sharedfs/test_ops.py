"""Forgetting an own block on the data path (``ops.py``): a copy that failed its read
check, or whose segment sync failed after its frame was published, is forgotten (own
space, free list, catalog, a DROP in the manifest) only while it is still the copy this
daemon holds. Here the key is swept and put again before that happens, into the very
slot or (another key taking the slot) elsewhere: the newer copy stays readable for the
owner, a peer and after a restart, the old one is gone, the counters are exact.

A key put again after it expired but before the sweep came replaces its expired copy as
the sweep would have: the slot freed, the location gone, a DROP recorded. When a peer
holds the expired copy, the putter frees nothing of the peer's (multi-host rules 1 and
6): it stores its own copy and forgets the peer's location; the peer, reading that PUT,
expires its copy itself."""

from __future__ import annotations

import errno
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as hs

from kvstore.tier import PutResult
from storage_nodes.sharedfs import SharedFSTier, ops
from storage_nodes.sharedfs.catalog import Loc
from storage_nodes.sharedfs.segments import slot_offset
from tests.storage_nodes.sharedfs.conftest import NS, FakeClock, chain, config, read, rows

RETENTION_S = 600.0
WHERE = pytest.mark.parametrize("where", ["same-slot", "elsewhere"])
QUIET = ("corrupt_blocks_total", "stale_slots_total", "read_races", "io_errors_total",
         "evictions", "dropped")


def _open(daemons: Any, name: str, clock: FakeClock) -> SharedFSTier:
    t: SharedFSTier = daemons(name, clock=clock, retention_s=RETENTION_S, bucket_s=1.0)
    return t


def _locations(t: SharedFSTier, key: bytes) -> list[Loc]:
    return t._ctx.spaces[NS.fingerprint].catalog.locations(key)


def _reput(a: SharedFSTier, clock: FakeClock, x: list[bytes], where: str) -> list[bytes]:
    """Every block expires and is swept (the old copy of ``x`` last, so its slot is the
    next one taken), then ``x`` is put again: into that slot, or elsewhere after another
    key took it. Returns the keys put."""
    clock.advance(RETENTION_S + 60)
    assert a.sweep() == 2
    z = chain(1, seed=43) if where == "elsewhere" else []
    for keys in (z, x):
        if keys:
            assert a.put(NS, keys, rows(keys)).inserted == 1
    return z + x


def _only_the_newer_copy(daemons: Any, a: SharedFSTier, b: SharedFSTier, clock: FakeClock,
                         x: list[bytes], old: Loc, where: str, counts: dict[str, int]
                         ) -> None:
    c = a.stats().counters
    assert {k: c[k] for k in counts} == counts
    [new] = _locations(a, x[0])  # the newer copy alone: the old one is gone
    assert new.owner == "a" and new.born_s > old.born_s
    assert ((new.seg, new.slot) == (old.seg, old.slot)) == (where == "same-slot")
    if where == "elsewhere":
        z = chain(1, seed=43)
        assert _locations(a, z[0]) == [Loc("a", old.seg, old.slot, new.born_s)]
    a.check_integrity()
    b.poll()
    for t in (a, b):
        assert read(t, x) == (1, rows(x)) and _locations(t, x[0]) == [new]
    b.check_integrity()
    a.close()
    a2 = _open(daemons, "a", clock)  # nor did the manifest DROP the newer copy
    assert read(a2, x) == (1, rows(x)) and _locations(a2, x[0]) == [new]
    a2.check_integrity()


@WHERE
def test_a_failed_slot_sync_spares_the_copy_put_again_meanwhile(daemons, where) -> None:
    clock = FakeClock()
    a, b = _open(daemons, "a", clock), _open(daemons, "b", clock)
    w, x = chain(1, seed=41), chain(1, seed=42)
    a.put(NS, w, rows(w))  # its segment made (and recorded) before the watch
    st = a._ctx.spaces[NS.fingerprint]
    data_sync, frame_sync = a._ctx.io.sync, st.log.sync
    published, release = threading.Event(), threading.Event()
    first = [True]

    def sync_failing_once(fds):  # type: ignore[no-untyped-def]
        if not first:
            return data_sync(fds)
        first.clear()
        assert release.wait(timeout=30.0)
        return [-errno.EIO] * len(fds)

    def noting_frame_sync(ticket):  # type: ignore[no-untyped-def]
        ok = frame_sync(ticket)
        published.set()
        return ok

    a._ctx.io.sync = sync_failing_once  # type: ignore[method-assign]
    st.log.sync = noting_frame_sync  # type: ignore[method-assign]
    got: list[PutResult] = []
    putter = threading.Thread(target=lambda: got.append(a.put(NS, x, rows(x))))
    putter.start()
    try:
        assert published.wait(timeout=30.0)  # x's frame is durable, its slot's sync waits
        [old] = _locations(a, x[0])
        put_again = _reput(a, clock, x, where)
    finally:
        release.set()
        putter.join(timeout=30.0)
    assert got == [PutResult(inserted=0, present=0, dropped=1)]
    counts = dict.fromkeys(QUIET, 0) | {"io_errors_total": 1, "dropped": 1,
                                        "expired_total": 2, "inserted": 1 + len(put_again)}
    _only_the_newer_copy(daemons, a, b, clock, x, old, where, counts)


@WHERE
def test_a_failed_read_spares_the_copy_put_again_meanwhile(daemons, monkeypatch,
                                                           where) -> None:
    clock = FakeClock()
    a, b = _open(daemons, "a", clock), _open(daemons, "b", clock)
    w, x = chain(1, seed=41), chain(1, seed=42)
    a.put(NS, w, rows(w))
    a.put(NS, x, rows(x))
    [old] = _locations(a, x[0])
    st = a._ctx.spaces[NS.fingerprint]
    with open(a._ctx.segment_path(st, "a", old.seg), "r+b") as f:  # x's payload goes bad
        f.seek(slot_offset(old.slot, st.slot_bytes) + 64 + 100)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    real = ops.read_prefix
    put_again: list[bytes] = []

    def read_then_put_again(*args):  # type: ignore[no-untyped-def]
        res = real(*args)
        assert res.failure is not None and res.failure.error is not None
        monkeypatch.setattr(ops, "read_prefix", real)
        put_again.extend(_reput(a, clock, x, where))  # before the failure is handled
        return res

    monkeypatch.setattr(ops, "read_prefix", read_then_put_again)
    assert read(a, x) == (0, b"")
    counts = dict.fromkeys(QUIET, 0) | {"read_races": 1, "expired_total": 2, "misses": 1,
                                        "hits": 0, "inserted": 2 + len(put_again)}
    _only_the_newer_copy(daemons, a, b, clock, x, old, where, counts)


def _other_bytes(keys: list[bytes]) -> bytes:
    """Not what was put first under ``keys``: a read of the old copy would show."""
    return bytes(v ^ 0x5A for v in rows(keys))


def _slots_used(t: SharedFSTier) -> tuple[int, int]:
    """(slots counted as used, slots free) over the daemon's own segments."""
    own = t._ctx.spaces[NS.fingerprint].own
    return sum(s.used for s in own.segments.values()), len(own.free)


def _slot_taken_next(t: SharedFSTier, clock: FakeClock) -> Loc:
    """Where the next put of a new key lands (the slot last freed)."""
    z = chain(1, seed=59)
    assert t.put(NS, z, rows(z)).inserted == 1
    [loc] = _locations(t, z[0])
    assert read(t, z) == (1, rows(z))
    return loc


def test_a_key_put_again_after_it_expired_unswept_replaces_its_old_copy(daemons) -> None:
    clock = FakeClock()
    a, b = _open(daemons, "a", clock), _open(daemons, "b", clock)
    x = chain(1, seed=51)
    assert a.put(NS, x, rows(x)).inserted == 1
    [old] = _locations(a, x[0])
    used, free = _slots_used(a)
    b.poll()
    clock.advance(RETENTION_S + 100)
    assert a.contains(NS, x) == 0 and b.contains(NS, x) == 0  # expired, not swept
    new_rows = _other_bytes(x)
    assert a.put(NS, x, new_rows) == PutResult(inserted=1, present=0, dropped=0)
    [new] = _locations(a, x[0])  # the new copy alone
    assert new.owner == "a" and (new.seg, new.slot) != (old.seg, old.slot)
    assert new.born_s == old.born_s + RETENTION_S + 100
    assert _slots_used(a) == (used, free)  # one slot taken, the old one freed
    c = a.stats().counters
    assert (c["blocks"], c["expired_total"], c["evictions"]) == (1, 1, 0)
    a.check_integrity()
    assert a.sweep() == 0  # nothing expired is left behind
    assert read(a, x) == (1, new_rows)
    b.poll()
    assert read(b, x) == (1, new_rows) and _locations(b, x[0]) == [new]
    b.check_integrity()
    assert _slot_taken_next(a, clock)[1:3] == (old.seg, old.slot)  # the old slot reusable
    assert _slots_used(a) == (used + 1, free - 1)
    a.check_integrity()
    a.close()
    a2 = _open(daemons, "a", clock)
    assert read(a2, x) == (1, new_rows) and _locations(a2, x[0]) == [new]
    assert _slots_used(a2) == (used + 1, free - 1)
    a2.check_integrity()


def test_a_peers_expired_copy_is_left_to_its_owner_when_the_key_is_put_again(
        daemons) -> None:
    clock = FakeClock()
    a, b = _open(daemons, "a", clock), _open(daemons, "b", clock)
    x = chain(1, seed=52)
    assert a.put(NS, x, rows(x)).inserted == 1
    [old] = _locations(a, x[0])
    a_used = _slots_used(a)
    b.poll()
    clock.advance(RETENTION_S + 100)
    new_rows = _other_bytes(x)
    assert b.put(NS, x, new_rows) == PutResult(inserted=1, present=0, dropped=0)
    [new] = _locations(b, x[0])  # b serves its own copy, not a's expired one
    assert new.owner == "b"
    assert read(b, x) == (1, new_rows)
    assert b.stats().counters["expired_total"] == 0 and _slots_used(b)[0] == 1
    b.check_integrity()
    assert _locations(a, x[0]) == [old] and _slots_used(a) == a_used  # a's slot untouched
    a.poll()  # a reads b's PUT: its own copy had expired, so a expires it
    assert _locations(a, x[0]) == [new] and read(a, x) == (1, new_rows)
    assert a.stats().counters["expired_total"] == 1 and a.sweep() == 0
    assert _slots_used(a) == (a_used[0] - 1, a_used[1] + 1)
    a.check_integrity()
    b.poll()  # a's DROP of its own copy changes nothing at b
    assert _locations(b, x[0]) == [new]
    b.check_integrity()
    assert _slot_taken_next(a, clock)[1:3] == (old.seg, old.slot)  # a's old slot reusable
    a.check_integrity()
    for name, t in (("a", a), ("b", b)):
        t.close()
        t2 = _open(daemons, name, clock)
        assert read(t2, x) == (1, new_rows) and _locations(t2, x[0]) == [new]
        t2.check_integrity()


KEYS = chain(3, seed=53)
steps = hs.lists(hs.one_of(
    hs.tuples(hs.just("put"), hs.integers(0, 1), hs.integers(0, 2), hs.integers(0, 255)),
    hs.tuples(hs.just("advance"), hs.sampled_from([0, 300, 700])),
    hs.tuples(hs.sampled_from(["sweep", "poll"]), hs.integers(0, 1)),
), max_size=14)


@settings(deadline=None)
@given(steps)
@example([("put", 0, 0, 1), ("advance", 700), ("put", 0, 0, 2)])  # own expired copy
@example([("put", 0, 0, 1), ("poll", 1), ("advance", 700), ("put", 1, 0, 2), ("poll", 0)])
def test_puts_expiries_and_sweeps_leak_no_slot(plan: list[tuple[Any, ...]]) -> None:
    """Two daemons put, expire, sweep and tail in any order: every inserted copy is
    what its putter reads back, the books balance after every step, and once all is
    expired and swept no slot stays used and no catalog names anything."""
    clock = FakeClock()
    with tempfile.TemporaryDirectory() as root:
        tiers = [SharedFSTier(config(Path(root), n, clock=clock, retention_s=RETENTION_S,
                                     bucket_s=1.0)) for n in "ab"]
        try:
            for t in tiers:
                t.register(NS)
            for step in plan:
                if step[0] == "put":
                    t, k = tiers[step[1]], KEYS[step[2] : step[2] + 1]
                    data = bytes(v ^ step[3] for v in rows(k))
                    if t.put(NS, k, data).inserted:
                        assert read(t, k) == (1, data)
                elif step[0] == "advance":
                    clock.advance(step[1])
                elif step[0] == "sweep":
                    tiers[step[1]].sweep()
                else:
                    tiers[step[1]].poll()
                for t in tiers:
                    t.check_integrity()
            clock.advance(RETENTION_S + 120)
            for t in tiers + tiers:  # each sweeps, then reads the other's DROPs
                t.poll()
                t.sweep()
            for t in tiers:
                t.poll()
                t.check_integrity()
                used, free = _slots_used(t)
                own = t._ctx.spaces[NS.fingerprint].own
                assert used == 0 and free == sum(s.slots for s in own.segments.values())
                assert all(_locations(t, k) == [] for k in KEYS)
        finally:
            for t in tiers:
                t.close()
