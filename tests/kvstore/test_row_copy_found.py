"""Reads by key (``RowCopier.copy_found``, kvstore/row_copy.py and kvstore/_rowcopy.c):
the look-up finds exactly the leading keys held for the namespace, their rows come from
the slot the pool layout puts them at, and what passes is exactly what was copied
intact; the native look-up and the Python fallback agree on every input."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.dram_pool import slot_offset
from kvstore.errors import InvalidArgument
from kvstore.row_copy import KeyIndex, RowCopier

from .test_row_copy import COPIER_IDS, copiers

FP, OTHER = b"F" * 16, b"O" * 16


@st.composite
def layouts(draw: st.DrawFn) -> dict:
    """A pool of chunks holding slots of one row size (with a gap at each chunk's end
    when the rows do not fill it), an index over some of its slots (some held for another
    namespace), a read of keys (held, foreign, absent) and optionally one byte flipped in
    one stored row after its checksum was made."""
    row_bytes = draw(st.sampled_from([1, 7, 64, 241, 4096, 40_000]))
    per_chunk = draw(st.integers(1, 4))
    chunk_bytes = per_chunk * row_bytes + draw(st.sampled_from([0, 5]))
    chunks = draw(st.integers(1, 4))
    n_slots = chunks * per_chunk
    seed = draw(st.integers(0, 2**32 - 1))
    pool = bytearray(
        np.random.default_rng(seed).integers(0, 256, chunks * chunk_bytes, dtype=np.uint8)
    )
    slots = draw(st.permutations(range(n_slots)))
    n_keys = draw(st.integers(0, n_slots))
    foreign = draw(st.sets(st.integers(0, max(0, n_keys - 1)), max_size=2))
    index = KeyIndex({}, {}, {}, per_chunk, chunk_bytes)
    keys = [i.to_bytes(16, "little") for i in range(n_keys)]
    for i, key in enumerate(keys):
        off = slot_offset(slots[i], per_chunk, chunk_bytes, row_bytes)
        index.owner[key] = OTHER if i in foreign else FP
        index.slots[key] = slots[i]
        index.sums[key] = xxhash.xxh3_64_intdigest(pool[off : off + row_bytes])
    read = draw(st.lists(st.sampled_from([*keys, b"absent"]), max_size=12) if keys else st.just([]))
    flip = draw(st.none() | st.integers(0, len(read) - 1)) if read else None
    at = draw(st.integers(0, row_bytes - 1))
    return dict(pool=pool, index=index, read=read, bb=row_bytes, flip=flip, at=at)


@settings(max_examples=120, deadline=None)
@given(layouts(), st.sampled_from([64, 4096, 65536]))
def test_found_is_the_held_prefix_and_got_the_intact_copies(case: dict, chunk: int) -> None:
    pool, index, read, bb = case["pool"], case["index"], case["read"], case["bb"]
    flipped_key = None
    if case["flip"] is not None and read[case["flip"]] in index.slots:
        flipped_key = read[case["flip"]]
        off = slot_offset(index.slots[flipped_key], index.slots_per_chunk, index.chunk_bytes, bb)
        pool[off + case["at"]] ^= 0x04  # after its checksum: every copy of it must fail
    found = 0
    while found < len(read) and index.owner.get(read[found]) == FP:
        found += 1
    got = read[:found].index(flipped_key) if flipped_key in read[:found] else found
    for copier in copiers(chunk):
        seen: list[int] = []
        dst = bytearray(len(read) * bb + 3)
        assert copier.copy_found(
            memoryview(pool), index, read, FP, memoryview(dst), bb, seen.append
        ) == (found, got)
        assert seen == [found], "during is called once, with found"
        for r in range(got):
            off = slot_offset(index.slots[read[r]], index.slots_per_chunk, index.chunk_bytes, bb)
            assert dst[r * bb : (r + 1) * bb] == pool[off : off + bb]
        assert dst[len(read) * bb :] == b"\0\0\0", "nothing written past the rows"
        copier.close()


def _one_row_pool(bb: int = 64) -> tuple[bytearray, KeyIndex, bytes]:
    pool = bytearray(range(256)) * (2 * bb // 256 + 1)
    key = b"k" * 16
    index = KeyIndex(
        {key: FP}, {key: 1}, {key: xxhash.xxh3_64_intdigest(pool[bb : 2 * bb])}, 2, 2 * bb
    )
    return pool[: 2 * bb], index, key


@pytest.mark.parametrize("copier", copiers(), ids=COPIER_IDS)
def test_a_slot_outside_the_pool_is_refused_before_any_copy(copier: RowCopier) -> None:
    pool, index, key = _one_row_pool()
    dst = bytearray(64)
    index.slots[key] = 2  # chunk 1: past the pool's one chunk
    with pytest.raises(InvalidArgument):
        copier.copy_found(memoryview(pool), index, [key], FP, memoryview(dst), 64)
    index.slots[key] = -1
    with pytest.raises(InvalidArgument):
        copier.copy_found(memoryview(pool), index, [key], FP, memoryview(dst), 64)
    assert dst == bytearray(64)
    copier.close()


@pytest.mark.parametrize("copier", copiers(), ids=COPIER_IDS)
def test_an_index_that_disagrees_with_itself_raises(copier: RowCopier) -> None:
    pool, index, key = _one_row_pool()
    del index.sums[key]  # owned but without a checksum: never a silent unchecked read
    with pytest.raises(KeyError):
        copier.copy_found(memoryview(pool), index, [key], FP, memoryview(bytearray(64)), 64)
    copier.close()


@pytest.mark.parametrize("copier", copiers(), ids=COPIER_IDS)
def test_a_short_or_read_only_destination_is_refused(copier: RowCopier) -> None:
    pool, index, key = _one_row_pool()
    with pytest.raises(InvalidArgument):
        copier.copy_found(memoryview(pool), index, [key], FP, memoryview(bytearray(63)), 64)
    with pytest.raises(InvalidArgument):
        copier.copy_found(memoryview(pool), index, [key], FP, memoryview(bytes(64)), 64)
    # A miss needs no room: nothing is copied.
    assert copier.copy_found(
        memoryview(pool), index, [b"absent"], FP, memoryview(bytearray(0)), 64
    ) == (0, 0)
    copier.close()


@pytest.mark.parametrize("copier", copiers(), ids=COPIER_IDS)
def test_a_large_read_by_key_is_shared_and_during_errors_come_after(copier: RowCopier) -> None:
    bb, n = 64 << 10, 16  # 1 MiB: offered to the helper by the two-thread copiers
    rng = np.random.default_rng(17)
    pool = bytearray(rng.integers(0, 256, 2 * n * bb, dtype=np.uint8))
    keys = [i.to_bytes(16, "big") for i in range(n)]
    slots = rng.permutation(2 * n)[:n].tolist()
    index = KeyIndex(dict.fromkeys(keys, FP), dict(zip(keys, slots, strict=True)), {}, 8, 8 * bb)
    for k, s in zip(keys, slots, strict=True):
        index.sums[k] = xxhash.xxh3_64_intdigest(pool[s * bb : (s + 1) * bb])
    dst = bytearray(n * bb)
    assert copier.copy_found(memoryview(pool), index, keys, FP, memoryview(dst), bb) == (n, n)
    assert all(
        dst[r * bb : (r + 1) * bb] == pool[s * bb : (s + 1) * bb] for r, s in enumerate(slots)
    )

    def fail(found: int) -> None:
        raise RuntimeError(f"bookkeeping failed after {found}")

    with pytest.raises(RuntimeError, match="after 16"):
        copier.copy_found(
            memoryview(pool), index, keys, FP, memoryview(bytearray(n * bb)), bb, fail
        )
    # The copier is free again (a held lock or helper would hang this call).
    assert copier.copy_found(memoryview(pool), index, keys, FP, memoryview(dst), bb) == (n, n)
    copier.close()
