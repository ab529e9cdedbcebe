"""Bit flips in slab files: the affected blocks become misses, counted and quarantined,
never wrong data; every other block still reads back exactly."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.storage_nodes.ssd.helpers import chain, payload_for, rows, small_ns, verify_all

SLOT = 4096  # small_ns: 64 + 2048 bytes rounded up


def _locate(d: Path, keys: list[bytes]) -> dict[bytes, tuple[Path, int]]:
    """Find each key's slot by reading slab headers (no peeking into the index)."""
    want = set(keys)
    out = {}
    for p in sorted((d / "slabs").glob("slab-*")):
        data = p.read_bytes()
        for off in range(0, len(data), SLOT):
            k = data[off + 24 : off + 40]
            if data[off : off + 4] == b"KVB1" and k in want:
                out[k] = (p, off)
    return out


def _flip(path: Path, offset: int, bit: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        b = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([b[0] ^ (1 << bit)]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


# The header's created-at µs (its last 8 bytes, DESIGN §4): the one field no read checks.
CREATED_AT = range(56, 64)

# header fields (DESIGN §4) and payload positions to corrupt
FLIPS = {
    "magic": 1,
    "version": 4,
    "fingerprint": 12,
    "key": 30,
    "length": 41,
    "checksum": 50,
    "payload_first": 64,
    "payload_mid": 64 + 1000,
    "payload_last": 64 + 2047,
}


@pytest.mark.parametrize("where", sorted(FLIPS))
def test_bit_flip_is_a_counted_quarantined_miss(open_tier, tmp_path: Path, where: str) -> None:
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 12)
    t.put(ns, keys, rows(ns, keys))
    t.close()
    victim = keys[5]
    path, off = _locate(tmp_path / "ssd", [victim])[victim]
    _flip(path, off + FLIPS[where], random.Random(where).randrange(8))
    t = open_tier()
    t.register(ns)
    assert t.contains(ns, keys) == 12  # the index alone cannot know
    dst = bytearray(12 * ns.block_bytes)
    assert t.get_into(ns, keys, dst) == 5  # stops at the corrupt block
    assert bytes(dst[: 5 * ns.block_bytes]) == rows(ns, keys[:5])
    cnt = t.stats().counters
    assert cnt["corrupt_blocks_total"] == 1 and cnt["quarantined_slots"] == 1
    assert t.contains(ns, keys) == 5 and victim not in t.iter_keys(ns)
    assert verify_all(t, ns) == 11
    # the quarantined slot is not handed out again: a re-put lands elsewhere
    t.put(ns, [victim], payload_for(ns, victim))
    assert t.get_into(ns, keys, dst) == 12 and bytes(dst) == rows(ns, keys)
    assert t.stats().counters["quarantined_slots"] == 1
    t.check_integrity()


def test_many_random_flips_never_return_wrong_bytes(open_tier, tmp_path: Path) -> None:
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 60)
    t.put(ns, keys, rows(ns, keys))
    t.close()
    rng = random.Random(7)
    where = _locate(tmp_path / "ssd", keys)
    hit = rng.sample(keys, 15)
    harmless = set()
    for k in hit:
        path, off = where[k]
        pos = rng.randrange(64 + ns.block_bytes)
        _flip(path, off + pos, rng.randrange(8))
        if pos in CREATED_AT:
            harmless.add(k)
    t = open_tier()
    t.register(ns)
    dst = bytearray(ns.block_bytes)
    good = set()
    for k in keys:
        if t.get_into(ns, [k], dst):
            assert bytes(dst) == payload_for(ns, k)
            good.add(k)
    # Every flip outside the created-at stamp (which no reader checks) makes a miss;
    # never wrong bytes.
    assert good == set(keys) - set(hit) | harmless
    assert t.stats().counters["corrupt_blocks_total"] == len(hit) - len(harmless)
    t.check_integrity()


def test_flip_while_open(open_tier, tmp_path: Path) -> None:
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 4)
    t.put(ns, keys, rows(ns, keys))
    path, off = _locate(tmp_path / "ssd", [keys[0]])[keys[0]]
    _flip(path, off + 64 + 7, 3)
    assert t.get_into(ns, keys, bytearray(4 * ns.block_bytes)) == 0
    assert t.stats().counters["corrupt_blocks_total"] == 1
    assert t.contains(ns, keys[1:]) == 3
    t.check_integrity()
