"""Forgetting an own block on the data path (``ops.py``): a copy that failed its read
check, or whose segment sync failed after its frame was published, is forgotten (own
space, free list, catalog, a DROP in the manifest) only while it is still the copy this
daemon holds. Here the key is swept and put again before that happens, into the very
slot or (another key taking the slot) elsewhere: the newer copy stays readable for the
owner, a peer and after a restart, the old one is gone, the counters are exact."""

from __future__ import annotations

import errno
import threading
from typing import Any

import pytest

from kvstore.tier import PutResult
from storage_nodes.sharedfs import SharedFSTier, ops
from storage_nodes.sharedfs.catalog import Loc
from storage_nodes.sharedfs.segments import slot_offset
from tests.storage_nodes.sharedfs.conftest import NS, FakeClock, chain, read, rows

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
