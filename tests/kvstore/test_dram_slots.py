"""Where DRAM blocks go (kvstore/dram_slots.py), through the DRAM tier: a size class takes
chunks from another whose blocks are older, the accounting stays exact, and a pinned
block's memory is never moved or reused — under pressure, when another class takes
chunks, when its namespace is deleted, or at random."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.block import payload_checksum
from kvstore.dram import DramTier
from kvstore.errors import InvalidArgument
from tests.conftest import payload_for
from tests.kvstore.dram_helpers import BIG, CHUNK, SMALL, chain, make, put, verify


def test_a_class_takes_chunks_from_another_when_its_blocks_are_older() -> None:
    t = make(chunks=4)
    old = chain(SMALL, 4 * CHUNK // SMALL.block_bytes, seed=1)  # fills the whole pool
    put(t, SMALL, old)
    assert t.stats().size_classes[0].used_blocks == len(old)
    new = chain(BIG, 8, seed=2)  # needs two chunks of the big class
    put(t, BIG, new)
    assert verify(t, BIG, new) == 8
    held = t.contains(SMALL, old)
    assert 0 < held < len(old)
    assert verify(t, SMALL, old) == held  # compacted blocks kept their bytes
    assert t.stats().counters["chunk_moves"] == 2  # one per chunk the big class took
    t.check_integrity()


@given(
    st.lists(
        st.tuples(
            st.booleans(), st.integers(0, 15), st.sampled_from(["put", "get", "touch", "del"])
        ),
        max_size=60,
    )
)
def test_random_mixed_classes_keep_accounting_exact(ops) -> None:
    t = make(chunks=3)
    chains = {
        (big, s): chain(BIG if big else SMALL, 1 + s % 7, seed=s)
        for big in (True, False)
        for s in range(16)
    }
    for big, s, op in ops:
        ns = BIG if big else SMALL
        keys = chains[(big, s)]
        if op == "put":
            put(t, ns, keys)
        elif op == "get":
            verify(t, ns, keys)
        elif op == "touch":
            t.touch(ns, keys)
        else:
            t.delete_namespace(ns)
        t.check_integrity()
        used = sum(c.used_blocks * c.block_bytes for c in t.stats().size_classes)
        assert used == t.stats().used_bytes <= t.stats().capacity_bytes


def test_pinned_blocks_survive_pressure_until_released() -> None:
    t = make(chunks=1)
    cap = CHUNK // SMALL.block_bytes
    keys = chain(SMALL, 4, seed=3)
    put(t, SMALL, keys)
    lease = t.pin(SMALL, keys, lease_s=60)
    assert lease.count == 4
    for s in range(10):
        put(t, SMALL, chain(SMALL, cap, seed=100 + s))
        t.check_integrity()
    assert t.contains(SMALL, keys) == 4
    t.unpin(lease)
    put(t, SMALL, chain(SMALL, cap, seed=200))
    assert t.contains(SMALL, keys) == 0
    t.check_integrity()


def test_a_full_pool_of_pins_drops_new_blocks_and_counts_them() -> None:
    t = make(chunks=1)
    cap = CHUNK // SMALL.block_bytes
    keys = chain(SMALL, cap, seed=4)
    put(t, SMALL, keys)
    t.pin(SMALL, keys, lease_s=60)
    res = t.put(SMALL, chain(SMALL, 2, seed=5), bytes(2 * SMALL.block_bytes))
    assert (res.inserted, res.dropped) == (0, 2)
    assert t.stats().counters["put_dropped"] == 2


# -- leases mean what they say (issue 14, item 4) -------------------------------------
def _views_intact(t: DramTier, ns, lease) -> bool:
    views = t.pinned_views(lease)
    return (
        [payload_checksum(v) for v in views]
        == list(lease.checksums)
        == [payload_checksum(payload_for(ns, k)) for k in lease.keys]
    )


def test_pinned_blocks_are_never_moved_when_another_class_takes_chunks() -> None:
    t = make(chunks=4)
    old = chain(SMALL, 4 * CHUNK // SMALL.block_bytes, seed=33)
    put(t, SMALL, old)  # fills the pool
    lease = t.pin(SMALL, old[:20], lease_s=60)  # 20 blocks spread over the first chunk
    before = [v.tobytes() for v in t.pinned_views(lease)]
    addresses = list(lease.slots)
    big = chain(BIG, 12, seed=34)
    put(t, BIG, big)  # wants three chunks; only the two without a pinned block can go
    assert t.stats().counters["chunk_moves"] == 2
    assert t.contains(BIG, big) == 8
    assert [v.tobytes() for v in t.pinned_views(lease)] == before
    assert _views_intact(t, SMALL, lease)
    cs = t._classes[SMALL.block_bytes]
    assert [cs.slot[k] for k in lease.keys] == addresses, "a pinned block moved"
    assert t.contains(SMALL, old[:20]) == 20
    t.check_integrity()


def test_deleting_a_pinned_block_hides_it_but_keeps_its_memory_until_unpin() -> None:
    t = make(chunks=1)
    cap = CHUNK // SMALL.block_bytes
    keys = chain(SMALL, 4, seed=35)
    put(t, SMALL, keys)
    lease = t.pin(SMALL, keys, lease_s=60)
    assert t.delete_namespace(SMALL) == 4
    assert t.contains(SMALL, keys) == 0 and verify(t, SMALL, keys) == 0
    other = chain(SMALL, cap, seed=36)  # wants every slot, gets all but the pinned four
    put(t, SMALL, other)
    assert t.contains(SMALL, other) == cap - 4
    assert _views_intact(t, SMALL, lease), "a retired slot was reused while pinned"
    t.check_integrity()
    t.unpin(lease)
    t.check_integrity()
    assert t.put(SMALL, keys, b"".join(payload_for(SMALL, k) for k in keys)).inserted == 4
    with pytest.raises(InvalidArgument):
        t.pinned_views(lease)


@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.integers(0, 11),
            st.sampled_from(["put", "get", "pin", "unpin", "del", "touch"]),
        ),
        max_size=50,
    )
)
def test_random_ops_never_move_or_reuse_pinned_memory(ops) -> None:
    t = make(chunks=3)
    chains = {
        (big, s): chain(BIG if big else SMALL, 1 + s % 5, seed=40 + s)
        for big in (True, False)
        for s in range(12)
    }
    leases = []
    for big, s, op in ops:
        ns = BIG if big else SMALL
        keys = chains[(big, s)]
        if op == "put":
            put(t, ns, keys)
        elif op == "get":
            verify(t, ns, keys)
        elif op == "pin":
            leases.append((ns, t.pin(ns, keys, lease_s=600)))
        elif op == "unpin" and leases:
            t.unpin(leases.pop(s % len(leases))[1])
        elif op == "del":
            t.delete_namespace(ns)
        else:
            t.touch(ns, keys)
        t.check_integrity()
        for lns, lease in leases:
            assert _views_intact(t, lns, lease)
