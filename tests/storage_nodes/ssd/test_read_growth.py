"""A get's read batch grows while it runs: the reads of its first keys go in before the
rest of its keys are looked up, and the reads of the rest join the same batch
(``IOBackend.read_batch``'s ``between``, ``BlockIO.read_prefix``'s ``more``,
``lookup.PrefixLookup``). Whatever the growth meets — a missing key, a slab file that
cannot be opened, a staging buffer smaller than the get — a get still returns exactly the
present prefix, byte for byte."""

from __future__ import annotations

import errno
import mmap
import os
import random
from pathlib import Path

import pytest

from storage_nodes.ssd import tier as tier_module
from storage_nodes.ssd.backends import make_backend
from storage_nodes.ssd.io_backend import IORequest
from tests.storage_nodes.ssd.helpers import LazyBatch, chain, direct_fd, rows, small_ns

FIRST = tier_module._FIRST_LOOKUPS


def test_reads_added_by_between_join_the_batch(tmp_path: Path, any_backend) -> None:
    """Every backend runs ``between`` after taking the batch's own reads, performs the
    reads it returns as requests ``len(reqs)``, ... (deeper than the queue here), reports
    them, to ``on_done`` and in the results, at those indexes, and runs ``between`` again
    once they are taken, until it adds nothing; a failed added read is a negative errno
    at its own index."""
    first, more, sz = 3, 13, 8192
    n = first + more
    fd = direct_fd(tmp_path / "f", n * sz)
    try:
        wbuf, rbuf = mmap.mmap(-1, n * sz), mmap.mmap(-1, n * sz)
        wbuf[:] = random.Random(5).randbytes(n * sz)
        w, r = memoryview(wbuf), memoryview(rbuf)
        assert any_backend.write_batch(
            [IORequest(fd, i * sz, w[i * sz : (i + 1) * sz]) for i in range(n)]
        ) == [sz] * n
        bad = first + 4  # an added read on a descriptor that is not open
        own = LazyBatch([IORequest(fd, i * sz, r[i * sz : (i + 1) * sz]) for i in range(first)])
        calls: list[bool] = []
        added: list[LazyBatch] = []

        def between() -> LazyBatch | None:
            calls.append(min(own.asked + (added[0].asked if added else [])) >= 1)
            if len(calls) > 1:
                return None
            added.append(LazyBatch(
                [
                    IORequest(987654 if i == bad else fd, i * sz, r[i * sz : (i + 1) * sz])
                    for i in range(first, n)
                ]
            ))
            return added[0]

        seen: list[tuple[int, int]] = []
        res = any_backend.read_batch(own, lambda i, x: seen.append((i, x)), between=between)
        want = [-errno.EBADF if i == bad else sz for i in range(n)]
        assert res == want
        assert sorted(seen) == list(enumerate(want))
        assert calls == [True, True]
        good = [i for i in range(n) if i != bad]
        assert all(rbuf[i * sz : (i + 1) * sz] == wbuf[i * sz : (i + 1) * sz] for i in good)
    finally:
        os.close(fd)


@pytest.mark.parametrize("added", [None, []])
def test_a_between_that_adds_nothing(tmp_path: Path, any_backend, added) -> None:
    sz = 4096
    fd = direct_fd(tmp_path / "f", 2 * sz)
    try:
        buf = memoryview(mmap.mmap(-1, 2 * sz))
        reqs = [IORequest(fd, i * sz, buf[i * sz : (i + 1) * sz]) for i in range(2)]
        calls: list[int] = []
        res = any_backend.read_batch(reqs, between=lambda: calls.append(1) or added)
        assert res == [sz, sz] and calls == [1]
    finally:
        os.close(fd)


def test_a_failing_device_fails_the_added_reads_too(tmp_path: Path) -> None:
    b = make_backend("faulty", 4)
    try:
        b.read_errno = errno.EIO
        fd = direct_fd(tmp_path / "f", 8192)
        buf = memoryview(mmap.mmap(-1, 8192))
        seen: list[tuple[int, int]] = []
        res = b.read_batch(
            [IORequest(fd, 0, buf[:4096])],
            lambda i, x: seen.append((i, x)),
            between=lambda: [IORequest(fd, 4096, buf[4096:])] if len(seen) == 1 else None,
        )
        assert res == [-errno.EIO] * 2 and seen == [(0, -errno.EIO), (1, -errno.EIO)]
        os.close(fd)
    finally:
        b.close()


@pytest.mark.parametrize("missing", [None, 1, FIRST - 1, FIRST, FIRST + 3, 11])
def test_a_get_returns_the_present_prefix_wherever_it_ends(open_tier, missing) -> None:
    """Missing keys before, at and after the first look-ups: the hits are the prefix
    before the first missing key, its rows exact, the rows after it untouched."""
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 12)
    present = [k for i, k in enumerate(keys) if i != missing]
    t.put(ns, present, rows(ns, present))
    want = 12 if missing is None else missing
    dst = bytearray(b"\xee" * (12 * ns.block_bytes))
    assert t.get_into(ns, keys, dst) == want
    cut = want * ns.block_bytes
    assert bytes(dst[:cut]) == rows(ns, keys[:want])
    assert dst[cut:] == b"\xee" * (len(dst) - cut)
    c = t.stats().counters
    assert (c["hits"], c["misses"]) == (want, 12 - want)
    t.check_integrity()


@pytest.mark.parametrize("staged_slots", [2, FIRST, FIRST + 2, 64])
@pytest.mark.parametrize("direct", [True, False])
def test_a_get_larger_than_its_staging(open_tier, staged_slots: int, direct: bool) -> None:
    """Staging for fewer slots than the get holds (and, ``direct``, for their header
    pages only): a batch with no room to grow looks the rest up at once, one with some
    room takes what fits and leaves the rest to the next batches."""
    ns = small_ns(model_id="paged", head_dim=32) if direct else small_ns()
    slot = 4096 + ns.block_bytes if direct else 4096
    staging = staged_slots * slot  # a slab's worth at least (the config's floor)
    t = open_tier(staging_max_bytes=staging, slab_bytes=staging, capacity_bytes=32 << 20)
    t.register(ns)
    n = 23
    keys = chain(ns, n)
    t.put(ns, keys, rows(ns, keys))
    dst = memoryview(mmap.mmap(-1, n * ns.block_bytes + 4096))
    dst = dst if direct else dst[1:]  # unaligned rows: the whole slot is staged
    assert t.get_into(ns, keys, dst[: n * ns.block_bytes]) == n
    assert bytes(dst[: n * ns.block_bytes]) == rows(ns, keys)


def test_an_added_block_in_a_slab_that_cannot_be_opened(open_tier) -> None:
    """The first block whose slab file cannot be opened ends the get there (an I/O miss),
    whether it is among the first look-ups' reads or among those added to the batch."""
    ns = small_ns()
    t = open_tier(slab_bytes=8192)  # two slots a slab: blocks spread over many files
    t.register(ns)
    keys = chain(ns, 12)
    t.put(ns, keys, rows(ns, keys))
    fkeys = [ns.fingerprint + k for k in keys]
    with t._index.begin() as txn:
        slabs = [t._index.get(txn, fk).slab for fk in fkeys]
    # the first block past the first look-ups whose slab no earlier block shares
    lost = next(i for i in range(FIRST, 12) if slabs[i] not in slabs[:i])
    t.close()
    t = open_tier(slab_bytes=8192)  # no slab file open yet
    t.register(ns)
    slab_path = t._files.path(slabs[lost])
    slab_path.unlink()
    slab_path.mkdir()  # opening it for I/O now fails (EISDIR)
    dst = bytearray(12 * ns.block_bytes)
    assert t.get_into(ns, keys, dst) == lost
    assert bytes(dst[: lost * ns.block_bytes]) == rows(ns, keys[:lost])
    assert t.stats().counters["io_errors_total"] >= 1


def test_a_grown_get_notes_every_located_key_newest_first(open_tier) -> None:
    """The recency of a grown get is noted while its reads are in flight, for every key
    located, key 0 newest (as a get that did not grow notes its hits)."""
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 10)
    t.put(ns, keys[:8], rows(ns, keys[:8]))
    t.flush_touches()
    fkeys = [ns.fingerprint + k for k in keys]
    assert t.get_into(ns, keys, bytearray(10 * ns.block_bytes)) == 8
    stamps = [t._recency.pending_stamp(fk) for fk in fkeys]
    assert None not in stamps[:8] and stamps[8:] == [None, None]
    seqs = [s[1] for s in stamps[:8]]  # type: ignore[index]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == 8

