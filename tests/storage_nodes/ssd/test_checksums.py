"""End-to-end checksums in the SSD engine (issue 14, item 3): a block keeps the checksum
made at its commit, reads hand it on, and the check covers the copy in the caller's
buffer."""

from __future__ import annotations

import pytest

from kvstore.block import payload_checksum
from kvstore.errors import InvalidArgument
from tests.storage_nodes.ssd.helpers import chain, payload_for, rows, small_ns


def test_reads_hand_on_the_checksums_stored_at_commit(open_tier) -> None:
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 5)
    t.put(ns, keys, rows(ns, keys))
    sums: list[int] = []
    assert t.get_into(ns, keys, bytearray(5 * ns.block_bytes), checksums=sums) == 5
    assert sums == [payload_checksum(payload_for(ns, k)) for k in keys]


def test_a_source_damaged_after_its_commit_is_stored_as_corrupt(open_tier) -> None:
    # The write-back copy of block 2 changed after the commit made its checksum: the SSD
    # stores the commit's checksum, so the damage is a counted miss, never data.
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 4, salt=1)
    sums = [payload_checksum(payload_for(ns, k)) for k in keys]
    src = bytearray(rows(ns, keys))
    src[2 * ns.block_bytes + 9] ^= 0x02
    assert t.put(ns, keys, src, checksums=sums).inserted == 4
    got: list[int] = []
    dst = bytearray(4 * ns.block_bytes)
    assert t.get_into(ns, keys, dst, checksums=got) == 2
    assert got == sums[:2] and bytes(dst[: 2 * ns.block_bytes]) == rows(ns, keys[:2])
    assert t.stats().counters["corrupt_blocks_total"] == 1
    assert t.contains(ns, keys) == 2, "the corrupt slot is quarantined"


def test_checksums_must_match_the_keys(open_tier) -> None:
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 2, salt=2)
    with pytest.raises(InvalidArgument):
        t.put(ns, keys, rows(ns, keys), checksums=[0])
    assert t.contains(ns, keys) == 0
